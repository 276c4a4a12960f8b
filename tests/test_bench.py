"""The main job runs end to end and writes its report; suites are what they say."""
import json
import subprocess
import sys

import numpy as np
import pytest

import csa
import cso
from bench import documents, engines, measure, report
from bench.engines import as_nchw, fed
from bench.measure import operands
from bench.suites import MOBILENET, RESNET50, TIMM_CSV, VGG16, suite
from csa import ConvSpec

from .children import CHILD_CWD


def run_bench(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "bench", *argv], cwd=CHILD_CWD,
                          capture_output=True, text=True, timeout=timeout)


def test_bench_writes_a_checked_report(tmp_path):
    result = run_bench("--suite", "resnet50", "--layers", "n1c512h7w7", "--repeat", "1",
                       "--engines", "cso,im2col", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "FMA peak" in out and "u-kernel" in out and "Threads" in out
    assert "nominal" not in out and "design doc" not in out   # only what was measured here
    rows = [line for line in out.splitlines() if line.startswith("n1c512h7w7k512r3s3p1u1")]
    assert len(rows) == 1 and rows[0].split()[-2].endswith("x")
    assert "cso faster than im2col on" in out

    results = json.loads((tmp_path / "results.json").read_text())
    (conv,) = results["results"]
    assert conv["spec"] == "n1c512h7w7k512r3s3p1u1" and results["engines"] == ["cso", "im2col"]
    assert all(g > 0 for g in conv["gflops"].values()) and results["peak_gflops"] > 0
    parts = conv["cso"]["breakdown_s"]
    assert set(parts) == {"packing", "micro-kernel", "post-conv", "other"}
    assert parts["micro-kernel"] > 0 and all(v >= 0 for v in parts.values())
    assert conv["cso"]["load_s"] > 0 and conv["cso"]["first_call_s"] > 0
    assert conv["cso"]["plan"]["schedule"] in ("IS", "WS")
    startup = results["startup"]   # a new process, empty then warm compilation cache
    assert startup["layers"] == 8 and startup["empty"]["cache"]["misses"] > 0
    assert startup["warm"]["cache"]["misses"] == 0 and startup["warm"]["cache"]["hits"] > 0
    assert 0 < startup["warm"]["first_result_s"] <= startup["warm"]["all_s"]
    assert startup["floor_s"] > 0   # import numpy, numba in a new process
    split = startup["warm"]["split_s"]
    assert set(split) == {"import numpy, cso", "machine and calibration record", "plan",
                          "code loaded or compiled, filters packed", "first call"}
    assert all(s >= 0 for s in split.values()) and sum(split.values()) <= startup["warm"]["all_s"]
    assert "warm cache: first result" in out
    memory = results["memory"]   # one large convolution's peak beyond its output
    assert memory["spec"] == "n1c256h112w112k256r3s3p1u1"
    assert 0 < memory["cso_bytes"] < 8 * 2 ** 20 < 100 * 2 ** 20 < memory["im2col_bytes"]
    assert "peak memory beyond the output" in out

    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    for name in ("gflops.png", "speedup.png", "peak.png", "breakdown.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in md
    assert html.count("src='data:image/png;base64,") == 4   # self-contained
    assert "n1c512h7w7k512r3s3p1u1" in md and "n1c512h7w7k512r3s3p1u1" in html
    assert "## Start-up" in md and "empty cache:" in md


def test_quick_runs_a_few_convolutions_once(tmp_path):
    """(with the generic ISA forced: what a machine without AVX gets)"""
    result = run_bench("--suite", "mobilenet", "--quick", "--engines", "cso,im2col", "--isa",
                       "generic", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "mobilenet (--quick): 4 convolutions" in result.stdout
    assert "generic (forced" in result.stdout and "__generic" in result.stdout
    assert len(json.loads((tmp_path / "results.json").read_text())["results"]) == 4


def test_schedule_mode_reports_a_hit_rate():
    result = run_bench("--suite", "resnet50", "--layers", "n1c512h7w7", "--repeat", "1", "--schedules")
    assert result.returncode == 0, result.stderr
    assert "CSA picked the faster schedule on" in result.stdout


def test_scaling_mode_times_each_engine_on_1_and_n_threads():
    result = run_bench("--suite", "resnet50", "--layers", "n1c512h7w7", "--repeat", "1",
                       "--threads", "2", "--scaling", "--engines", "cso")
    assert result.returncode == 0, result.stderr
    assert "cso: 1 and 2 threads, in a process of its own" in result.stdout
    (row,) = [line for line in result.stdout.splitlines()
              if line.startswith("n1c512h7w7k512r3s3p1u1")]
    gflop, one, two, scaling, peak = row.split()[1:]
    assert float(one) > 0 and float(two) > 0 and peak.endswith("%")
    # the ratio of the unrounded figures, the printed ones rounded to 0.1 GFLOP/s (a slow
    # 1-thread run, 10 GFLOP/s, moves the ratio of the printed ones by 0.05)
    one, two, ratio = float(one), float(two), float(two) / float(one)
    assert abs(float(scaling) - ratio) <= ratio * (0.05 / one + 0.05 / two) + 0.005
    assert "cso on 2 threads: " in result.stdout
    assert "cso after a 50 ms pause: " in result.stdout


def test_measure_scaling_checks_and_times_both_thread_counts():
    from bench.scaling import measure_scaling
    spec = suite("resnet50")[-1]
    result = measure_scaling(spec, "cso", 2, 1)
    assert result["spec"] == str(spec) and set(result["gflops"]) == {"1", "2"}
    assert all(g > 0 for g in result["gflops"].values())
    assert set(result["paused_x"]) == {"1", "2"} and all(
        x > 0 for x in result["paused_x"].values())


@pytest.mark.parametrize("argv, message", [
    (["--layers", "nope"], "no convolution name contains"),
    (["--suite", "alexnet"], "unknown suite 'alexnet'"),
    (["--engines", "cso"], "--engines must include cso and im2col"),
    (["--threads", "0"], "--threads and --repeat must be at least 1"),
    (["--scaling"], "--scaling compares 1 thread with --threads"),
    (["--scaling", "--threads", "2", "--engines", "cso,im2col"], "--engines with --scaling"),
    (["--isa", "avx9"], "--isa: unknown ISA 'avx9'"),
    (["--dask", "0"], "--dask: WORKERS must be at least 1"),
    (["--dask", "--models"], "--dask is a mode of its own"),
])
def test_bench_rejects_bad_options(argv, message):
    result = run_bench(*argv, timeout=120)
    assert result.returncode == 2 and message in result.stderr


def test_named_suites():
    assert len(RESNET50) == 8 and len(VGG16) == 9 and len(MOBILENET) == 19
    assert [str(s) for s in suite("vgg16")][1] == "n1c64h224w224k64r3s3p1u1"
    depthwise = [s for s in MOBILENET if s.groups > 1]
    assert len(depthwise) == 9 and all(s.groups == s.c == s.k for s in depthwise)
    # each pointwise layer reads what the depthwise layer before it wrote
    for dw, pw in zip(MOBILENET[1::2], MOBILENET[2::2]):
        assert (pw.c, pw.h) == (dw.k, dw.p) and pw.r == 1
    quick = suite("quick")
    assert quick[:27] == RESNET50 + MOBILENET and len(quick) == 54


def test_convbench_samples_are_stratified_and_reproducible(tmp_path):
    sample = suite("convbench:30")
    assert len(sample) == 30 and sample == suite("convbench:30")
    assert len(suite("convbench")) == 100
    kinds = {s.dilation != (1, 1) or (s.r, s.s) == (1, 1) for s in sample}
    assert kinds == {True, False}                      # pointwise/dilated and common both present
    assert all(s.groups == 1 for s in sample)
    # a CSV path: every row, or N rows sampled over every kind in the file
    lines = open(TIMM_CSV).read().splitlines()
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(lines[:41]) + "\n")
    assert len(suite(str(path))) == 40
    assert len(suite(f"{path}:5")) == 5


def test_engines_are_fed_their_own_layouts_and_checked():
    spec = ConvSpec.parse("n1c24h9w11k16r3s3p1u1g2")   # partial blocks on AVX2 and AVX-512
    result = measure.measure_conv(spec, ["cso", "im2col", "cso-blocked", "cso-nhwc"], repeat=1)
    assert set(result["gflops"]) == {"cso", "im2col", "cso-blocked", "cso-nhwc"}
    assert all(g > 0 for g in result["gflops"].values())
    x, _ = operands(spec)
    assert isinstance(fed("cso-blocked", x), cso.Blocked)
    assert fed("cso-nhwc", x).shape == (1, 9, 11, 24) and fed("xnnpack", x).shape == (1, 9, 11, 24)
    np.testing.assert_array_equal(as_nchw("xnnpack", fed("xnnpack", x)), x)


def test_plan_facts_name_where_the_kernel_reads_its_input():
    def source(name, **overrides):
        return measure.plan_facts(csa.analyze(ConvSpec.parse(name), **overrides))["input"]
    assert source("n1c64h14w14k32r1s1p0u1", vectors_along="windows") == "read in place"
    assert source("n1c64h32w32k32r1s1p0u1", vectors_along="windows") == "packed tiles"  # aliased
    assert source("n1c64h28w28k64r3s3p1u1", vectors_along="filters", slab=True) == "slab"
    assert source("n1c64h28w28k64r3s3p1u1", vectors_along="filters", slab=False) == "packed tiles"


def test_a_convolution_an_engine_refuses_leaves_every_geomean(monkeypatch, capsys):
    """XNNPACK (Keras) refuses a stride and a dilation both above 1, before importing anything;
    such a row shows n/a and drops out of every engine's geomean and counts."""
    strided_dilated = ConvSpec.parse("n1c8h12w12k8r3s3p2u2d2")
    with pytest.raises(engines.Unsupported, match="stride and dilation"):
        engines.xnnpack_engine(strided_dilated, operands(strided_dilated)[1])

    def picky(spec, w, threads=1):   # im2col, refusing the strided one
        if spec.stride != (1, 1):
            raise engines.Unsupported("strided")
        return engines.im2col_engine(spec, w, threads)

    monkeypatch.setitem(engines.ENGINES, "picky", picky)
    specs = [ConvSpec.parse("n1c8h12w12k8r3s3p1u1"), strided_dilated]
    results = [measure.measure_conv(s, ["cso", "im2col", "picky"], repeat=1) for s in specs]
    assert "picky" in results[0]["gflops"] and "picky" not in results[1]["gflops"]
    assert results[1]["unsupported"] == {"picky": "strided"}
    report.print_table(results, ["cso", "im2col", "picky"], peak=100.0)
    out = capsys.readouterr().out
    assert "n/a" in out.splitlines()[3] and "the 1 convolutions every engine ran" in out
    geomean_line = next(line for line in out.splitlines() if line.startswith("geomean"))
    assert f"{results[0]['gflops']['cso']:.1f}" in geomean_line   # the first row's alone
    summary = documents._summary(results, ["cso", "im2col", "picky"])
    assert summary["convolutions"] == 1
    assert summary["geomean_gflops"]["im2col"] == pytest.approx(results[0]["gflops"]["im2col"])


def test_scaling_leaves_a_refused_convolution_out_of_every_geomean(capsys):
    """In --scaling an engine that refuses a convolution (XNNPACK a strided dilated one)
    reports no figures for it; the table shows n/a there and its geomeans leave the row out."""
    from bench.scaling import measure_scaling
    strided_dilated = ConvSpec.parse("n1c8h12w12k8r3s3p2u2d2")
    refused = measure_scaling(strided_dilated, "xnnpack", 2, 1)
    assert "gflops" not in refused and "stride and dilation" in refused["unsupported"]

    def timed(spec, one, two):
        return {"spec": spec, "gflop": 0.001, "gflops": {"1": one, "2": two},
                "paused_x": {"1": 1.0, "2": 1.0}}

    results = {"cso": [timed("n1c8h12w12k8r3s3p1u1", 10.0, 18.0),
                       timed(str(strided_dilated), 5.0, 9.0)],
               "xnnpack": [timed("n1c8h12w12k8r3s3p1u1", 12.0, 20.0), refused]}
    report.print_scaling(results, 2, peak=100.0)
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(str(strided_dilated))]
    assert row.count("n/a") == 4   # xnnpack's 1t, 2t, its scaling and cso's ratio to it
    assert "the 1 convolutions every engine ran" in out
    geomean_row = next(line for line in out.splitlines() if line.startswith("geomean"))
    assert geomean_row.split()[1:5] == ["10.0", "18.0", "12.0", "20.0"]   # the first row's
