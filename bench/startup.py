"""Start-up: a new Python process running ResNet-50's eight layer shapes, first with an empty
compilation cache (everything compiled and saved), then again with the cache it filled
(everything loaded), beside the import floor: ``import numpy, numba`` in a new process, which no
start-up of cso can beat. A temporary cache directory is used: the user's cache is left alone."""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from .suites import RESNET50

WARM_RUNS = 3   # new processes timed on the warm cache (and for the floor): their median

# times from the start of ``import numpy, cso``: to the first layer's result, and to the last
# one's; and the first layer's time split
CHILD = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
import cso
imported = time.perf_counter()
import csa
from microkernels import cache
specs = [csa.ConvSpec.parse(name) for name in sys.argv[1:]]
split, results = {"import numpy, cso": imported - start}, []
for spec in specs:
    t, b, l, r = spec.padding
    weight = np.ones(spec.weight_shape, np.float32)
    x = np.ones(spec.input_shape, np.float32)
    if not results:
        begin = time.perf_counter()
        machine = cso.host_machine()
        planned = time.perf_counter()
        csa.analyze(spec, machine, threads=cso.get_num_threads())
        analyzed = time.perf_counter()
    conv = cso.Conv2d(weight, stride=spec.stride, padding=((t, b), (l, r)),
                      dilation=spec.dilation, groups=spec.groups, input_shape=x.shape)
    if not results:
        loaded = time.perf_counter()
    conv(x)
    results.append(time.perf_counter() - start)
    if len(results) == 1:
        split.update({"machine and calibration record": planned - begin,
                      "plan": analyzed - planned,
                      "code loaded or compiled, filters packed": loaded - analyzed,
                      "first call": time.perf_counter() - loaded})
print(json.dumps({"import_s": imported - start, "first_result_s": results[0],
                  "all_s": results[-1], "split_s": split, "cache": cache.stats()}))
"""

FLOOR = r"""
import time
start = time.perf_counter()
import numpy, numba
print(time.perf_counter() - start)
"""


def _run(code, env, args=()):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def _child(cache_dir, threads, specs):
    env = dict(os.environ, CSO_CACHE_DIR=cache_dir, CSO_NUM_THREADS=str(threads))
    return json.loads(_run(CHILD, env, [str(s) for s in specs]))


def import_floor(runs=WARM_RUNS):
    """Median seconds of ``import numpy, numba`` in a new process."""
    return statistics.median(float(_run(FLOOR, dict(os.environ))) for _ in range(runs))


def measure_startup(threads, specs=RESNET50, runs=WARM_RUNS):
    """{"floor_s", "empty", "warm"}: the import floor, then for a new process on an empty and
    on a warm cache the import time, the times from ``import numpy, cso`` to the first layer's
    result and to the last one's, the first layer's time split and the cache's events (warm:
    the run of median first-result time among ``runs``)."""
    with tempfile.TemporaryDirectory(prefix="cso-startup-") as cache_dir:
        empty = _child(cache_dir, threads, specs)
        warm = sorted((_child(cache_dir, threads, specs) for _ in range(runs)),
                      key=lambda run: run["first_result_s"])[runs // 2]
    return {"layers": len(specs), "threads": threads, "floor_s": import_floor(runs),
            "empty": empty, "warm": warm}


def startup_lines(startup):
    """The start-up figures as sentences for the console and the report."""
    empty, warm, floor = startup["empty"], startup["warm"], startup["floor_s"]
    n = startup["layers"]
    split = ", ".join(f"{name} {1000 * seconds:.0f} ms" for name, seconds in
                      warm["split_s"].items())
    return [
        f"import floor (import numpy, numba in a new process): {floor:.2f} s",
        f"empty cache: {n} ResNet-50 layer shapes compiled and run in {empty['all_s']:.2f} s "
        f"from import numpy, cso (first result after {empty['first_result_s']:.2f} s; "
        f"{empty['cache']['misses']} compilations saved)",
        f"warm cache: first result {warm['first_result_s']:.2f} s after import numpy, cso "
        f"(the floor + {warm['first_result_s'] - floor:.2f} s), all {n} in "
        f"{warm['all_s']:.2f} s ({warm['cache']['hits']} entries loaded, "
        f"{warm['cache']['misses']} compiled)",
        f"warm start, split: {split}",
    ]
