"""Threads: how many a call may use, and the pool that runs a call's parts on them.

A convolution's plan splits its output into parts (``csa`` decides how many are worth it); the
calling thread and up to ``get_num_threads() - 1`` pool workers each claim parts until none is
left, every part running the compiled loop nest (which releases the GIL) on its own scratch.
The pool is shared by all calls: calls from several Python threads at once use at most their
own threads plus the pool's workers, and a caller whose parts find every worker busy runs them
itself, so nothing waits on a worker that never comes. Workers are plain daemon threads: numba's
threading layer is not used, and after ``os.fork()`` the child starts with an empty pool.
"""
import os
import queue
import threading

import numpy as np

from microkernels.spin import spin_wait

ENV_VAR = "CSO_NUM_THREADS"
# polls (about 25 ns each) a thread spins for the next job or the end of its call's job before
# blocking: 0.5 ms, the gap between the layers of a model, so that back-to-back calls find
# their workers awake (waking a blocked thread here costs 50-200 us)
SPIN_ROUNDS = 20_000

_threads = None      # set by set_num_threads or on first use; None: not decided yet
_pool = None         # (job queue, workers started), created on first parallel call
_posted = np.zeros(1, np.int64)   # bumped per job posted: a hint spinning workers watch
_start_lock = threading.Lock()     # guards _pool


def available_cpus():
    """CPUs this process may run on (its affinity mask, where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


class _Job:
    """Parts of one call, claimed one at a time by whichever thread comes first."""

    def __init__(self, parts, run_part):
        self.parts, self.run_part = parts, run_part
        self.next = 0
        self.unfinished = len(parts)
        self.finished = np.zeros(1, np.int64)   # parts done: what the spinning caller watches
        self.error = None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def work(self):
        while True:
            with self.lock:
                if self.next == len(self.parts):
                    return
                part = self.parts[self.next]
                self.next += 1
            error = None
            try:
                self.run_part(part)
            except BaseException as err:   # re-raised in the calling thread
                error = err
            with self.lock:
                self.error = self.error or error
                self.unfinished -= 1
                self.finished[0] += 1
                if not self.unfinished:
                    self.done.set()

    def wait(self):
        """Until every part has run: spinning a while, then blocking."""
        while self.unfinished:
            seen = self.finished[0]
            if self.unfinished and not spin_wait(self.finished, seen, SPIN_ROUNDS):
                self.done.wait()


def _worker(jobs):
    while True:
        seen = _posted[0]
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            if spin_wait(_posted, seen, SPIN_ROUNDS):
                continue
            job = jobs.get()
        job.work()


def _workers(wanted):
    """The pool's job queue, with at least ``wanted`` workers started."""
    global _pool
    if _pool is None:
        spin_wait(_posted, -1, 1)   # compiled here, not in the first worker's first wait
        _pool = (queue.SimpleQueue(), [])
    jobs, started = _pool
    while len(started) < wanted:
        worker = threading.Thread(target=_worker, args=(jobs,), daemon=True,
                                  name=f"cso-worker-{len(started)}")
        worker.start()
        started.append(worker)
    return jobs


def run_parts(parts, run_part, threads):
    """``run_part(part)`` for every part, on this thread and up to min(len(parts), threads) - 1
    workers; returns when all have run, raising the first error any of them raised."""
    helpers = min(len(parts), threads) - 1
    if helpers < 1:
        for part in parts:
            run_part(part)
        return
    job = _Job(parts, run_part)
    with _start_lock:
        jobs = _workers(helpers)
    for _ in range(helpers):
        jobs.put(job)
    _posted[0] += 1   # after the puts: a worker that sees it finds the job queued
    job.work()
    job.wait()
    if job.error is not None:
        raise job.error


def _forget_pool():
    """In a forked child: the parent's workers do not exist here, and its locks may be held."""
    global _pool, _start_lock
    _pool, _start_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
