"""Reading model files: weights inline, read from the file at their offsets, or in an external
data file beside the graph (as the dynamo exporter writes them), and clear errors for a file
that is not ONNX, is truncated, is empty, has no output, or lost its external data."""
import os
import tracemalloc

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402

import cso.onnx  # noqa: E402
from cso.onnx import UnsupportedModel  # noqa: E402

from .onnx_models import make_model, tensor  # noqa: E402
from .reference import conv2d_reference  # noqa: E402


@pytest.fixture
def conv_relu(rng):
    """A Conv + Relu model and its weight."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 8, 8])],
                      {"w": w}, opset=17), w


def save_external(model, path):
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


def test_weights_in_an_external_data_file_load_from_the_path(tmp_path, rng, conv_relu):
    model, w = conv_relu
    path = tmp_path / "model.onnx"
    save_external(model, path)
    assert (tmp_path / "model.onnx.data").stat().st_size == w.nbytes
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for source in (path, str(path)):
        y = cso.onnx.load(source)(x)
        np.testing.assert_allclose(y, np.maximum(conv2d_reference(x, w, padding=(1, 1, 1, 1)), 0),
                                   rtol=1e-5, atol=1e-5)


def test_external_data_missing_is_named(tmp_path, conv_relu):
    path = tmp_path / "model.onnx"
    save_external(conv_relu[0], path)
    without_data = onnx.load(str(path), load_external_data=False)
    with pytest.raises(UnsupportedModel, match="external data file"):
        cso.onnx.load(without_data)
    os.remove(tmp_path / "model.onnx.data")
    with pytest.raises(UnsupportedModel, match=f"{path}: its weights cannot be read"):
        cso.onnx.load(path)


def test_external_data_of_several_tensors_is_read_at_their_offsets(tmp_path, rng):
    """The dynamo exporter's layout: every weight in one data file, each at its offset, read
    straight into arrays (not into the proto first); a data file cut short names the tensor
    it lacks."""
    w1 = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, 6, 1, 1)).astype(np.float32)
    b2 = rng.standard_normal(5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 7, 7])], [tensor("y", [1, 5, 7, 7])],
                       {"w1": w1, "w2": w2, "b2": b2}, opset=17)
    path = tmp_path / "chain.onnx"
    save_external(model, path)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    hidden = np.maximum(conv2d_reference(x, w1, padding=(1, 1, 1, 1)), 0)
    expected = conv2d_reference(hidden, w2) + b2[:, None, None]
    np.testing.assert_allclose(cso.onnx.load(path)(x), expected, rtol=1e-5, atol=1e-5)
    data = tmp_path / "chain.onnx.data"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(UnsupportedModel, match=f"{path}: its weights cannot be read: "
                                               r"\w+ has \d+ of its \d+ values"):
        cso.onnx.load(path)


def test_weights_held_inline_are_read_from_the_file_at_their_offsets(tmp_path, rng):
    """A file with its weights inline (as the TorchScript exporter and the model zoo write
    them): the proto read from it holds the small ones alone (``cso.onnx.wire``), with no copy
    of the file in memory; each large one is read from the file at its offset into an array.
    The model runs as the one loaded from its proto. A text-format file is read by onnx."""
    from onnx.external_data_helper import uses_external_data
    from cso.onnx import model as model_module
    w1 = rng.standard_normal((64, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((500, 64, 1, 1)).astype(np.float32)
    b2 = rng.standard_normal(500).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"]),
             helper.make_node("Mul", ["y", "half"], ["z"])]
    model = make_model(nodes, [tensor("x", [1, 3, 7, 7])], [tensor("z", [1, 500, 7, 7])],
                       {"w1": w1, "w2": w2, "b2": b2, "half": np.float32(0.5)}, opset=17)
    path = tmp_path / "inline.onnx"
    onnx.save(model, str(path))
    tracemalloc.start()
    try:
        proto = model_module._read(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < w2.nbytes / 4 and proto.ByteSize() < 2048
    held = {t.name: t for t in proto.graph.initializer}
    assert not uses_external_data(held["half"])
    data = path.read_bytes()
    for name, w in (("w1", w1), ("w2", w2), ("b2", b2)):
        info = {entry.key: entry.value for entry in held[name].external_data}
        assert uses_external_data(held[name]) and info["location"] == "inline.onnx"
        start = int(info["offset"])
        assert data[start:start + int(info["length"])] == w.tobytes()
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    expected = cso.onnx.load(model)(x)
    np.testing.assert_array_equal(cso.onnx.load(path)(x), expected)
    text = tmp_path / "inline.textproto"
    onnx.save(model, str(text))
    np.testing.assert_array_equal(cso.onnx.load(text)(x), expected)


def test_a_file_that_is_not_a_whole_model_is_refused(tmp_path, conv_relu):
    whole = conv_relu[0].SerializeToString()
    for name, content in (("text.onnx", b"not a model\n" * 10),
                          ("truncated.onnx", whole[:len(whole) // 2]),
                          ("empty.onnx", b"")):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(UnsupportedModel, match="not an ONNX model|no outputs"):
            cso.onnx.load(path)
    with pytest.raises(FileNotFoundError):
        cso.onnx.load(tmp_path / "absent.onnx")


def test_a_graph_without_outputs_or_with_an_unmade_one_is_refused(conv_relu):
    model, w = conv_relu
    del model.graph.output[:]
    with pytest.raises(UnsupportedModel, match="no outputs"):
        cso.onnx.load(model)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"])]
    dangling = make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 6, 6])],
                          {"w": w})
    with pytest.raises(UnsupportedModel, match=r"\['y'\] are made by no node"):
        cso.onnx.load(dangling)
