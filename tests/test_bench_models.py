"""``python -m bench --models``: the batch-generic copy of a model computes what the model does
and takes other batches; a quick run writes its report; OpenVINO is a third engine when it is
installed and the report says so when it is not. No timing is asserted."""
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from .children import CHILD_CWD

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("threadpoolctl")

from bench import models  # noqa: E402
from bench.models import (batch_generic, bench_model, input_shapes, inputs,  # noqa: E402
                          model_path, onnxruntime_session, random_weights, relative_error)


@pytest.mark.parametrize("name", ["shufflenet", "resnet50"])
def test_batch_generic_copy_matches_and_takes_other_batches(name):
    model = random_weights(onnx.load(model_path(name)))
    generic = batch_generic(model)
    shapes = input_shapes(model)
    reshapes = {t.name: onnx.numpy_helper.to_array(t) for t in generic.graph.initializer}
    assert all(reshapes[node.input[1]][0] == 0 for node in generic.graph.node
               if node.op_type == "Reshape")   # these models reshape activations only
    feeds = inputs(shapes, 1)
    (expected,), (actual,) = (onnxruntime_session(m, 1).run(None, feeds) for m in (model, generic))
    assert relative_error(actual, expected) == 0
    (two,) = onnxruntime_session(generic, 1).run(None, inputs(shapes, 2))
    assert two.shape == (2,) + expected.shape[1:] and np.isfinite(two).all()


def test_reshape_of_a_constant_is_left_alone():
    generic = batch_generic(bench_model("inception_v1"))   # reshapes a weight to [1000, 1024]
    shapes = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in generic.graph.initializer}
    assert sorted(shapes[node.input[1]] for node in generic.graph.node
                  if node.op_type == "Reshape") == [[0, 1024], [1000, 1024]]


def test_quick_models_run_writes_a_report(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "--models", "squeezenet", "--quick",
                           "--out", str(tmp_path)], cwd=CHILD_CWD, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "geomean speedup" in done.stdout
    report = (tmp_path / "report.md").read_text()
    assert "## Models" in report and "| squeezenet | 1 |" in report


