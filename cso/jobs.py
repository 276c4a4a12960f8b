"""Compiled jobs on arrays: run them on cso's threads, record them, replay them without Python.

A *job* is a compiled part function ``void function(int64 *args, int64 part)`` called for
``part`` = 0 .. ``parts`` - 1 with one shared vector of int64 arguments (the arrays'
addresses, ``data_address``, and their geometry). Every ``Conv2d`` call runs as jobs, and so
can an integration's own compiled kernels (``cso.onnx``'s pools, copies and transposes):
``run_parts`` runs one job on the calling thread and the pool's workers.

Once the shapes and the thread count are fixed, a sequence of calls runs the same jobs on the
same arguments, call after call, provided its arrays are the same ones. A ``Recording``
collects the jobs its thread runs (with what they point to) and ``replay`` runs them again in
one compiled call, with no Python between them:

    recording = Recording()
    with recording:             # this thread's jobs are recorded (and run) as usual
        conv(x, out=y)          # x, y: arrays that stay alive and in place
        other(y, out=z)
    recording.replay(threads)   # the same jobs again, on whatever x now holds

While a recording is active, convolutions take their scratch workspaces from it
(``Recording.workspace``): its jobs run one after the other, so they share them. Timing
trials that a recorded call may start (calibration, autotuning) are kept out with
``unrecorded``.

For writing jobs of one's own: ``data_address`` (an array's address, for the arguments),
``aligned_empty`` (arrays that start on a ``LINE``-byte cache line, which kernels read with
vector loads, or on a ``PAGE``), ``part_stride`` (how far apart parts' shares of a scratch
buffer lie, so that parts on two cores do not slow each other), ``compiled_once`` (build a
part function once per process, safely beside numba's compiler lock and ``os.fork``), and
``ForeignFunction`` (keep a part function's object code, compiled by numba or other means, in
the persistent cache, and load it from there). Work that runs threads of its own (NumPy's
BLAS) goes in a ``with workers_asleep():`` block, so that the pool's idle workers do not spin
on the cores it needs.
"""
import ctypes
import functools
import threading

import numpy as np

from microkernels.aligned import LINE, PAGE, aligned_empty, data_address, part_stride
from microkernels.jit import ForeignFunction
from microkernels.once import compiled_once

from .pool import MAX_PARTS, compiled_pool
from .threads import pool_address, spin_ns, workers_asleep

__all__ = ["LINE", "PAGE", "ForeignFunction", "Recording", "aligned_empty", "compiled_once",
           "data_address", "active_recording", "new_workspace", "part_stride", "run_jobs",
           "run_parts", "unrecorded", "workers_asleep", "workspace"]


class _Active(threading.local):
    recording = None   # this thread's active Recording (a class default: no getattr miss)


_active = _Active()


def active_recording():
    """The ``Recording`` this thread's jobs go to, or None."""
    return _active.recording


def _set_active(recording):
    _active.recording = recording


class Recording:
    """The jobs one thread runs while the recording is active (``start`` .. ``stop``, or a
    ``with`` block), kept with what they read and write besides the caller's arrays, and the
    workspaces they share; ``replay`` runs them again in one compiled call.

    A job reads and writes its arrays by address: the caller keeps every array it gave a
    recorded call alive and in place for as long as it replays them, and records only calls
    that make no temporary of their own (a ``Conv2d`` called on a 4-D C-contiguous ``x`` with
    ``out=`` a C-contiguous array of the output's shape and the filters' dtype, as
    ``Conv2d.bound`` runs them; a kernel on arrays the caller holds). Replays of one recording
    run one at a time (its jobs share their workspaces). Recordings do not nest: one per
    thread at a time."""

    def __init__(self):
        self._jobs = []       # (function, args, parts) of each job in turn
        self._keep = []       # what each job points to besides the caller's arrays
        self._scratch = {}    # (kind, dtype) -> the largest workspace of that kind made so far
        self._compiled = None   # the jobs as run_jobs takes them, made on the first replay

    def start(self):
        """Record this thread's jobs from now on (one recording active per thread)."""
        if active_recording() is not None:
            raise RuntimeError("a cso.jobs.Recording is already active on this thread: "
                               "recordings do not nest (a cso.onnx model records its own "
                               "first run on each input shape)")
        _set_active(self)

    def stop(self):
        """Stop recording this thread's jobs."""
        if active_recording() is self:
            _set_active(None)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def __len__(self):
        return len(self._jobs)

    def add(self, function, args, parts, keep=()):
        """Append a job (``run_parts`` calls this while the recording is active)."""
        self._jobs.append((function, args, parts))
        self._keep.append(keep)
        self._compiled = None

    def truncate(self, count):
        """Keep the first ``count`` jobs only (the later ones will not be replayed)."""
        del self._jobs[count:], self._keep[count:]
        self._compiled = None

    @property
    def nbytes(self):
        """Bytes of the workspaces its jobs share."""
        return sum(space.nbytes for space in self._scratch.values())

    def workspace(self, kind, elements, dtype):
        """A workspace of at least ``elements`` for a job's scratch of ``kind``: the one an
        earlier job had when it is large enough, as the jobs run one at a time (a workspace
        per convolution would hold tens of MiB)."""
        key = (kind, np.dtype(dtype))
        found = self._scratch.get(key)
        if found is None or found.size < elements:
            found = self._scratch[key] = new_workspace(elements, dtype)
        return found

    def replay(self, threads):
        """Run the recorded jobs again, in order, each on up to ``threads`` threads."""
        if self._compiled is None:
            self._compiled = np.array(self._jobs, np.int64).reshape(-1)
        if self._compiled.size:
            run_jobs(self._compiled, threads)


