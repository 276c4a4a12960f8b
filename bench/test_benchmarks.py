"""pytest-benchmark set: cso and im2col + GEMM on ResNet-50's layers, grouped by layer, GFLOP/s in
``extra_info``. Run with ``python -m pytest bench --benchmark-only``; in a plain test run each
case still checks its output against the float64 reference (and is timed briefly)."""
import pytest

from bench.engines import ENGINES, check, reference
from bench.measure import operands
from bench.suites import RESNET50


@pytest.mark.parametrize("engine", ["cso", "im2col"])
@pytest.mark.parametrize("spec", RESNET50, ids=str)
def test_layer(benchmark, spec, engine):
    x, w = operands(spec)
    run = ENGINES[engine](spec, w)
    check(engine, spec, run(x), reference(spec, x, w))
    benchmark.group = str(spec)
    benchmark.extra_info["gflop"] = spec.flops / 1e9
    benchmark.pedantic(run, args=(x,), rounds=5, warmup_rounds=1)
    if benchmark.stats is not None:   # None under --benchmark-disable
        benchmark.extra_info["gflops"] = spec.flops / benchmark.stats.stats.median / 1e9
