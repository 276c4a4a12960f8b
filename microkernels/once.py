"""First use from many threads, and fork: one compile per key per process, and no lock a fork
leaves held.

LLVM's global state is not thread-safe, and code whose address went into a compiled loop nest
must never be freed. So everything that touches LLVM (llvmlite's parse, optimise, MCJIT and
assembly) runs under one re-entrant lock, numba's own compiler lock (``COMPILE_LOCK``: the
user's own numba code compiles under it too, so the two never touch LLVM at once), and
``compiled_once`` memoises a compiling function: the first caller of a key compiles while the
others wait for its result, which is kept for the life of the process.

``os.fork()`` from any thread: before the fork the forking thread takes the compile lock (a
compilation under way in another thread finishes first) and then every lock made by
``fork_safe_lock``, in that order, and releases them after it, in the parent and in the child.
So a child never inherits a lock held by a thread that does not exist there, nor LLVM or a
cache table in the middle of an update.
"""
import functools
import os
import threading

from numba.core.compiler_lock import global_compiler_lock as COMPILE_LOCK

_fork_locks = []   # every fork_safe_lock, in the order they are taken before a fork


def fork_safe_lock():
    """A ``threading.Lock`` that ``os.fork()`` takes before and releases after (see above).
    Hold it briefly and never while taking the compile lock or another such lock."""
    lock = threading.Lock()
    _fork_locks.append(lock)
    return lock


def compiled_once(function):
    """Memoise ``function`` (positional, hashable arguments): the first call with a key runs it
    under the compile lock, concurrent calls with that key wait for its result, and the result
    is kept for the life of the process (compiled code is never freed: loop nests hold its
    address). ``.compiled()`` counts the keys compiled so far."""
    results = {}

    @functools.wraps(function)
    def once(*args):
        found = results.get(args, _MISSING)
        if found is _MISSING:
            with COMPILE_LOCK:
                found = results.get(args, _MISSING)
                if found is _MISSING:
                    found = results[args] = function(*args)
        return found

    once.compiled = lambda: len(results)
    return once


_MISSING = object()


def _before_fork():
    COMPILE_LOCK.acquire()
    for lock in _fork_locks:
        lock.acquire()


def _after_fork():
    for lock in reversed(_fork_locks):
        lock.release()
    COMPILE_LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                        after_in_child=_after_fork)
