"""The ONNX activations (Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu,
Erf) as compiled kernels: single-node models against a float64 reference and onnxruntime, over
their attributes and opset forms, NaN and the infinities, float64, integer Clip and Relu; each
a job that the model's recorded run replays; bad attributes and dtypes name the node."""
import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import cso.onnx  # noqa: E402
from cso.onnx import UnsupportedModel  # noqa: E402
from microkernels.reference import activation_values  # noqa: E402

from bench.models import onnxruntime_session  # noqa: E402

from .onnx_models import make_model, tensor  # noqa: E402

SHAPE = [2, 3, 7, 11]
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}

F32 = np.float32   # ONNX keeps float attributes, and their defaults, in float32
# (op type, attributes, opset, the reference's kind and parameters)
CASES = [
    ("Relu", {}, 14, "relu", ()),
    ("Sigmoid", {}, 13, "sigmoid", ()),
    ("Tanh", {}, 13, "tanh", ()),
    ("Erf", {}, 13, "erf", ()),
    ("HardSwish", {}, 14, "hardswish", ()),
    ("LeakyRelu", {}, 13, "leaky_relu", (F32(0.01),)),
    ("LeakyRelu", {"alpha": 0.2}, 16, "leaky_relu", (F32(0.2),)),
    ("HardSigmoid", {}, 13, "hardsigmoid", (F32(0.2), 0.5)),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.4}, 13, "hardsigmoid", (F32(1 / 6), F32(0.4))),
    ("Gelu", {}, 20, "gelu", ()),
    ("Gelu", {"approximate": "tanh"}, 20, "gelu_tanh", ()),
    ("Clip", {"min": -1.5, "max": 2.1}, 6, "clip", (-1.5, F32(2.1))),
    ("Clip", {}, 6, "clip", (-math.inf, math.inf)),
]


def single(op_type, attrs, opset, dtype=np.float32, extra_inputs=(), initializers=None):
    inputs = ["x"] + [name for name, _ in extra_inputs]
    node = helper.make_node(op_type, inputs, ["y"], **attrs)
    graph_inputs = [tensor("x", SHAPE, ELEM[dtype])] + [
        tensor(name, [], ELEM[dtype]) for name, runtime in extra_inputs if runtime]
    return make_model([node], graph_inputs, [tensor("y", SHAPE, ELEM[dtype])],
                      initializers or {}, opset=opset)


def values(rng, dtype):
    """Normal values, wide ones, and NaN, +-inf, -0.0 at fixed places."""
    x = np.concatenate([rng.standard_normal(300) * 3, rng.uniform(-40, 40, 150)])
    x = np.resize(x, np.prod(SHAPE)).astype(dtype)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x.reshape(SHAPE)


