"""Start-up: a new Python process running ResNet-50's eight layer shapes, first with an empty
compilation cache (everything compiled and saved), then again with the cache it filled
(everything loaded). A temporary cache directory is used: the user's cache is left alone."""
import json
import os
import subprocess
import sys
import tempfile

from .suites import RESNET50

# times from the start of ``import cso``: to the first layer's result, and to the last one's
CHILD = r"""
import json, sys, time
start = time.perf_counter()
import cso
import csa
import numpy as np
from microkernels import cache
imported = time.perf_counter() - start
results = []
for name in sys.argv[1:]:
    spec = csa.ConvSpec.parse(name)
    x = np.ones(spec.input_shape, np.float32)
    t, b, l, r = spec.padding
    cso.conv2d(x, np.ones(spec.weight_shape, np.float32), stride=spec.stride,
               padding=((t, b), (l, r)), dilation=spec.dilation, groups=spec.groups)
    results.append(time.perf_counter() - start)
print(json.dumps({"import_s": imported, "first_result_s": results[0], "all_s": results[-1],
                  "cache": cache.stats()}))
"""


def _child(cache_dir, threads, specs):
    env = dict(os.environ, CSO_CACHE_DIR=cache_dir, CSO_NUM_THREADS=str(threads))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", CHILD] + [str(s) for s in specs], cwd=root,
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_startup(threads, specs=RESNET50):
    """{"empty": ..., "warm": ...}: each the import time, the times from ``import cso`` to the
    first layer's result and to the last one's, and the cache's events."""
    with tempfile.TemporaryDirectory(prefix="cso-startup-") as cache_dir:
        empty = _child(cache_dir, threads, specs)
        warm = _child(cache_dir, threads, specs)
    return {"layers": len(specs), "threads": threads, "empty": empty, "warm": warm}


def startup_lines(startup):
    """The start-up figures as sentences for the console and the report."""
    empty, warm = startup["empty"], startup["warm"]
    n = startup["layers"]
    return [
        f"empty cache: {n} ResNet-50 layer shapes compiled and run in {empty['all_s']:.2f} s "
        f"from import cso (first result after {empty['first_result_s']:.2f} s; "
        f"{empty['cache']['misses']} compilations saved)",
        f"warm cache: first result {warm['first_result_s']:.2f} s after import cso (the import "
        f"{warm['import_s']:.2f} s), all {n} in {warm['all_s']:.2f} s "
        f"({warm['cache']['hits']} entries loaded, {warm['cache']['misses']} compiled)",
    ]
