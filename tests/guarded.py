"""Arrays flush against inaccessible pages, and running a check in a child process: the tools
of the guard-page tests. A kernel that reads or writes one element past either end of such
an array faults at once, instead of silently using a neighbour's memory."""
import ctypes
import mmap
import os
import signal
import sys
import traceback

import numpy as np

PAGE = mmap.PAGESIZE
PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _protect(address, size):
    if _libc.mprotect(address, size, PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")


def guarded_empty(shape, dtype, at="end"):
    """An uninitialised C-contiguous array whose first byte (``at="start"``) or last byte
    (``at="end"``) touches a PROT_NONE page; both sides of its pages are guarded."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    pages = max(1, -(-nbytes // PAGE))
    region = mmap.mmap(-1, (pages + 2) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    _protect(base, PAGE)
    _protect(base + (pages + 1) * PAGE, PAGE)
    offset = PAGE + (pages * PAGE - nbytes if at == "end" else 0)
    return np.frombuffer(region, dtype, count, offset).reshape(shape)


def guarded_copy(array, at="end"):
    """``array``'s values in a ``guarded_empty`` array."""
    copy = guarded_empty(array.shape, array.dtype, at)
    copy[...] = array
    return copy


def in_child(check):
    """Run ``check()`` in a forked child: None if it returned, else what went wrong (a signal
    such as SIGSEGV for a fault, or the exception's traceback)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report and leave without running the parent's cleanup
        os.close(read)
        code = 0
        try:
            check()
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return message or (None if os.WEXITSTATUS(status) == 0 else f"exit {os.WEXITSTATUS(status)}")


def calls_stay_inside(calls, x, at):
    """None if each of ``calls`` ((out shape, run(x, out))) run on ``x`` and an output in
    float32 arrays flush at their ``at`` against guard pages (in a child process) gives what
    it gives on ordinary arrays; else what went wrong. The calls run here first, so that
    their kernels are compiled and the child only runs them."""
    expected = [run(x, np.empty(out_shape, np.float32)) for out_shape, run in calls]

    def guarded_runs():
        for (out_shape, run), want in zip(calls, expected):
            out = guarded_empty(out_shape, np.float32, at)
            run(guarded_copy(x, at), out)
            np.testing.assert_array_equal(out, want)
    return in_child(guarded_runs)
