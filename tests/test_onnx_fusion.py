"""cso.onnx.fusion: the table of operator roles decides what the loader fuses (each case also
with the table changed, to show it is the table that decides), the fused models give
onnxruntime's values, and the table names only operators and stores that exist."""
import dataclasses
import math
import pickle

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import cso  # noqa: E402
import cso.onnx  # noqa: E402
from cso.onnx import fusion  # noqa: E402
from cso.onnx.ops import OPERATORS  # noqa: E402

from .onnx_models import make_model, tensor  # noqa: E402
from .test_onnx_models import assert_matches_onnxruntime  # noqa: E402


def without(op_type, **changes):
    """The table's Role of ``op_type`` with ``changes`` (for monkeypatch.setitem)."""
    return dataclasses.replace(fusion.ROLES[op_type], **changes)


def relu_without_store(store):
    return without("Relu", activation=dataclasses.replace(
        fusion.RELU, stores=fusion.RELU.stores - {store}))


def conv_batchnorm_relu(rng):
    k = 6
    inits = {"w": rng.standard_normal((k, 4, 3, 3)).astype(np.float32),
             "s": rng.uniform(0.5, 2, k).astype(np.float32),
             "b": rng.standard_normal(k).astype(np.float32),
             "m": rng.standard_normal(k).astype(np.float32),
             "v": rng.uniform(0.5, 2, k).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 4, 9, 8])], [tensor("y", None)], inits)
    return model, {"x": rng.standard_normal((2, 4, 9, 8)).astype(np.float32)}


@pytest.mark.parametrize("table, expected", [
    ("as is", [("Conv", "BatchNormalization", "Relu")]),
    ("Relu not in the conv store", [("Conv", "BatchNormalization"), ("Relu",)]),
    ("BatchNormalization not affine", [("Conv",), ("BatchNormalization",), ("Relu",)]),
])
def test_conv_batchnorm_relu_fuse_as_the_table_says(rng, monkeypatch, table, expected):
    if table == "Relu not in the conv store":
        monkeypatch.setitem(fusion.ROLES, "Relu", relu_without_store("conv"))
    elif table == "BatchNormalization not affine":
        monkeypatch.setitem(fusion.ROLES, "BatchNormalization",
                            without("BatchNormalization", affine=None))
    loaded = assert_matches_onnxruntime(*conv_batchnorm_relu(rng))
    assert [step.ops for step in loaded.steps] == expected
    assert [step.label for step in loaded.steps] == ["+".join(ops) for ops in expected]
    fused = expected[0][-1] == "Relu"
    assert loaded.steps[0].run.activation == (cso.Activation("relu") if fused else None)


def relu_pool_relu(rng, pool, attrs):
    """Conv, Relu, ``pool``, Relu, a 1x1 Conv: the second Relu's input is >= 0 when the pool
    keeps the sign."""
    inits = {"w0": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
             "w1": rng.standard_normal((2, 5, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(pool, ["r"], ["p"], **attrs),
             helper.make_node("Relu", ["p"], ["q"]),
             helper.make_node("Conv", ["q", "w1"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 10, 9])], [tensor("y", None)], inits)
    return model, {"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}


@pytest.mark.parametrize("pool, attrs, elided", [
    ("MaxPool", {"kernel_shape": [2, 2]}, True),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}, False),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    ("GlobalAveragePool", {}, True),
    ("GlobalMaxPool", {}, True),
])
def test_relu_after_a_pool_of_relu_values_is_elided_unless_dilated(rng, pool, attrs, elided):
    loaded = assert_matches_onnxruntime(*relu_pool_relu(rng, pool, attrs))
    ops = [step.ops for step in loaded.steps]
    assert ops == [("Conv", "Relu"), (pool,)] + ([] if elided else [("Relu",)]) + [("Conv",)]
    if elided:   # the second Conv reads the pool's output itself
        assert loaded.steps[2].inputs == loaded.steps[1].outputs == ["p"]