def assert_close(actual, expected, dtype):
    """Within 1e-6 relative or 1e-7 absolute (float32), 1e-13 and 1e-15 (float64); NaN where
    the reference has NaN."""
    rtol, atol = (1e-6, 1e-7) if dtype == np.float32 else (1e-13, 1e-15)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type,attrs,opset,kind,params", CASES,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_activation_matches_the_reference(rng, op_type, attrs, opset, kind, params, dtype):
    x = values(rng, dtype)
    model = single(op_type, attrs, opset, dtype)
    (y,) = cso.onnx.load(model).run(None, {"x": x})
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, activation_values(kind, x, params), dtype)
    if dtype == np.float32 and opset < 20:   # onnxruntime's float32 kernels: within 1e-5
        finite = np.isfinite(x)
        (theirs,) = onnxruntime_session(model, 1).run(None, {"x": x})
        np.testing.assert_allclose(y[finite], theirs[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("runtime", [False, True])
def test_clip_bounds_as_inputs_constant_or_made_at_run_time(rng, runtime):
    x = values(rng, np.float32)
    low, high = np.array(-0.5, np.float32), np.array(3.0, np.float32)
    model = single("Clip", {}, 13, extra_inputs=[("low", runtime), ("high", runtime)],
                   initializers={} if runtime else {"low": low, "high": high})
    feeds = {"x": x, **({"low": low, "high": high} if runtime else {})}
    loaded = cso.onnx.load(model)
    (y,) = loaded.run(None, feeds)
    assert_close(y, activation_values("clip", x, (-0.5, 3.0)), np.float32)
    (program,) = loaded._programs.values()   # recorded by the load's second run
    assert program.resume == (0 if runtime else 1)   # bounds made at run time: not replayed
    if runtime:   # other bounds, the same loaded model: min > max gives max everywhere
        (y,) = loaded.run(None, {**feeds, "low": np.array(2, np.float32),
                                 "high": np.array(1, np.float32)})
        finite = ~np.isnan(x)
        assert np.all(y[finite] == 1) and np.isnan(y[~finite]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type,attrs,opset,kind,params", CASES,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_a_standalone_activation_is_a_replayed_job(rng, op_type, attrs, opset, kind, params,
                                                   dtype):
    """Not fused into a convolution, each activation runs cso.activate's kernel, one job, which
    the model's recorded run replays: later runs on other inputs give their own values."""
    loaded = cso.onnx.load(single(op_type, attrs, opset, dtype))
    (program,) = loaded._programs.values()   # recorded by the load's second run
    assert program.resume == len(loaded.steps) == 1 and len(program.recording) == 1
    for _ in range(2):
        x = values(rng, dtype)
        (y,) = loaded.run(None, {"x": x})
        assert_close(y, activation_values(kind, x, params), dtype)


def test_relu_of_integers_and_float16_runs_numpy(rng):
    """Relu is defined on integers from opset 14 (and cso.activate has no float16 code):
    NumPy's maximum, the dtype kept, into ``out=`` when given."""
    relu = cso.onnx.ops.OPERATORS["Relu"](cso.onnx.node.Node("Relu", "r", ["x"], ["y"]), {})
    for dtype in (np.int8, np.int32, np.int64, np.float16):
        x = np.array([-5, 0, 3, -1, 7], dtype)
        (y,) = relu(x)
        assert y.dtype == dtype and y.tolist() == [0, 0, 3, 0, 7]
        out = np.full(5, 9, dtype)
        assert relu(x, out=out)[0] is out and out.tolist() == [0, 0, 3, 0, 7]
    (y,) = relu(np.array(-2.5, np.float32))
    assert type(y) is np.ndarray and y.ndim == 0 and y == 0


def test_clip_with_one_bound_omitted_and_on_integers():
    node = helper.make_node("Clip", ["x", "", "high"], ["y"])
    model = make_model([node], [tensor("x", [5], TensorProto.INT64)],
                       [tensor("y", [5], TensorProto.INT64)], {"high": np.int64(3)})
    x = np.array([-(1 << 40), -1, 0, 4, 1 << 40], np.int64)
    (y,) = cso.onnx.load(model).run(None, {"x": x})
    assert y.dtype == np.int64 and y.tolist() == [-(1 << 40), -1, 0, 3, 3]


def test_bad_attributes_and_dtypes_name_the_node(rng):
    for op_type, attrs, opset in (("Gelu", {"approximate": "fast"}, 20),
                                  ("LeakyRelu", {"alpha": "x"}, 13),
                                  ("Sigmoid", {"alpha": 1.0}, 13)):
        with pytest.raises(UnsupportedModel, match=f"\\({op_type}\\)"):
            cso.onnx.load(single(op_type, attrs, opset))
    node = helper.make_node("Sigmoid", ["x"], ["y"], name="sig")
    half = make_model([node], [tensor("x", [4], TensorProto.FLOAT16)],
                      [tensor("y", [4], TensorProto.FLOAT16)])
    with pytest.raises(UnsupportedModel, match="'sig' \\(Sigmoid\\): input of dtype float16"):
        cso.onnx.load(half)


def test_an_activation_writes_a_concat_channel_slice_in_place(rng):
    """With ``out=`` (a Concat's channels), the kernel writes the slice and nothing else."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("HardSwish", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    model = make_model(nodes, [tensor("x", [1, 3, 5, 6])], [tensor("y", [1, 6, 5, 6])],
                       opset=14)
    x = rng.standard_normal((1, 3, 5, 6)).astype(np.float32)
    loaded = cso.onnx.load(model)
    for _ in range(2):   # the recording run, then a replay
        (y,) = loaded.run(None, {"x": x})
        assert_close(y[:, :3], activation_values("sigmoid", x), np.float32)
        assert_close(y[:, 3:], activation_values("hardswish", x), np.float32)
        x = x * 2
