"""Benchmark cso against im2col + NumPy GEMM (and onnxruntime, PyTorch when installed), one core.

    python -m bench                          # ResNet-50 layers, every available engine
    python -m bench --suite layers           # the 17-layer ResNet/VGG/MobileNet/YOLO list
    python -m bench --suite timm:100         # a stratified sample of timm's convolutions
    python -m bench --schedules              # IS vs WS forced, and how often CSA's pick wins

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
from .engines import ENGINES, available_engines, check, cso_engine, reference  # noqa: E402
from .suites import suite  # noqa: E402

NOMINAL_PEAK_GFLOPS = 117  # per core: the design document's figure for its reference machine
MIN_SAMPLE_SECONDS = 0.005  # calls are batched until one timed sample lasts at least this


def median_seconds(run, x, repeat):
    """Median over ``repeat`` samples of the time of one call ``run(x)``; short calls are
    repeated within a sample so that timer resolution and noise do not dominate."""
    start = time.perf_counter()
    run(x)
    calls = max(1, int(MIN_SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-7)))
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            run(x)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def measure_engines(specs, engines, repeat):
    rng = np.random.default_rng(0)
    rows = []
    for i, spec in enumerate(specs, 1):
        x = rng.standard_normal(spec.input_shape, dtype=np.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
        ref = reference(spec, x, w)
        gflops = {}
        for name in engines:
            run = ENGINES[name](spec, w)
            check(name, spec, run(x), ref)  # also the untimed warm-up (and compilation)
            gflops[name] = spec.flops / median_seconds(run, x, repeat) / 1e9
        rows.append((spec, gflops))
        report.progress(i, len(specs), spec)
    return rows


def measure_schedules(specs, repeat):
    """Per conv: GFLOP/s with IS and WS forced, and the schedule CSA picks."""
    rng = np.random.default_rng(0)
    rows = []
    for i, spec in enumerate(specs, 1):
        x = rng.standard_normal(spec.input_shape, dtype=np.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
        chosen = cso_engine(spec, w).plan_for(spec.input_shape).schedule
        gflops = {s: spec.flops / median_seconds(cso_engine(spec, w, plan_overrides={"schedule": s}),
                                                 x, repeat) / 1e9
                  for s in ("IS", "WS")}
        rows.append((spec, chosen, gflops))
        report.progress(i, len(specs), spec)
    return rows


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="resnet50", help="resnet50, layers, timm[:N] or a CSV path")
    parser.add_argument("--engines", default=",".join(available_engines()),
                        help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--repeat", type=int, default=5, help="timed samples per engine (median)")
    parser.add_argument("--layers", default="", help="only convolutions whose name contains this")
    parser.add_argument("--schedules", action="store_true",
                        help="time cso with IS and WS forced; report CSA's hit rate")
    opts = parser.parse_args()
    try:
        specs = [spec for spec in suite(opts.suite) if opts.layers in str(spec)]
    except ValueError as err:
        parser.error(str(err))
    if not specs:
        parser.error(f"no convolution name contains {opts.layers!r}")
    engines = opts.engines.split(",")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or "cso" not in engines:
        parser.error(f"--engines must include cso and come from {list(ENGINES)}, got {engines}")

    fma_gflops, fma_count = fma_peak()
    kernel = cso.Conv2d(np.zeros((1, 1, 1, 1), np.float32)).kernel_for((1, 1, 56, 56))
    ukernel_gflops = kernel_throughput(kernel)
    report.print_facts(report.machine_facts() + [
        ("FMA peak", f"{fma_gflops:.1f} GFLOP/s measured on one core ({fma_count} full-width "
                     f"vfmadd in the probe's asm); design doc's nominal {NOMINAL_PEAK_GFLOPS} GFLOP/s"),
        ("u-kernel", f"{ukernel_gflops:.1f} GFLOP/s = {100 * ukernel_gflops / fma_gflops:.1f}% of "
                     f"FMA peak ({kernel}, k={UKERNEL_K}, L1-resident tiles)"),
        ("Suite", f"{opts.suite}: {len(specs)} convolutions, float32"),
        ("Timing", f"median of {opts.repeat} samples after a warm-up; every output checked "
                   "against a float64 reference first"),
    ])
    print()
    if opts.schedules:
        report.print_schedules(measure_schedules(specs, opts.repeat))
    else:
        report.print_table(measure_engines(specs, engines, opts.repeat), engines, fma_gflops)
        print(f"\n% peak is of the measured FMA peak ({fma_gflops:.1f} GFLOP/s); the micro-kernel "
              f"alone reaches {100 * ukernel_gflops / fma_gflops:.1f}% of it.")


main()