def test_relu_is_kept_after_an_operator_the_table_does_not_say_keeps_the_sign(rng,
                                                                             monkeypatch):
    monkeypatch.setitem(fusion.ROLES, "MaxPool", without("MaxPool", keeps_sign=None))
    loaded = assert_matches_onnxruntime(*relu_pool_relu(rng, "MaxPool", {"kernel_shape": [2, 2]}))
    assert [step.ops for step in loaded.steps] == [
        ("Conv", "Relu"), ("MaxPool",), ("Relu",), ("Conv",)]


def residual(rng):
    """Relu(Conv(x) + x): the Conv's store adds x and applies the Relu."""
    inits = {"w": (rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 4, 6, 7])], [tensor("y", None)], inits)
    return model, {"x": rng.standard_normal((2, 4, 6, 7)).astype(np.float32)}


@pytest.mark.parametrize("table, expected", [
    ("as is", [("Conv", "Add", "Relu")]),
    ("Add no residual", [("Conv",), ("Add",), ("Relu",)]),
])
def test_residual_sum_fuses_as_the_table_says(rng, monkeypatch, table, expected):
    if table == "Add no residual":
        monkeypatch.setitem(fusion.ROLES, "Add", without("Add", residual=False))
    loaded = assert_matches_onnxruntime(*residual(rng))
    assert [step.ops for step in loaded.steps] == expected
    assert loaded.steps[0].run.residual == (len(expected) == 1)


