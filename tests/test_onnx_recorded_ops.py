"""Operators that run compiled jobs in the middle of a model, so that its recorded program
(``cso.onnx.program``) replays past them: the dynamo exporter's global and squeeze-excitation
pools (ReduceMean over the spatial axes), LayerNormalization with constant Scale and B, and
standalone activations; each replay against onnxruntime and a plain run."""
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import cso.onnx  # noqa: E402

from .onnx_models import make_model, tensor  # noqa: E402
from .test_onnx_models import assert_matches_onnxruntime  # noqa: E402
from .test_onnx_program import plain_run  # noqa: E402

ZOO = Path(__file__).parent / "data" / "zoo"


def assert_replayed(model, shape, rng, runs=3):
    """``model`` loads with every step replayed, and its replays (on other inputs each time)
    match onnxruntime and a plain run, bit for bit."""
    loaded = cso.onnx.load(model)
    (program,) = loaded._programs.values()   # recorded by the load's second run
    labels = [step.label for step in loaded.steps]
    assert program.resume == len(labels), f"stops at {labels[program.resume]}: {labels}"
    for _ in range(runs):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)
        np.testing.assert_array_equal(loaded.run(None, {"x": x})[0],
                                      plain_run(loaded, {"x": x})[0])
    return labels


def test_squeeze_excitation_and_global_pool_as_reduce_means_are_replayed(rng):
    """EfficientNet's block as the dynamo exporter writes it (opset 18: axes an input, negative):
    ReduceMean (keepdims) for the squeeze, the gate, then a ReduceMean without keepdims for
    the global pool before the classifier."""
    w = {"w0": rng.standard_normal((8, 3, 3, 3)), "w1": rng.standard_normal((2, 8, 1, 1)),
         "w2": rng.standard_normal((8, 2, 1, 1)), "fc": rng.standard_normal((5, 8)),
         "axes": np.array([-1, -2], np.int64)}
    w = {name: (v / 3).astype(np.float32) if v.dtype.kind == "f" else v for name, v in w.items()}
    make = helper.make_node
    nodes = [make("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             make("Relu", ["a"], ["r"]),
             make("ReduceMean", ["r", "axes"], ["squeezed"], keepdims=1),
             make("Conv", ["squeezed", "w1"], ["s1"]),
             make("Relu", ["s1"], ["s2"]),
             make("Conv", ["s2", "w2"], ["s3"]),
             make("Sigmoid", ["s3"], ["gate"]),
             make("Mul", ["r", "gate"], ["scaled"]),
             make("ReduceMean", ["scaled", "axes"], ["pooled"], keepdims=0),
             make("Gemm", ["pooled", "fc"], ["y"], transB=1)]
    model = make_model(nodes, [tensor("x", [1, 3, 9, 11])], [tensor("y", [1, 5])], w, opset=18)
    labels = assert_replayed(model, (1, 3, 9, 11), rng)
    assert labels.count("ReduceMean") == 2


def test_layer_normalization_between_convolutions_is_replayed(rng):
    """A LayerNormalization over a C-contiguous tensor's trailing axes (here C, H, W, as
    GroupNorm(1) is written; or the last), Scale and B constants, then a Relu and a Conv."""
    w = {"w0": rng.standard_normal((6, 3, 3, 3)) / 3, "w1": rng.standard_normal((4, 6, 1, 1)),
         "scale": rng.standard_normal((6, 7, 9)), "b": rng.standard_normal((7, 9)),
         "scale_last": rng.standard_normal(9)}
    w = {name: v.astype(np.float32) for name, v in w.items()}
    make = helper.make_node
    nodes = [make("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             make("LayerNormalization", ["a", "scale", "b"], ["n"], axis=1, epsilon=1e-5),
             make("Relu", ["n"], ["r"]),
             make("LayerNormalization", ["r", "scale_last"], ["m"], axis=-1),
             make("Conv", ["m", "w1"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 7, 9])], [tensor("y", [1, 4, 7, 9])], w,
                       opset=17)
    labels = assert_replayed(model, (1, 3, 7, 9), rng)
    assert labels.count("LayerNormalization") == 2


# the zoo's models whose runs are not replayed whole: ConvNeXt's MatMuls and the
# NumPy views of its NCHW <-> NHWC Transposes, and a Transpose of the same kind in VGG's
# classifier as the dynamo exporter writes it at 64 x 64
NOT_WHOLE = {"convnext_tiny.dy18", "convnext_tiny.ts17", "vgg11_bn.s64.dy18"}


@pytest.mark.parametrize("name", sorted(path.name[:-5] for path in ZOO.glob("*.onnx")
                                        if path.name[:-5] not in NOT_WHOLE))
def test_exports_are_replayed_whole(name, rng):
    """Every step of the zoo's models is replayed: the dynamo exporter's ReduceMean pools,
    ShuffleNet's shape arithmetic, channel shuffle (a permuted copy), channel split (views)
    and Concat of shapes unknown at load, EfficientNet-v2's residual sums after a fused
    activation; and a replay on new input matches a plain run, bit for bit."""
    loaded = cso.onnx.load(ZOO / f"{name}.onnx")
    (program,) = loaded._programs.values()
    labels = [step.label for step in loaded.steps]
    assert program.resume == len(labels), f"stops at {labels[program.resume]}"
    feeds = {name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in zip(loaded.input_names, [program.inputs[n].shape
                                                         for n in loaded.input_names])}
    for replayed, plain in zip(loaded.run(None, feeds), plain_run(loaded, feeds)):
        np.testing.assert_array_equal(replayed, plain)


def test_shape_arithmetic_made_once_is_never_the_callers():
    """A graph output computed from shapes alone (fixed for the program, made once as it
    records) is copied for the caller: what the caller does with it does not reach a later
    run's."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Mul", ["s", "two"], ["y"])]
    model = make_model(nodes, [tensor("x", ["N", 3, 4])],
                       [tensor("y", None, onnx.TensorProto.INT64), tensor("r", None)],
                       {"two": np.array([2], np.int64)})
    loaded = cso.onnx.load(model)
    x = np.ones((2, 3, 4), np.float32)
    loaded.run(None, {"x": x})   # its values planned: the next run records
    first, _ = loaded.run(None, {"x": x})
    (program,) = [p for key, p in loaded._programs.items() if key[0][0][1] == (2, 3, 4)]
    assert program.resume == len(loaded.steps) and "y" in program.fixed
    first[:] = -1
    np.testing.assert_array_equal(loaded.run(None, {"x": x})[0], [4, 6, 8])
    np.testing.assert_array_equal(loaded.run(None, {"x": np.ones((5, 3, 4), np.float32)})[0],
                                  [10, 6, 8])