def unrecorded(function):
    """``function`` with this thread's recording off while it runs: timing trials
    (autotuning, calibration) that a recorded call may run are not its jobs."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        recording = active_recording()
        _set_active(None)
        try:
            return function(*args, **kwargs)
        finally:
            _set_active(recording)
    return run


def new_workspace(elements, dtype):
    """A new scratch buffer of ``elements`` for a job (a module attribute, so that the
    guard-page tests can place workspaces against inaccessible pages), on a page: a job's
    parts each have rows of whole pages (``Prepared``, ``part_stride``), so that two threads'
    rows share no page (from NumPy's 16-byte start, a row's last line was the next one's
    first)."""
    return aligned_empty(elements, dtype, PAGE)


# a thread keeps a workspace of each kind, the largest its jobs have needed, up to this size:
# one made and dropped each call could page-fault every page it touched, call after call (a
# 1x1 with 392 KiB of workspace, alone in a process: 164 faults a call, 2.7x its time)
REUSED_WORKSPACE_BYTES = 64 << 20
KEPT_WORKSPACE_MIN_BYTES = 4096   # the smallest kept (a page): small needs grow it little


class _Kept(threading.local):
    def __init__(self):
        # kind -> (this thread's workspace of that kind, its address); a new dict each time
        # one grows, so that vectors made with the old one's address (``kept_workspaces``)
        # know to be made again
        self.spaces = {}


_kept = _Kept()


def kept_workspaces():
    """This thread's kept workspaces (``workspace``), kind -> (buffer, address): a dict of its
    own, replaced (never changed) when one of them grows, so that an argument vector holding
    their addresses is valid while it was made with the dict ``kept_workspaces()`` returns
    (and holds the buffers it points to until it is made again)."""
    return _kept.spaces


def workspace(kind, elements, dtype):
    """(a scratch buffer of at least ``elements``, its address) for a job of this thread
    outside a recording: up to ``REUSED_WORKSPACE_BYTES``, this thread's buffer of ``kind``
    (a thread runs one job at a time), made on first use and again, twice as large or as
    large as needed, when a job needs more; beyond it a new one (``new_workspace``), not
    held."""
    size = elements * dtype.itemsize
    if size <= REUSED_WORKSPACE_BYTES:
        found = _kept.spaces.get(kind)
        if found is not None and found[0].nbytes >= size:
            return found
        grown = max(size, KEPT_WORKSPACE_MIN_BYTES, 2 * found[0].nbytes if found else 0)
        space = new_workspace(min(grown, REUSED_WORKSPACE_BYTES), np.dtype(np.uint8))
        _kept.spaces = dict(_kept.spaces)
        found = _kept.spaces[kind] = (space, data_address(space))
        return found
    space = new_workspace(elements, dtype)
    return space, data_address(space)


def run_jobs(jobs, threads):
    """Run the jobs of ``jobs``, an int64 array of (function, args, parts) triples as
    ``run_parts`` takes them, one after the other, each on up to ``threads`` threads, in one
    compiled call: no Python between them."""
    if jobs.dtype != np.int64 or jobs.ndim != 1 or jobs.size % 3 or not jobs.flags.c_contiguous:
        raise ValueError(f"run_jobs: jobs must be a contiguous int64 vector of triples, got "
                         f"{jobs.dtype} of shape {jobs.shape}")
    parts = jobs[2::3]
    if parts.size and not (parts.min() >= 1 and parts.max() <= MAX_PARTS):
        raise ValueError(f"run_jobs: from 1 to {MAX_PARTS} parts per job, got {parts}")
    compiled_pool().run_jobs(pool_address(max(0, threads - 1)), jobs.ctypes.data,
                             jobs.size // 3, max(1, threads), spin_ns())


def run_parts(function, args, parts, threads, keep=()):
    """Call the compiled ``void function(int64 *args, int64 part)`` (an address) for ``part`` =
    0 .. ``parts`` - 1, ``args`` (the address of their shared int64 arguments, kept alive by
    the caller) the same for every call, on this thread and up to min(parts, threads) - 1 pool
    workers; return when every call has returned. ``keep``: what the call reads or writes that
    its caller drops after it (its ``args`` array, scratch), which a recording keeps."""
    if not type(function) is type(args) is type(parts) is int:   # not bool, not NumPy's
        raise TypeError(f"run_parts: function, args and parts must be ints (addresses and a "
                        f"count), got {type(function).__name__}, {type(args).__name__}, "
                        f"{type(parts).__name__}")
    if not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"run_parts: from 1 to {MAX_PARTS} parts, got {parts}")
    helpers = max(0, min(parts, threads) - 1)
    recording = active_recording()
    if recording is not None:
        recording.add(function, args, parts, keep)
    elif parts == 1:   # on this thread alone: called here, not handed to the pool (2 us less)
        call = _one_part.get(function)
        if call is None:
            call = _one_part.setdefault(function, _PART_FUNCTION(function))
        call(args, 0)
        return
    compiled_pool().run(pool_address(helpers), function, args, parts, helpers, spin_ns())


_PART_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)   # (releases the GIL)
_one_part = {}   # a part function's address -> its ctypes function (compiled code is never freed)