@pytest.mark.parametrize("table, expected", [
    ("as is", [("Sum", "Relu")]),
    ("Relu not in the sum store", [("Sum",), ("Relu",)]),
])
def test_sum_of_two_inputs_then_relu(rng, monkeypatch, table, expected):
    if table == "Relu not in the sum store":
        monkeypatch.setitem(fusion.ROLES, "Relu", relu_without_store("sum"))
    nodes = [helper.make_node("Sum", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [tensor("a", [2, 3, 4]), tensor("b", [2, 3, 4])],
                       [tensor("y", None)])
    feeds = {name: rng.standard_normal((2, 3, 4)).astype(np.float32) for name in "ab"}
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [step.ops for step in loaded.steps] == expected


def test_operator_registration_flags_reach_the_steps(rng):
    """Reshape, registered as capturing its constant shape, is not passed it (nor does the
    model keep it); Softmax, registered as taking ``out=``, is given its arrays."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    model = make_model(nodes, [tensor("x", [2, 3, 4])], [tensor("y", None)],
                       {"shape": np.array([0, -1], np.int64)})
    loaded = assert_matches_onnxruntime(model, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})
    reshape, softmax = loaded.steps
    assert (reshape.ops, reshape.inputs, reshape.takes_out) == (("Reshape",), ["x", ""], False)
    assert "shape" not in loaded.constants
    assert (softmax.ops, softmax.takes_out, softmax.buffered) == (("Softmax",), True, True)


def test_the_table_names_known_operators_and_stores():
    known = set(OPERATORS) | {"Conv"}   # Conv runs as a ConvStep, never as an operator
    assert set(fusion.ROLES) <= known
    named = {op_type for op_type, role in fusion.ROLES.items()
             if role.affine or role.activation or role.keeps_sign or role.residual or role.head}
    assert named == set(fusion.ROLES)   # no entry without a role
    heads = [role.head for role in fusion.ROLES.values() if role.head]
    for head in heads + [fusion.AFFINE_CHAIN, fusion.SUM]:
        assert head.store in fusion.STORES
    for op_type, role in fusion.ROLES.items():
        if role.activation:
            assert role.activation.stores <= set(fusion.STORES)
            if role.activation.stores - {"conv"}:   # kernels.affine and sum_relu: Relu only
                assert op_type == "Relu"
    assert fusion.role("Softmax") == fusion.Role()   # no part in fusion


def composite(rng, chain_nodes, opset=14, head="Conv"):
    """``head`` (a Conv, or a MaxPool that takes no activation), then ``chain_nodes``
    (reading "c", ending in "a"), then a 1x1 Conv."""
    channels = 5 if head == "Conv" else 3
    inits = {"w0": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
             "w1": rng.standard_normal((2, channels, 1, 1)).astype(np.float32),
             "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32), "two": np.array(2, np.float32)}
    first = (helper.make_node("Conv", ["x", "w0"], ["c"]) if head == "Conv" else
             helper.make_node("MaxPool", ["x"], ["c"], kernel_shape=[2, 2]))
    nodes = ([first] + chain_nodes
             + [helper.make_node("Conv", ["a", "w1"], ["y"])])
    model = make_model(nodes, [tensor("x", [1, 3, 10, 9])], [tensor("y", None)], inits,
                       opset=opset)
    return model, {"x": 3 * rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}


SILU = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
HARDSWISH = [helper.make_node("HardSigmoid", ["c"], ["s"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["s", "c"], ["a"])]
GELU = [helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["a"])]


@pytest.mark.parametrize("chain, ops", [
    (SILU, ("Sigmoid", "Mul")), (HARDSWISH, ("HardSigmoid", "Mul")),
    (GELU, ("Div", "Erf", "Add", "Mul", "Mul")),
])
def test_an_exported_activation_chain_runs_as_one_step(rng, monkeypatch, chain, ops):
    """After a MaxPool, a step of its own (a compiled activation); after a Conv, in its
    store."""
    kind = {2: "silu" if ops[0] == "Sigmoid" else "hardswish", 5: "gelu"}[len(ops)]
    loaded = assert_matches_onnxruntime(*composite(rng, chain, head="MaxPool"))
    assert [step.ops for step in loaded.steps] == [("MaxPool",), ops, ("Conv",)]
    assert loaded.steps[1].run.activation == cso.Activation(kind)
    loaded = assert_matches_onnxruntime(*composite(rng, chain))
    assert [step.ops for step in loaded.steps] == [("Conv",) + ops, ("Conv",)]
    assert loaded.steps[0].run.activation == cso.Activation(kind)
    monkeypatch.delitem(fusion.COMPOSITES, kind)   # the table decides
    loaded = assert_matches_onnxruntime(*composite(rng, chain))
    assert [step.ops for step in loaded.steps] == [("Conv",)] + [(o,) for o in ops] + [("Conv",)]


@pytest.mark.parametrize("chain", [
    # ONNX's own HardSigmoid (alpha 0.2) times x is not hardswish
    [helper.make_node("HardSigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "c"], ["a"])],
    # the gate read by another node too
    SILU[:1] + [helper.make_node("Mul", ["c", "s"], ["m"]),
                helper.make_node("Add", ["m", "s"], ["a"])],
    # a Div by 2, not by sqrt 2
    [helper.make_node("Div", ["c", "two"], ["d"])] + GELU[1:],
    # a Mul by another value than the chain's input
    [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Relu", ["c"], ["r"]),
     helper.make_node("Mul", ["r", "s"], ["a"])],
])
def test_a_chain_that_differs_is_left_to_its_operators(rng, chain):
    loaded = assert_matches_onnxruntime(*composite(rng, chain))
    assert all(len(step.ops) == 1 or step.ops[0] in ("Conv",) for step in loaded.steps)
    assert not any(type(step.run).__name__ == "ActivationStep" for step in loaded.steps)


def test_a_squeeze_excitation_gate_is_a_compiled_job_a_replay_covers(rng):
    """Conv, the gate (global pool, 1x1 Conv, Relu, 1x1 Conv, Sigmoid) and the Mul of the
    Conv's planes by it, then a Conv: the Mul runs compiled, so the recording covers the
    whole model and a replay gives onnxruntime's values on new input."""
    inits = {"w0": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "w1": rng.standard_normal((4, 8, 1, 1)).astype(np.float32),
             "w2": rng.standard_normal((8, 4, 1, 1)).astype(np.float32),
             "w3": rng.standard_normal((5, 8, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Conv", ["p", "w1"], ["q"]),
             helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["g"]),
             helper.make_node("Mul", ["c", "g"], ["m"]),
             helper.make_node("Conv", ["m", "w3"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3, 9, 10])], [tensor("y", None)], inits)
    x = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
    loaded = assert_matches_onnxruntime(model, {"x": x})
    (program,) = loaded._programs.values()
    assert program.resume == len(loaded.steps)   # every step replayed
    assert_matches_onnxruntime(model, {"x": 2 * x}, loaded)   # a replay
    plain = make_model([helper.make_node("Mul", ["a", "b"], ["y"])],
                       [tensor("a", [2, 3, 4]), tensor("b", [3, 1])], [tensor("y", None)])
    assert_matches_onnxruntime(plain, {"a": rng.standard_normal((2, 3, 4)).astype(np.float32),
                                       "b": rng.standard_normal((3, 1)).astype(np.float32)})


SINGLE = [
    ("Relu", {}, 13, cso.Activation("relu")),
    ("Clip", {"min": -0.5, "max": 2.0}, 10, cso.Activation("clip", min=-0.5, max=2.0)),
    ("Clip", "inputs", 13, cso.Activation("relu6")),
    ("LeakyRelu", {"alpha": 0.1}, 13, cso.Activation("leaky_relu", alpha=float(np.float32(0.1)))),
    ("Sigmoid", {}, 13, cso.Activation("sigmoid")),
    ("HardSigmoid", {}, 13, cso.Activation("hardsigmoid", alpha=float(np.float32(0.2)),
                                           beta=0.5)),
    ("HardSwish", {}, 14, cso.Activation("hardswish")),
    ("Tanh", {}, 13, cso.Activation("tanh")),
    ("Gelu", {"approximate": "tanh"}, 20, cso.Activation("gelu", approximate="tanh")),
]


@pytest.mark.parametrize("op_type, attrs, opset, activation", SINGLE,
                         ids=[f"{case[0]}-{case[2]}" for case in SINGLE])
@pytest.mark.parametrize("head", ["Conv", "Gemm", "MatMul"])
def test_an_activation_after_a_conv_or_gemm_is_applied_in_its_store(rng, op_type, attrs, opset,
                                                                    activation, head):
    inits = {"w": (0.5 * rng.standard_normal((6, 4, 3, 3))).astype(np.float32),
             "b": rng.standard_normal((4, 6)).astype(np.float32),
             "gb": rng.standard_normal(6).astype(np.float32),
             "low": np.array(0, np.float32), "high": np.array(6, np.float32)}
    inputs = ["c", "low", "high"] if attrs == "inputs" else ["c"]
    head_node = {"Conv": helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                 "Gemm": helper.make_node("Gemm", ["x", "b", "gb"], ["c"]),
                 "MatMul": helper.make_node("MatMul", ["x", "b"], ["c"])}[head]
    shape = {"Conv": [2, 4, 7, 9], "Gemm": [3, 4], "MatMul": [2, 3, 5, 4]}[head]
    nodes = [head_node, helper.make_node(op_type, inputs, ["y"],
                                         **(attrs if isinstance(attrs, dict) else {}))]
    model = make_model(nodes, [tensor("x", shape)], [tensor("y", None)], inits, opset=opset)
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    loaded = assert_matches_onnxruntime(model, {"x": x})
    assert [step.ops for step in loaded.steps] == [(head, op_type)]
    assert loaded.steps[0].run.activation == activation


def test_an_activation_is_left_to_its_operator_when_the_store_cannot_take_it(rng):
    """A Clip whose bound is made at run time, and a Sigmoid of a value read elsewhere too,
    run as operators; a Conv then stores its output plain."""
    inits = {"w": rng.standard_normal((6, 4, 1, 1)).astype(np.float32),
             "w2": rng.standard_normal((3, 6, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Clip", ["c", "low"], ["y"]),
             helper.make_node("Conv", ["x", "w"], ["d"]),
             helper.make_node("Sigmoid", ["d"], ["s"]),
             helper.make_node("Conv", ["d", "w2"], ["z"])]
    model = make_model(nodes, [tensor("x", [1, 4, 5, 5]), tensor("low", [])],
                       [tensor("y", None), tensor("s", None), tensor("z", None)], inits)
    loaded = assert_matches_onnxruntime(model, {
        "x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32),
        "low": np.array(0.25, np.float32)})
    assert [step.ops for step in loaded.steps] == [("Conv",), ("Clip",), ("Conv",),
                                                   ("Sigmoid",), ("Conv",)]
    assert all(getattr(step.run, "activation", None) is None for step in loaded.steps
               if step.ops == ("Conv",))


@pytest.mark.parametrize("a_shape", [(7, 12), (2, 9, 12), (1, 6, 5, 12)])
@pytest.mark.parametrize("bias_rank, bias_first", [("vector", True), ("full", False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_matmul_by_a_constant_takes_its_bias_and_activation(rng, a_shape, bias_rank,
                                                              bias_first, dtype):
    """A MatMul of rows by a constant B runs as a 1x1 convolution on channels last
    (``conv.MatMulStep``), the bias Add (either operand, any shape of one value per column)
    and an exported GELU in its store: one step, onnxruntime's values, recorded and
    replayed at two batch sizes."""
    from cso.onnx.conv import MatMulStep
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    bias_shape = (10,) if bias_rank == "vector" else (1,) * (len(a_shape) - 1) + (10,)
    inits = {"b": rng.standard_normal((12, 10)).astype(dtype),
             "bias": rng.standard_normal(bias_shape).astype(dtype),
             "sqrt2": np.array(np.sqrt(2), dtype), "one": np.array(1, dtype),
             "half": np.array(0.5, dtype)}
    nodes = [helper.make_node("MatMul", ["x", "b"], ["m"]),
             helper.make_node("Add", ["bias", "m"] if bias_first else ["m", "bias"], ["c"])]
    nodes += GELU
    nodes.append(helper.make_node("Relu", ["a"], ["y"]))   # (taken by no store: an operator)
    batched = (None,) + a_shape[1:] if len(a_shape) > 2 else a_shape
    model = make_model(nodes, [helper.make_tensor_value_info("x", elem, list(batched))],
                       [helper.make_tensor_value_info("y", elem, None)], inits, opset=14)
    loaded = cso.onnx.load(model, {"x": a_shape})
    assert [step.ops for step in loaded.steps] == [
        ("MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul"), ("Relu",)]
    assert isinstance(loaded.steps[0].run, MatMulStep)
    erf = np.vectorize(math.erf)
    for rows in ((a_shape[0], a_shape[0]) if len(a_shape) == 2 else (a_shape[0], 3, 3)):
        x = rng.standard_normal((rows,) + a_shape[1:]).astype(dtype)
        c = x.astype(np.float64) @ inits["b"] + inits["bias"]
        expected = np.maximum(c * (1 + erf(c / np.sqrt(2))) / 2, 0)
        (found,) = loaded.run(None, {"x": x})
        assert found.dtype == dtype
        np.testing.assert_allclose(found, expected, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)
        if dtype == np.float32:   # (onnxruntime has no float64 Erf)
            assert_matches_onnxruntime(model, {"x": x}, loaded)
    copy = pickle.loads(pickle.dumps(loaded))
    np.testing.assert_array_equal(copy.run(None, {"x": x})[0], loaded.run(None, {"x": x})[0])


def test_a_matmul_keeps_an_add_that_is_no_bias(rng):
    """An Add of a value per row (not per column), or one that broadcasts the product to more
    dimensions, after a MatMul runs on its own; a MatMul of a 1-D A, or by a B made at run
    time, stays NumPy's."""
    from cso.onnx.conv import MatMulStep
    inits = {"b": rng.standard_normal((4, 6)).astype(np.float32),
             "rows": rng.standard_normal((5, 1)).astype(np.float32),
             "wider": rng.standard_normal((1, 1, 6)).astype(np.float32),
             "v": rng.standard_normal(4).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "b"], ["m"]),
             helper.make_node("Add", ["m", "rows"], ["y"]),
             helper.make_node("MatMul", ["x", "b"], ["m2"]),
             helper.make_node("Add", ["m2", "wider"], ["u"]),
             helper.make_node("MatMul", ["v", "x2"], ["z"]),
             helper.make_node("MatMul", ["x", "x2"], ["w"])]
    model = make_model(nodes, [tensor("x", [5, 4]), tensor("x2", [4, 3])],
                       [tensor("y", None), tensor("u", None), tensor("z", None),
                        tensor("w", None)], inits)
    feeds = {"x": rng.standard_normal((5, 4)).astype(np.float32),
             "x2": rng.standard_normal((4, 3)).astype(np.float32)}
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [step.ops for step in loaded.steps] == [("MatMul",), ("Add",)] * 2 + [
        ("MatMul",), ("MatMul",)]
    assert [isinstance(step.run, MatMulStep) for step in loaded.steps] == [
        True, False, True, False, False, False]
