"""First use from many threads, and fork at any moment: each case runs ``first_use_child.py``
in fresh processes (a crash kills the child, not the test run; a hang dies by its alarm), many
times, since a race shows up in one run of several. The children run with glibc's
``MALLOC_PERTURB_``, which fills freed memory with a pattern: code that uses memory after
freeing it (as the loop nests did with an array numba freed after its last use: other threads'
allocations took it) fails at once instead of now and then. ``CSO_LONG_TESTS=1`` adds a soak."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_use_child.py")
RUNS = 12   # per thread count: before the fix a 6-thread first use crashed 9 runs of 10 here
LONG = os.environ.get("CSO_LONG_TESTS") == "1"


@pytest.fixture(scope="module")
def first_cache(tmp_path_factory):
    """A run on an empty compilation cache (eight threads' first calls all compile), and that
    cache, filled: the other runs' first calls load from it (parse, link and finalize LLVM
    modules at once: where the crash was) instead of compiling."""
    path = tmp_path_factory.mktemp("cso-cache")
    done = _run(str(path), "--threads", "8", "--cso-threads", "2")
    return path, done, [p for p in path.rglob("*") if p.suffix in (".o", ".nbi")]


@pytest.fixture(scope="module")
def warm_cache(first_cache):
    _check(first_cache[1])
    return str(first_cache[0])


def _run(cache_dir, *args, timeout=300):
    env = dict(os.environ, CSO_CACHE_DIR=cache_dir, PYTHONFAULTHANDLER="1", MALLOC_PERTURB_="165")
    env.pop("CSO_NUM_THREADS", None)
    return subprocess.run([sys.executable, CHILD, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _check(done):
    assert done.returncode == 0 and done.stdout.startswith("ok"), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}")
    return [int(n) for n in done.stdout.splitlines()[0].split()[1:]]


def _many(cache_dir, args, runs):
    """``runs`` children, two at a time (this machine's cores): [calls, forks] of each."""
    with ThreadPoolExecutor(2) as pool:
        return [_check(d) for d in pool.map(lambda _: _run(cache_dir, *args), range(runs))]


@pytest.mark.parametrize("cso_threads", [1, 2])
def test_concurrent_first_calls_warm_cache(warm_cache, cso_threads):
    """Eight threads make their first calls on eight distinct layers (3x3, depthwise, 1x1,
    strided 5x5, grouped, float64, dilated, filters in vectors) at once: no crash, and every
    result equals the one-thread result bit for bit."""
    results = _many(warm_cache, ["--threads", "8", "--cso-threads", str(cso_threads)], RUNS)
    assert [calls for calls, _, _ in results] == [8] * RUNS


def test_concurrent_first_calls_empty_cache(first_cache):
    """The same with nothing compiled yet: the threads' first calls want the same loop nests
    and kernels at once, and each is compiled once (as many compilations as entries saved:
    llvmlite objects and numba indexes)."""
    _, done, entries = first_cache
    assert _check(done) == [8, 0, 0]
    events = json.loads(done.stdout.splitlines()[1])
    assert events["hits"] == 0 and events["misses"] == events["saved"] == len(entries) > 10


@pytest.mark.parametrize("cso_threads", [1, 2])
def test_set_num_threads_and_fork_during_calls(warm_cache, cso_threads):
    """Six threads call their layers for 3 s, changing ``set_num_threads`` now and then and
    forking two children that compute in their turn: results stay bit-identical."""
    calls, forks, _ = _check(_run(warm_cache, "--threads", "6", "--cso-threads",
                                  str(cso_threads), "--seconds", "3", "--forks", "2"))
    assert calls > 6 and forks == 2


def test_fork_during_compile(warm_cache):
    """Forks while another thread compiles: each waits for the compilation, and the children
    compute (none inherits the compile lock held by a thread it does not have: they hung)."""
    calls, forks, while_compiling = _check(_run(warm_cache, "--fork-while", "compile"))
    assert forks == 3 and while_compiling >= 1


@pytest.mark.parametrize("cso_threads", [1, 2])
def test_fork_during_call(warm_cache, cso_threads):
    """Forks while another thread's calls keep the pool busy: the children start a pool of
    their own and compute."""
    assert _check(_run(warm_cache, "--fork-while", "call",
                       "--cso-threads", str(cso_threads)))[1] == 4


@pytest.mark.skipif(not LONG, reason="a 2 x 25 s soak: set CSO_LONG_TESTS=1")
@pytest.mark.parametrize("cso_threads", [1, 2])
def test_soak(warm_cache, cso_threads):
    calls, forks, _ = _check(_run(warm_cache, "--threads", "8", "--cso-threads",
                                  str(cso_threads), "--seconds", "25", "--forks", "3"))
    assert calls > 1000 and forks == 3
