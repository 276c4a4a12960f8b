"""Threads: how many a call may use, and the pool that runs a call's parts on them.

A convolution's plan splits its output into parts (``csa`` decides how many are worth it); the
calling thread and up to ``get_num_threads() - 1`` pool workers each claim parts until none is
left (each its own run of them first), every part running the compiled loop nest on its own
scratch. The pool is compiled code (``cso.pool``): from the moment a call posts its parts until
they are all done, no thread involved needs the GIL. It is shared by all calls: while one call
owns it, a call from another Python thread runs its parts itself, so nothing waits on a worker
that never comes.
``cso.jobs`` runs calls' parts on it (``run_parts``), one or a list of them at a time.
Workers are daemon threads living in compiled code (no threading layer of numba's), and
after ``os.fork()`` the child starts with an empty pool (``microkernels.once`` makes the fork
wait for a pool start under way).
"""
import contextlib
import numbers
import os
import threading

import numpy as np

from microkernels.once import fork_safe_lock

from .cpus import available_cpus
from .pool import SPIN, STATE_WORDS, compiled_pool

ENV_VAR = "CSO_NUM_THREADS"
SPIN_ENV_VAR = "CSO_SPIN_US"
# how long a worker spins for the next job before it sleeps: a core left idle comes back
# slowly (on 2 threads, small models ran 1.2-1.7x their back-to-back time after a 50 ms pause
# with 5 ms of spin, 1.0-1.16x with 60 ms: csa/TUNING.md, "Threads and the pool"), so calls
# some tens of ms apart (a service's requests) find their workers awake, as onnxruntime's
# (tens of ms) and Intel's OpenMP (200 ms) do; after it an idle process burns no CPU
DEFAULT_SPIN_SECONDS = 0.1
MAX_SPIN_SECONDS = 60.0

_threads = None      # set by set_num_threads or on first use; None: not decided yet
_spin_ns = None      # set by set_spin or on first use
_pool = None   # (state words, their address, workers started), created on first use
_start_lock = fork_safe_lock()   # guards _pool
_asleep_blocks = 0   # workers_asleep blocks open, in all threads (guarded by _spin_lock)
_spin_lock = fork_safe_lock()


def _from_env():
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return available_cpus()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_VAR} must be a positive integer, got {text!r}")
    return value


def get_num_threads():
    """Threads a convolution may use: set by ``set_num_threads``, else ``CSO_NUM_THREADS``,
    else the CPUs this process may run on."""
    global _threads
    if _threads is None:
        _threads = _from_env()
    return _threads


def set_num_threads(n):
    """Let convolutions use up to ``n`` threads (the calling one included) from now on, in
    every thread of this process."""
    global _threads
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"set_num_threads: n must be at least 1, got {n}")
    _threads = n


def get_spin():
    """Seconds an idle pool worker spins for the next job before it sleeps (and a caller, at
    most ``cso.pool.CALLER_SPIN_NS`` of them, for its job's end before it yields its CPU): set
    by ``set_spin``, else ``CSO_SPIN_US`` (microseconds), else DEFAULT_SPIN_SECONDS."""
    return spin_ns() / 1e9


def spin_ns():
    """``get_spin`` in nanoseconds, as the compiled pool takes it."""
    global _spin_ns
    if _spin_ns is None:
        text = os.environ.get(SPIN_ENV_VAR, "").strip()
        if not text:
            _spin_ns = round(DEFAULT_SPIN_SECONDS * 1e9)
        else:
            try:
                micros = float(text)
            except ValueError:
                micros = -1.0
            if not 0 <= micros <= MAX_SPIN_SECONDS * 1e6:
                raise ValueError(f"{SPIN_ENV_VAR} must be microseconds from 0 to "
                                 f"{MAX_SPIN_SECONDS * 1e6:.0f}, got {text!r}")
            _spin_ns = round(micros * 1e3)
    return _spin_ns


def set_spin(seconds):
    """Let idle pool workers spin ``seconds`` for the next job before they sleep, in every
    thread of this process from now on: 0 sleeps at once (no CPU used between calls; each
    call then wakes its workers, tens to hundreds of microseconds), longer keeps calls that
    come further apart fast at the price of a core busy that long after each."""
    global _spin_ns
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"set_spin: seconds must be a number, got {type(seconds).__name__}")
    if not 0 <= seconds <= MAX_SPIN_SECONDS:
        raise ValueError(f"set_spin: seconds must be from 0 to {MAX_SPIN_SECONDS}, got "
                         f"{seconds}")
    with _spin_lock:
        _spin_ns = round(float(seconds) * 1e9)
        _set_pool_spin()


@contextlib.contextmanager
def workers_asleep():
    """A block during which idle pool workers sleep at once instead of spinning: for work
    that runs threads of its own on the cores (NumPy's BLAS), which a spinning worker would
    slow down (ConvNeXt on 2 threads: 185 ms with the workers spinning beside its MatMuls, 99
    without). Blocks may nest and overlap from several threads: the spin window is back when
    the last one ends."""
    global _asleep_blocks
    with _spin_lock:
        _asleep_blocks += 1
        _set_pool_spin()
    try:
        yield
    finally:
        with _spin_lock:
            _asleep_blocks -= 1
            _set_pool_spin()


def _set_pool_spin():
    """The pool's spin word (the workers read it each time they go idle, and every 32 polls:
    asleep within microseconds of a 0): 0 inside a ``workers_asleep`` block, else the window."""
    ready = _pool
    if ready is not None:
        ready[0][SPIN] = 0 if _asleep_blocks else spin_ns()


def pool_address(helpers):
    """The address of the pool's state words, with at least ``helpers`` workers started."""
    global _pool
    ready = _pool   # the usual case: no lock (the tuple is never changed, its list only grows)
    if ready is not None and len(ready[2]) >= helpers:
        return ready[1]
    worker_entry = compiled_pool().worker   # compiled outside the lock (see fork_safe_lock)
    with _start_lock:
        if _pool is None:
            state = np.zeros(STATE_WORDS, np.int64)
            _pool = (state, state.ctypes.data, [])
            with _spin_lock:
                _set_pool_spin()
        _, address, started = _pool
        while len(started) < helpers:
            rank = len(started) + 1
            # the worker's whole life is one compiled call, which holds no GIL
            worker = threading.Thread(target=worker_entry, daemon=True, args=(address, rank),
                                      name=f"cso-worker-{rank}")
            worker.start()
            started.append(worker)
    return address


def _forget_pool():
    """In a forked child: the parent's workers do not exist here."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
