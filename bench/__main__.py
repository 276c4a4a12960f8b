"""Benchmark cso against im2col + NumPy GEMM on ResNet-50 layers, one core each.

cso runs on one core, so NumPy's BLAS is pinned to one thread too (unless the environment says
otherwise); that has to happen before NumPy is first imported.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import cso  # noqa: E402
from microkernels.probe import UKERNEL_K, fma_peak, kernel_throughput  # noqa: E402

from . import report  # noqa: E402
from .engines import ENGINES, check, reference  # noqa: E402
from .layers import LAYERS  # noqa: E402


NOMINAL_PEAK_GFLOPS = 117  # per core: the design document's figure for its reference machine


def median_seconds(run, x, repeat):
    """Median wall time of ``repeat`` calls ``run(x)``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per engine (median)")
    parser.add_argument("--layers", default="", help="only layers whose name contains this")
    opts = parser.parse_args()
    layers = [spec for spec in LAYERS if opts.layers in str(spec)]
    if not layers:
        parser.error(f"no layer name contains {opts.layers!r}")

    fma_gflops, fma_count = fma_peak()
    kernel = cso.Conv2d(np.zeros((1, 1, 1, 1), np.float32)).kernel
    ukernel_gflops = kernel_throughput(kernel)
    report.print_facts(report.machine_facts() + [
        ("FMA peak", f"{fma_gflops:.1f} GFLOP/s measured on one core ({fma_count} full-width "
                     f"vfmadd in the probe's asm); design doc's nominal"
                     f" {NOMINAL_PEAK_GFLOPS} GFLOP/s"),
        ("u-kernel", f"{ukernel_gflops:.1f} GFLOP/s = {100 * ukernel_gflops / fma_gflops:.1f}% of "
                     f"FMA peak ({kernel}, k={UKERNEL_K}, L1-resident tiles)"),
        ("Timing", f"median of {opts.repeat} calls after a warm-up; every output checked against "
                   "a float64 reference first"),
    ])
    print()

    rng = np.random.default_rng(0)
    rows = []
    for spec in layers:
        x = rng.standard_normal(spec.input_shape, dtype=np.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
        ref = reference(spec, x, w)
        gflops = []
        for name, make in ENGINES.items():
            run = make(spec, w)
            check(name, spec, run(x), ref)  # also the untimed warm-up (and compilation)
            gflops.append(spec.flops / median_seconds(run, x, opts.repeat) / 1e9)
        rows.append((str(spec), spec.flops / 1e9, *gflops))
    report.print_table(rows, fma_gflops)
    print(f"\n% peak is of the measured FMA peak ({fma_gflops:.1f} GFLOP/s); the micro-kernel "
          f"alone reaches {100 * ukernel_gflops / fma_gflops:.1f}% of it.")


main()
