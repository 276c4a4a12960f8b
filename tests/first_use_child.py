"""A fresh process's first calls, made from many Python threads at once (run by
``test_first_use.py`` in child processes, so a crash kills the child, not the test run).

    python tests/first_use_child.py --threads 6 [--cso-threads 2] [--seconds 0] [--forks 0]
    python tests/first_use_child.py --fork-while compile|call [--cso-threads 2]

Each thread owns one layer (the first ``--threads`` of ``LAYERS``: 3x3, depthwise, 1x1, strided
5x5, grouped, float64, dilated, filters in vectors), waits at a barrier, then makes its first
call at the same moment as the others, then calls again until ``--seconds`` have passed; every
result is checked bit for bit against a result computed on one thread after the run (and that
one against the NumPy reference). With ``--seconds``, threads also change
``cso.set_num_threads`` now and then and fork up to ``--forks`` children, each computing a layer
with the object it inherited and with a new one.

``--fork-while compile``: the main thread forks while another thread makes a first call that
compiles (``COMPILED_WHILE_FORKING``: not among the layers a warm cache holds); ``--fork-while
call``: while another thread calls a layer over and over (on ``--cso-threads`` threads: the pool
is busy). The children compute in their turn.

Prints ``ok <calls> <forks> <forks made while another thread held the compile lock>``, the
compilation cache's events (a JSON line) and exits 0, or
prints what went wrong and exits 1; a hang dies by SIGALRM.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import cso
from microkernels import cache
from microkernels.once import COMPILE_LOCK
from reference import assert_conv_close   # a script: its directory comes first on sys.path

# (input shape, weight shape, dtype, Conv2d keyword arguments)
LAYERS = [
    ((1, 32, 20, 22), (40, 32, 3, 3), np.float32, dict(padding=1)),
    ((2, 24, 17, 15), (48, 1, 3, 3), np.float32, dict(padding=1, groups=24)),
    ((3, 48, 9, 11), (36, 48, 1, 1), np.float32, dict()),
    ((1, 8, 23, 21), (20, 8, 5, 5), np.float32, dict(stride=2, padding=2)),
    ((2, 16, 12, 13), (24, 4, 3, 3), np.float32, dict(padding=1, groups=4)),
    ((1, 16, 14, 14), (24, 16, 3, 3), np.float64, dict(padding=1)),
    ((1, 12, 16, 16), (16, 12, 3, 3), np.float32, dict(padding=2, dilation=2)),
    ((1, 64, 7, 9), (96, 64, 3, 3), np.float32,
     dict(padding=1, plan_overrides={"vectors_along": "filters"})),
]
# what --fork-while compile's caller compiles while the others are in the cache (fork
# children compute layer 0)
COMPILED_WHILE_FORKING = ((1, 8, 9, 10), (8, 1, 3, 3), np.float64, dict(padding=1, groups=8))


def layer_data(index, layer=None):
    rng = np.random.default_rng(index)
    x_shape, w_shape, dtype, kwargs = layer or LAYERS[index % len(LAYERS)]
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    return x, w, b, kwargs


def geometry(kwargs):
    pad, stride, dil = (kwargs.get(k, d) for k, d in (("padding", 0), ("stride", 1),
                                                       ("dilation", 1)))
    return dict(stride=(stride,) * 2, padding=(pad,) * 4, dilation=(dil,) * 2,
                groups=kwargs.get("groups", 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--cso-threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--forks", type=int, default=0)
    parser.add_argument("--fork-while", choices=("compile", "call"))
    opts = parser.parse_args()
    if opts.fork_while:
        opts.threads = 2
    signal.alarm(int(120 + 2 * opts.seconds))   # a hang dies by SIGALRM
    cso.set_num_threads(opts.cso_threads)
    data = [layer_data(i) for i in range(opts.threads)]
    if opts.fork_while == "compile":
        data[1] = layer_data(1, COMPILED_WHILE_FORKING)
    convs = [cso.Conv2d(w, b, activation="relu", **kwargs) for _, w, b, kwargs in data]
    barrier = threading.Barrier(opts.threads)
    results = [[] for _ in data]
    calls = [0] * len(data)
    errors = []
    forks, forks_planned, forks_compiling = [], [0], [0]
    forks_lock = threading.Lock()
    deadline = time.monotonic() + opts.seconds

    def fork_and_compute(i):
        """A child forked now (another thread may be compiling or computing) calls a layer of
        its own and a new one, and checks them against what this process computed."""
        x, w, b, kwargs = data[i]
        if COMPILE_LOCK._lock.acquire(blocking=False):
            COMPILE_LOCK._lock.release()
        else:   # another thread compiles: the fork waits for it (microkernels.once)
            forks_compiling[0] += 1
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            code = 1
            try:
                fresh = cso.Conv2d(w, b, activation="relu", **kwargs)
                got = fresh(x)
                assert_conv_close(got, x, w, b, relu=True, **geometry(kwargs))
                code = 0 if np.array_equal(convs[i](x), got) else 3
            finally:
                os._exit(code)
        forks.append(pid)

    def may_fork(i):
        with forks_lock:
            if forks_planned[0] >= opts.forks:
                return
            forks_planned[0] += 1
        fork_and_compute(i)

    def work(i):
        x = data[i][0]
        try:
            barrier.wait()
            results[i].append(convs[i](x))
            calls[i] += 1
            rng = np.random.default_rng(100 + i)
            while time.monotonic() < deadline:
                results[i].append(convs[i](x))
                calls[i] += 1
                if rng.random() < 0.05:
                    cso.set_num_threads(int(rng.integers(1, 4)))
                if rng.random() < 0.02:
                    may_fork(i)
                if len(results[i]) > 200:   # keep memory bounded in long runs
                    del results[i][1:100]
        except BaseException as err:   # reported below
            errors.append(f"thread {i}: {err!r}")

    def fork_while(what):
        """The main thread's part in ``--fork-while``: thread 1 calls layer 1 (first calls, or
        calls until told to stop) while this thread forks children computing layer 0."""
        nonlocal deadline
        if what == "call":
            convs[1](data[1][0])   # compiled; the loop below keeps the pool busy
            deadline = time.monotonic() + 60
        caller = threading.Thread(target=work, args=(1,))
        caller.start()
        for pause in ((0.05, 0.3, 0.6) if what == "compile" else (0.01, 0.03, 0.1, 0.2)):
            time.sleep(pause)
            fork_and_compute(0)
        deadline = 0
        caller.join()

    if opts.fork_while:
        barrier = threading.Barrier(1)
        fork_while(opts.fork_while)
    else:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(opts.threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    cso.set_num_threads(1)
    for i, (x, w, b, kwargs) in enumerate(data):
        expected = convs[i](x)
        assert_conv_close(expected, x, w, b, relu=True, **geometry(kwargs))
        bad = [k for k, got in enumerate(results[i]) if not np.array_equal(got, expected)]
        if bad:
            errors.append(f"layer {i}: calls {bad} differ from the one-thread result")
    for pid in forks:
        _, status = os.waitpid(pid, 0)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            errors.append(f"forked child {pid} ended with status {status}")
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print("ok", sum(calls), len(forks), forks_compiling[0])
    print(json.dumps(cache.stats()))


if __name__ == "__main__":
    main()