def export(folder, name, rng, last="Relu", batch=1):
    """``folder/name.onnx``: a 3x3 convolution (3 -> 8 channels, 16 x 16) then ``last`` (an
    operator of the default domain, or "Foo" of domain x.y, which no engine knows), as an
    exporter would write it: fixing ``batch``, or leaving it open ("N") with batch=None."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    domain = "x.y" if last == "Foo" else ""
    dim = "N" if batch is None else batch
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node(last, ["c"], ["output"], domain=domain)], name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [dim, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [dim, 8, 16, 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("x.y", 1)])
    model.ir_version = 8
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def test_exported_files_run_as_they_are_and_refused_ones_are_listed(tmp_path, rng):
    """``--models FOLDER``: each ONNX file in it at the batch it fixes; a model cso.onnx
    refuses is listed with the reason, not measured, and the run goes on."""
    folder = tmp_path / "exported"
    folder.mkdir()
    export(folder, "conv_relu", rng)
    export(folder, "custom", rng, last="Foo")
    done = subprocess.run([sys.executable, "-m", "bench", "--models", str(folder), "--quick",
                           "--out", str(tmp_path / "report")], cwd=CHILD_CWD,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cso.onnx loaded 1 of 2 models; refused:" in done.stdout
    assert "exported/custom: ONNX node" in done.stdout and "domain 'x.y'" in done.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| exported/conv_relu | 1 |" in report and "| exported/conv_relu | 8 |" not in report


def cells(row):
    """A table row as {column: cell}."""
    assert len(row) == len(models.HEADER)
    return dict(zip(models.HEADER, row))


def two_models(tmp_path, rng):
    """bench.models.measure of two exported models: one fixing batch 1 (run at it), one
    leaving it open (run at batch 1 and 3); two samples each."""
    folder = tmp_path / "exported"
    folder.mkdir()
    return [models.measure(export(folder, "fixed", rng), [1, 3], 2, 1),
            models.measure(export(folder, "open", rng, last="Sigmoid", batch=None), [1, 3], 2, 1)]


def test_openvino_settings_are_f32_the_runs_threads_and_latency(tmp_path, rng):
    ov = pytest.importorskip("openvino")
    path = export(tmp_path, "conv_relu", rng)
    compiled, run = models.openvino_engine(path, 2)
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    feeds = inputs({"input": [3, 16, 16]}, 1)
    (expected,) = onnxruntime_session(path, 1).run(None, feeds)
    assert relative_error(run(feeds)["output"], expected) <= models.RTOL


def test_report_with_openvino(tmp_path, rng):
    """OpenVINO installed: its latency at every batch, the speedup of cso over it (its time
    over cso's), its start time and peak memory beside the other engines' (and cso's start on
    an empty cache), in the results, the table and the summary."""
    pytest.importorskip("openvino")
    results = two_models(tmp_path, rng)
    assert [list(r["batches"]) for r in results] == [["1"], ["1", "3"]]
    for r in results:
        assert "openvino" not in r   # only where it did not run: why
        assert set(r["peak_mib"]) == set(r["start_s"]) == {"cso", "onnxruntime", "openvino"}
        assert all(math.isfinite(mib) and mib >= 0 for mib in r["peak_mib"].values())
        assert all(isinstance(s, float) and 0 < s < math.inf for s in r["start_s"].values())
        assert isinstance(r["cold_start_s"], float) and 0 < r["cold_start_s"] < math.inf
        for b in r["batches"].values():
            seconds = b["seconds"]
            assert set(seconds) == {"cso", "cso_nchw", "onnxruntime", "openvino"}
            assert all(s > 0 for s in seconds.values())
            assert b["blocked_gain"] == seconds["cso_nchw"] / seconds["cso"] > 0
            assert b["speedup_openvino"] == seconds["openvino"] / seconds["cso"] > 0
            assert b["speedup"] == seconds["onnxruntime"] / seconds["cso"] > 0
    table = [cells(row) for row in models.rows(results)]
    assert [(row["model"], row["batch"]) for row in table] == [
        ("exported/fixed", "1"), ("exported/open", "1"), ("", "3")]
    batches = [(r, b) for r in results for b in r["batches"].values()]
    for row, (r, b) in zip(table, batches):
        assert row["openvino ms"] == f"{1e3 * b['seconds']['openvino']:.2f}"
        assert row["speedup ov"] == f"{b['seconds']['openvino'] / b['seconds']['cso']:.2f}x"
        assert row["blocked x"] == f"{b['seconds']['cso_nchw'] / b['seconds']['cso']:.2f}x"
    for row, r in ((table[0], results[0]), (table[1], results[1])):
        assert row["start s cso / ort / ov"] == " / ".join(
            f"{r['start_s'][e]:.2f}" for e in ("cso", "onnxruntime", "openvino"))
        assert row["cold s cso"] == f"{r['cold_start_s']:.2f}"
        assert row["peak MiB cso / ort / ov"] == " / ".join(
            f"{r['peak_mib'][e]:.0f}" for e in ("cso", "onnxruntime", "openvino"))
    assert (table[2]["start s cso / ort / ov"] == table[2]["cold s cso"]
            == table[2]["peak MiB cso / ort / ov"] == "")
    speedups = models.geomean_speedups(results, "openvino")
    assert speedups == {"1": pytest.approx(math.sqrt(
                            results[0]["batches"]["1"]["speedup_openvino"]
                            * results[1]["batches"]["1"]["speedup_openvino"])),
                        "3": pytest.approx(results[1]["batches"]["3"]["speedup_openvino"])}
    lines = models.summary_lines(results)
    assert f"batch 1: geomean speedup {speedups['1']:.2f}x over OpenVINO (OpenVINO's time over " \
           f"cso's; above 1, cso is faster) over 2 models" in lines
    assert any(line.startswith("batch 3: ") and "over OpenVINO" in line and
               line.endswith("over 1 models") for line in lines)
    assert not any("OpenVINO was not installed" in line for line in lines)
    gain = models.geomean_speedups(results, "cso_nchw")["1"]
    assert (f"batch 1: cso's channel-blocked values {gain:.2f}x the speed of its NCHW ones "
            f"(geomean over 2 models)") in lines


def test_report_without_openvino(tmp_path, rng, monkeypatch):
    """OpenVINO not installed (its import fails): the report says so, its columns are empty,
    no OpenVINO figure is measured."""
    monkeypatch.setitem(sys.modules, "openvino", None)   # import openvino: ImportError
    assert models.openvino_module() is None
    results = two_models(tmp_path, rng)
    for r in results:
        assert r["openvino"] == {"skipped": models.OPENVINO_MISSING}
        assert set(r["peak_mib"]) == set(r["start_s"]) == {"cso", "onnxruntime"}
        assert all(isinstance(s, float) and s > 0 for s in r["start_s"].values())
        assert isinstance(r["cold_start_s"], float) and r["cold_start_s"] > 0
        for b in r["batches"].values():
            assert set(b["seconds"]) == {"cso", "cso_nchw", "onnxruntime"}
            assert "speedup_openvino" not in b
            assert b["speedup"] == b["seconds"]["onnxruntime"] / b["seconds"]["cso"] > 0
    table = [cells(row) for row in models.rows(results)]
    assert len(table) == 3
    assert all(row["openvino ms"] == row["speedup ov"] == "" for row in table)
    assert table[0]["start s cso / ort / ov"] == (f"{results[0]['start_s']['cso']:.2f} / "
                                                  f"{results[0]['start_s']['onnxruntime']:.2f}")
    assert table[0]["cold s cso"] == f"{results[0]['cold_start_s']:.2f}"
    assert table[0]["peak MiB cso / ort / ov"] == (f"{results[0]['peak_mib']['cso']:.0f} / "
                                                   f"{results[0]['peak_mib']['onnxruntime']:.0f}")
    assert models.geomean_speedups(results, "openvino") == {}
    lines = models.summary_lines(results)
    assert "OpenVINO was not installed (pip install openvino): no OpenVINO figures" in lines
    assert not any("over OpenVINO" in line for line in lines)
    assert sum("over onnxruntime" in line for line in lines) == 2   # batches 1 and 3
    for r in results:   # what cso's model held after the child's runs, a line each
        held = r["cso_memory"]
        assert held["weights"] > 0 and held["values"] > 0 and held["programs"] >= 1
        assert held["total"] == sum(held[kind] for kind in ("weights", "values",
                                                            "workspaces", "inputs"))
        assert held["total"] < r["peak_mib"]["cso"] * 2 ** 20   # held within the peak
        assert models.memory_line(r) in lines
        assert models.memory_line(r).startswith(f"{r['model']}: cso holds "
                                                f"{held['total'] / 2 ** 20:.0f} MiB")
    from bench import documents
    documents.write_models(str(tmp_path / "report"), [("Threads", "1")], results)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| exported/open | 1 |" in report and "- OpenVINO was not installed" in report


def test_models_run_without_openvino_says_so(tmp_path, rng):
    """``python -m bench --models`` in a process where OpenVINO cannot be imported."""
    folder = tmp_path / "exported"
    folder.mkdir()
    export(folder, "conv_relu", rng)
    script = ("import runpy, sys; sys.modules['openvino'] = None; "
              "sys.argv = ['bench', '--models', sys.argv[1], '--quick', '--out', sys.argv[2]]; "
              "runpy.run_module('bench', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(tmp_path / "report")],
                          cwd=CHILD_CWD, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "OpenVINO was not installed (pip install openvino): no OpenVINO figures" in done.stdout
    assert "over onnxruntime" in done.stdout and "over OpenVINO" not in done.stdout


def test_openvino_is_checked_and_a_model_it_cannot_load_is_listed(tmp_path, rng, monkeypatch):
    """OpenVINO's outputs are checked against onnxruntime's like cso's (AssertionError beyond
    RTOL); a model it cannot compile is listed under the table, its cells left empty, and the
    run goes on."""
    pytest.importorskip("openvino")
    (tmp_path / "exported").mkdir()
    path = export(tmp_path / "exported", "conv_relu", rng)
    engine = models.openvino_engine

    def off(path, threads):   # OpenVINO, 1% off
        compiled, run = engine(path, threads)
        return compiled, lambda feeds: {k.get_any_name(): 1.01 * v for k, v in run(feeds).items()}

    monkeypatch.setattr(models, "openvino_engine", off)
    with pytest.raises(AssertionError, match="OpenVINO is wrong on exported/conv_relu at batch 1"):
        models.measure(path, [1], 1, 1)

    def refuses(path, threads):
        raise RuntimeError("Exception from src/x.cpp:1:\nCheck 'false' failed at y.cpp:2:\n"
                           "No conversion rule found for operations: x.y.Foo\n")

    monkeypatch.setattr(models, "openvino_engine", refuses)
    results = [models.measure(path, [1], 1, 1)]
    reason = "could not load it: No conversion rule found for operations: x.y.Foo"
    assert results[0]["openvino"] == {"skipped": reason}
    assert set(results[0]["peak_mib"]) == set(results[0]["start_s"]) == {"cso", "onnxruntime"}
    (row,) = map(cells, models.rows(results))
    assert row["openvino ms"] == row["speedup ov"] == "" and row["cso ms"]
    assert row["start s cso / ort / ov"].count(" / ") == 1
    lines = models.summary_lines(results)
    assert lines[-2:] == ["OpenVINO ran 0 of 1 models; not:", f"  exported/conv_relu: {reason}"]


def test_start_children_run_on_the_warm_cache_and_on_an_empty_one(tmp_path, rng):
    """cso's start child loads what the bench process's runs left in the persistent cache and
    compiles nothing; the child on an empty cache (a new CSO_CACHE_DIR) compiles its kernels."""
    path = export(tmp_path, "conv_sigmoid", rng, last="Sigmoid")
    shapes = {"input": [3, 16, 16]}
    r = models.measure(path, [1], 1, 1)
    assert r["start_s"]["cso"] > 0 and r["cold_start_s"] > 0
    warm = models.measure_child("cso", path, shapes, 1, [1])
    (tmp_path / "empty").mkdir()
    cold = models.measure_child("cso", path, shapes, 1, [1], str(tmp_path / "empty"))
    assert warm["compiled"] == 0 and cold["compiled"] > 0
    assert warm["start_s"] > 0 and cold["start_s"] > 0
    assert any((tmp_path / "empty").iterdir())   # the cold child filled its own cache


def test_each_engine_alone_back_to_back_after_a_pause_and_on_one_thread(tmp_path, rng,
                                                                        monkeypatch):
    """Each engine's latency alone in its process (the start children): back to back and
    after a pause at every thread count, and on several threads its time on one thread in one
    more child, the speedup in the table; the summary's geomeans."""
    monkeypatch.setitem(sys.modules, "openvino", None)   # two engines: fewer children
    path = export(tmp_path, "conv_relu", rng)
    timed = []
    real_child = models.measure_child

    def child(engine, path, shapes, threads, batches, cache_dir=None, samples=0):
        timed.append((engine, threads, samples))
        return real_child(engine, path, shapes, threads, batches, cache_dir, samples)

    monkeypatch.setattr(models, "measure_child", child)
    one, two = models.measure(path, [1], 3, 1), models.measure(path, [1], 3, 2)
    assert ("cso", 1, 3) in timed and ("onnxruntime", 2, 3) in timed
    assert timed.count(("cso", 1, 3)) == 1   # run 1's: the 2-thread run's children time 1 too
    for r, threads in ((one, 1), (two, 2)):
        assert set(r["alone"]) == {"cso", "onnxruntime"}
        for a in r["alone"].values():
            assert a["ms"] > 0 and a["paused_ms"] > 0
            assert ("one_thread_ms" in a) == (threads > 1)
    rows = [dict(zip(models.ALONE_HEADER, row)) for row in models.alone_rows([two])]
    assert [(row["model"], row["engine"]) for row in rows] == [
        (two["model"], "cso"), ("", "onnxruntime")]
    a = two["alone"]["cso"]
    assert rows[0]["pause x"] == f"{a['paused_ms'] / a['ms']:.2f}x"
    assert rows[0]["thread speedup"] == f"{a['one_thread_ms'] / a['ms']:.2f}x"
    assert [dict(zip(models.ALONE_HEADER, row))["thread speedup"]
            for row in models.alone_rows([one])] == ["", ""]
    lines = models.alone_summary([two])
    assert lines[0].startswith("cso alone: after a 50 ms pause ") and "faster than on one" \
        in lines[0]
    assert "one thread" not in models.alone_summary([one])[0]
    with pytest.raises(subprocess.CalledProcessError):   # the child checks its arguments
        real_child("cso", path, {"input": [3, 16, 16]}, 1, [1], samples=-1)


def test_alone_seconds_times_both_thread_counts_in_alternate_blocks(monkeypatch):
    """On several threads an engine's back-to-back time and its one-thread instance's come
    from blocks that alternate (in turn, then in reverse), each after a rest longer than any
    pool's spin; its after-pause samples follow, each after PAUSE_SECONDS."""
    from bench.measure import settle_seconds
    events = []
    monkeypatch.setattr(time, "sleep", lambda seconds: events.append(("rest", seconds)))
    seconds = models.alone_seconds(lambda: events.append("N"), 4, lambda: events.append("1"),
                                   2)
    assert set(seconds) == {"back_to_back", "one_thread", "after_pause"}
    assert all(s > 0 for s in seconds.values())
    blocks = []   # (what came before it, the runs' label) of each run of one label
    for before, event in zip([None] + events, events):
        if event != before and event in ("N", "1"):
            blocks.append((before, event))
    assert [label for _, label in blocks[2:6]] == ["N", "1", "1", "N"]
    assert all(rest == ("rest", settle_seconds(2)) for rest, _ in blocks[2:6])
    assert events[-2:] == [("rest", models.PAUSE_SECONDS), "N"]
