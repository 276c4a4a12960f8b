"""``python -m bench --models``: the batch-generic copy of a model computes what the model does
and takes other batches; a quick run writes its report. No timing is asserted."""
import subprocess
import sys

import numpy as np
import pytest

from .children import CHILD_CWD

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("threadpoolctl")

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


def test_exported_files_run_as_they_are_and_refused_ones_are_listed(tmp_path, rng):
    """``--models FOLDER``: each ONNX file in it at the batch it fixes; a model cso.onnx
    refuses is listed with the reason, not measured, and the run goes on."""
    from onnx import TensorProto, helper, numpy_helper
    folder = tmp_path / "exported"
    folder.mkdir()
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    for name, last in (("conv_relu", helper.make_node("Relu", ["c"], ["output"])),
                       ("custom", helper.make_node("Foo", ["c"], ["output"], domain="x.y"))):
        graph = helper.make_graph(
            [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]), last], name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 16, 16])], [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("x.y", 1)])
        model.ir_version = 8
        onnx.save(model, str(folder / f"{name}.onnx"))
    done = subprocess.run([sys.executable, "-m", "bench", "--models", str(folder), "--quick",
                           "--out", str(tmp_path / "report")], cwd=CHILD_CWD,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cso.onnx loaded 1 of 2 models; refused:" in done.stdout
    assert "exported/custom: ONNX node" in done.stdout and "domain 'x.y'" in done.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| exported/conv_relu | 1 |" in report and "| exported/conv_relu | 8 |" not in report
