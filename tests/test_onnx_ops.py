"""cso.onnx.ops: each operator against onnxruntime and the onnx reference evaluator on one-node
models, and the load-time refusals."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from cso.onnx.graph import AffineStep  # noqa: E402
from cso.onnx.node import Node, UnsupportedModel  # noqa: E402
from cso.onnx.ops import OPERATORS  # noqa: E402

from .onnx_models import _model, build, check as check_operator  # noqa: E402


def check(*args, rtol=1e-5, atol=1e-6, **kwargs):
    """``onnx_models.check`` at this file's tolerance."""
    return check_operator(*args, rtol=rtol, atol=atol, **kwargs)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --- elementwise ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)),
                                    ((1, 3, 1, 5), (2, 1, 4, 1)), ((4,), ())])
def test_binary_broadcasting(op, shapes, rng):
    (y,) = check(op, {"a": rand(rng, *shapes[0]), "b": rand(rng, *shapes[1])}, opset=9)
    assert y.dtype == np.float32


@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3), (2, 3)], [(1, 3), (2, 1), (3,)],
                                    [(3,), (2, 3), (2, 3), (1, 1)]])
def test_sum(shapes, rng):
    feeds = {f"x{i}": rand(rng, *shape) for i, shape in enumerate(shapes)}
    check("Sum", feeds, opset=9)
    check("Sum", feeds, opset=13)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 80), ()])
def test_relu_and_identity(shape, rng):
    x = rand(rng, *shape)
    (y,) = check("Relu", {"x": x}, opset=9)
    assert (y >= 0).all() and y.dtype == np.float32
    check("Identity", {"x": x}, opset=9)


BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Sum", "Mean", "And", "Or", "Xor",
          "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]
LOGICAL = {"And", "Or", "Xor"}
COMPARISONS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_binary_operators_of_0d_arrays_give_0d_arrays(op, dtype):
    """NumPy's ufuncs give a scalar (np.float32, say) for 0-d inputs; every operator's output is
    an array, of the inputs' dtype (bool for comparisons), with the value."""
    if (op in LOGICAL) != (dtype == np.bool_) or (op == "Mean" and dtype != np.float32
                                                  and dtype != np.float64):
        return
    a, b = np.array(6, dtype), np.array(3 if dtype != np.bool_ else 0, dtype)
    (y,) = build(op, inputs=("a", "b"))(a, b)
    assert type(y) is np.ndarray and y.ndim == 0
    assert y.dtype == (np.bool_ if op in COMPARISONS else dtype)
    numpy = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
             "Pow": np.power, "Min": np.minimum, "Max": np.maximum, "Sum": np.add,
             "Mean": lambda a, b: (a + b) / 2, "And": np.logical_and, "Or": np.logical_or,
             "Xor": np.logical_xor, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
             "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal}[op]
    assert y == numpy(a, b)   # (6 / 3 exact: the integer division's truncation is moot)


# --- pooling -------------------------------------------------------------------------------

POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3]),
    dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 2, 1, 0]),          # asymmetric
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[3, 2], strides=[2, 3], pads=[2, 0, 0, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1),  # last dropped
    dict(kernel_shape=[2, 2], strides=[3, 3]),                              # strides > kernel
    dict(kernel_shape=[1, 1], strides=[2, 2]),
    dict(kernel_shape=[7, 9]),                                # kernel == input: a global pool
    dict(kernel_shape=[7, 9], strides=[2, 2], pads=[0, 0, 1, 1]),   # one window, and padding
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[4, 4], strides=[1, 1], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[4, 3], strides=[2, 1], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID"),
]


def _pool_engines(attrs):
    # the reference evaluator's SAME_LOWER output is one short of ceil(input / stride) here
    return ("ort",) if attrs.get("auto_pad") == "SAME_LOWER" else ("ort", "reference")


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("opset", [10, 13])
def test_max_pool(attrs, opset, rng):
    check("MaxPool", {"x": rand(rng, 2, 3, 7, 9)}, attrs, opset=opset,
          engines=_pool_engines(attrs))


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], dilations=[2, 2]),
    dict(kernel_shape=[2, 3], strides=[2, 1], dilations=[3, 2], pads=[1, 0, 1, 2]),
    dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1], pads=[1, 1, 0, 0], ceil_mode=1),
])
def test_max_pool_dilations(attrs, rng):
    check("MaxPool", {"x": rand(rng, 1, 2, 9, 8)}, attrs, opset=12)


def test_max_pool_opset_9_and_storage_order(rng):
    x = rand(rng, 1, 2, 6, 6)
    check("MaxPool", {"x": x}, dict(kernel_shape=[2, 2], strides=[2, 2]), opset=9)
    check("MaxPool", {"x": x}, dict(kernel_shape=[2, 2], storage_order=1), opset=9)


def test_max_pool_integers(rng):
    x = rng.integers(-128, 127, (1, 2, 6, 6), dtype=np.int8)
    # the reference evaluator pads integers with NaN
    check("MaxPool", {"x": x}, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12,
          engines=("ort",))


def test_max_pool_indices_omitted(rng):
    x = rand(rng, 1, 2, 4, 4)
    y, indices = build("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]),
                       outputs=("y", ""))(x)
    assert indices is None
    np.testing.assert_array_equal(y, x.reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5)))


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attrs, count_include_pad, rng):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    check("AveragePool", {"x": rand(rng, 2, 3, 7, 9)}, attrs, opset=11,
          engines=_pool_engines(attrs))


def test_average_pool_divisor_excludes_ceil_region():
    """count_include_pad=1 counts the pads, not the cells ceil_mode adds past them."""
    x = np.ones((1, 1, 5, 5), np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1,
                 count_include_pad=1)
    (y,) = check("AveragePool", {"x": x}, attrs, opset=10)
    # windows cover rows -1..1 (one pad counted), 1..3 and 3..5 (row 5 is past the pads)
    per_axis = np.array([2 / 3, 1, 1])
    np.testing.assert_allclose(y[0, 0], np.outer(per_axis, per_axis), rtol=1e-6)


@pytest.mark.parametrize("op, kernel", [("MaxPool", [2, 3]), ("AveragePool", [2, 3]),
                                        ("AveragePool", [4, 5])])   # the last: a global pool
def test_pools_make_their_output_in_out_or_buffers(op, kernel, rng):
    from cso.buffers import Buffers
    x = rand(rng, 1, 3, 4, 5)
    pool = build(op, dict(kernel_shape=kernel))
    (expected,) = pool(x)[:1]
    block = np.full((1, 5, 3, 3), 7, np.float32)   # the pool's channels are 1..3, cut to its
    out = block[:, 1:4, :expected.shape[2], :expected.shape[3]]   # shape when it is not 3x3
    if not out.flags.c_contiguous:
        out = np.empty_like(expected)
    assert pool(x, out=out)[0] is out
    np.testing.assert_array_equal(out, expected)
    buffers = Buffers()
    made = pool(x, buffers=buffers)[0]
    np.testing.assert_array_equal(made, expected)
    assert buffers.nbytes >= made.nbytes
    for wrong in (np.empty((1, 3, 9, 9), np.float32), np.empty(expected.shape, np.float64),
                  np.empty((1, 6) + expected.shape[2:], np.float32)[:, ::2]):
        with pytest.raises(UnsupportedModel, match=r"out= of shape .* for an output of shape"):
            pool(x, out=wrong)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (2, 3, 1, 1)])
def test_global_pools(op, shape, rng):
    # the reference evaluator's GlobalMaxPool reduces the channels of a 3-D input too
    engines = ("ort",) if len(shape) == 3 else ("ort", "reference")
    check(op, {"x": rand(rng, *shape)}, opset=9, engines=engines)
    (empty,) = build(op, opset=9)(rand(rng, 0, *shape[1:]))   # an empty batch
    assert empty.shape == (0, shape[1]) + (1,) * (len(shape) - 2)


# --- normalisation -------------------------------------------------------------------------

def _statistics(rng, channels):
    return {"scale": rand(rng, channels), "bias": rand(rng, channels),
            "mean": rand(rng, channels), "var": rng.uniform(0.5, 2, channels).astype(np.float32)}


@pytest.mark.parametrize("opset, attrs", [(7, dict(epsilon=1e-3, spatial=1)),
                                          (9, dict(momentum=0.8)), (15, dict(training_mode=0))])
@pytest.mark.parametrize("shape", [(2, 4, 5, 3), (3, 4)])
def test_batch_normalization(opset, attrs, shape, rng):
    x, stats = rand(rng, *shape), _statistics(rng, 4)
    # the reference evaluator fails at opset 7 and applies momentum at opset 9
    engines = ("ort", "reference") if opset >= 14 else ("ort",)
    y, = check("BatchNormalization", {"x": x}, attrs, opset=opset, constants=stats,
               engines=engines, atol=1e-5)
    along_c = (-1,) + (1,) * (x.ndim - 2)
    scale, bias, mean, var = (v.astype(np.float64).reshape(along_c) for v in stats.values())
    want = (x - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5)) * scale + bias
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_batch_normalization_omitted_outputs(rng):
    x, stats = rand(rng, 1, 3, 2, 2), _statistics(rng, 3)
    y, mean, var = build("BatchNormalization", opset=9, inputs=["x", *stats],
                         outputs=("y", "", ""), constants=stats)(x, *stats.values())
    assert mean is None and var is None and y.shape == x.shape


def _lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """The spec's LRN, one channel at a time in float64."""
    x = x.astype(np.float64)
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - (size - 1) // 2):c + size // 2 + 1]
        y[:, c] = x[:, c] / (bias + alpha / size * (window ** 2).sum(1)) ** beta
    return y


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
def test_lrn(size, rng):
    # onnxruntime refuses even sizes; the reference evaluator loops over the batch, not the
    # channels: both are checked against the spec's formula
    x = rand(rng, 2, 7, 4, 3)
    attrs = dict(size=size, alpha=2e-2, beta=0.75, bias=1.5)
    (y,) = check("LRN", {"x": x}, attrs, opset=9, engines=("ort",) if size % 2 else ())
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, _lrn(x, **attrs), rtol=1e-5, atol=1e-6)


def test_lrn_defaults(rng):
    x = rand(rng, 1, 6, 3, 3) * 10
    (y,) = check("LRN", {"x": x}, dict(size=5), opset=13, engines=("ort",))
    np.testing.assert_allclose(y, _lrn(x, 5), rtol=1e-5, atol=1e-6)


# --- shapes and tensors --------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 3, -1, -3])
def test_concat(axis, rng):
    feeds = {f"x{i}": rand(rng, *[extent if d == axis % 4 else n
                                   for d, n in enumerate((2, 3, 4, 5))])
             for i, extent in enumerate((1, 2, 3))}
    check("Concat", feeds, dict(axis=axis), opset=11)


@pytest.mark.parametrize("attrs", [
    dict(value=numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))),
    dict(value_float=2.5), dict(value_floats=[1.0, 2.0]), dict(value_int=3),
    dict(value_ints=[4, 5, 6])])
def test_constant(attrs):
    (y,) = check("Constant", {}, attrs, opset=13, inputs=())
    assert not y.flags.writeable


@pytest.mark.parametrize("value", [None, np.array([7], np.int64), np.array([1.5], np.float32)])
def test_constant_of_shape(value):
    attrs = {} if value is None else dict(value=numpy_helper.from_array(value))
    check("ConstantOfShape", {"shape": np.array([2, 3, 1], np.int64)}, attrs, opset=9)
    check("ConstantOfShape", {"shape": np.array([], np.int64)}, attrs, opset=13)


@pytest.mark.parametrize("opset", [7, 9, 10, 11])
def test_dropout_opset_7_to_11(opset, rng):
    x = rand(rng, 2, 3, 4)
    (y,) = check("Dropout", {"x": x}, dict(ratio=0.3), opset=opset)
    assert y is x
    y, mask = check("Dropout", {"x": x}, opset=opset, outputs=("y", ""))
    assert mask is None


def test_dropout_opset_12(rng):
    x = rand(rng, 2, 3, 4)
    constants = {"ratio": np.array(0.5, np.float32), "training_mode": np.array(False)}
    _, mask = check("Dropout", {"x": x}, opset=13, inputs=("x", "ratio", "training_mode"),
                    outputs=("y", "mask"), constants=constants)
    assert mask.dtype == bool and mask.all()
    check("Dropout", {"x": x}, opset=12, inputs=("x", "", "training_mode"),
          constants={"training_mode": np.array(False)})
    y, mask = check("Dropout", {"x": x}, dict(seed=3), opset=13, outputs=("y", ""))
    assert y is x and mask is None


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -4])
def test_flatten(axis, rng):
    check("Flatten", {"x": rand(rng, 2, 3, 4, 5)}, dict(axis=axis), opset=13)
    if axis >= 0:
        check("Flatten", {"x": rand(rng, 2, 3, 4, 5)}, dict(axis=axis), opset=9)


@pytest.mark.parametrize("shape", [[6, 20], [0, -1], [2, 0, 0, 5], [-1], [0, 3, -1, 1], [120]])
def test_reshape(shape, rng):
    x, shape = rand(rng, 2, 3, 4, 5), np.array(shape, np.int64)
    check("Reshape", {"x": x}, opset=9, constants={"shape": shape})
    check("Reshape", {"x": x, "shape": shape}, opset=13)   # a shape made at run time


def test_reshape_to_a_bad_shape_made_at_run_time_names_the_node(rng):
    run = build("Reshape", inputs=("x", "shape"))
    x = rand(rng, 2, 3)
    for shape, match in (([4, 2], "cannot take shape"), ([-1, -1], "at most one -1"),
                         ([0, 0, 0], "copies dimension 2")):
        with pytest.raises(UnsupportedModel, match=f"'my_reshape'.*{match}"):
            run(x, np.array(shape, np.int64))


def test_reshape_allowzero(rng):
    x = rand(rng, 0, 3, 4)
    check("Reshape", {"x": x}, dict(allowzero=1), opset=14,
          constants={"shape": np.array([3, 0, 4], np.int64)}, engines=("reference",))
    check("Reshape", {"x": rand(rng, 2, 3)}, dict(allowzero=0), opset=14,
          constants={"shape": np.array([0, 3], np.int64)})


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm, rng):
    check("Transpose", {"x": rand(rng, 2, 3, 4, 5)}, {} if perm is None else dict(perm=perm))


@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [-1, 0], [4, 1]])
def test_unsqueeze(axes, rng):
    x = rand(rng, 2, 3, 4)
    # the reference evaluator inserts unsorted axes one after the other
    engines = ("ort", "reference") if axes == sorted(axes) else ("ort",)
    check("Unsqueeze", {"x": x}, dict(axes=axes), opset=11, engines=engines)
    check("Unsqueeze", {"x": x}, opset=13, constants={"axes": np.array(axes, np.int64)},
          engines=engines)
    if min(axes) >= 0:
        check("Unsqueeze", {"x": x}, dict(axes=axes), opset=9, engines=engines)
    check("Unsqueeze", {"x": x, "axes": np.array(axes, np.int64)}, opset=13,   # at run time
          engines=engines)


# --- matrix products and softmax -----------------------------------------------------------

@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 5), (3, 1), (1, 5)])
@pytest.mark.parametrize("constant_b", [True, False])
def test_gemm(trans_a, trans_b, c_shape, constant_b, rng):
    a = rand(rng, *((4, 3) if trans_a else (3, 4)))
    b = rand(rng, *((5, 4) if trans_b else (4, 5)))
    attrs = dict(transA=trans_a, transB=trans_b, alpha=0.7, beta=-1.3)
    feeds, constants = {"a": a}, {}
    (constants if constant_b else feeds)["b"] = b
    inputs = ["a", "b"]
    if c_shape is not None:
        constants["c"] = rand(rng, *c_shape)
        inputs.append("c")
    check("Gemm", feeds, attrs, opset=13, inputs=inputs, constants=constants)


@pytest.mark.parametrize("opset", [9, 13])
def test_gemm_defaults_and_runtime_c(opset, rng):
    feeds = {"a": rand(rng, 2, 6), "b": rand(rng, 6, 3), "c": rand(rng, 3)}
    check("Gemm", feeds, opset=opset)
    check("Gemm", feeds, dict(beta=0.0), opset=opset)


@pytest.mark.parametrize("shape, axis", [((2, 1000), None), ((2, 3, 4, 5), 1),
                                         ((2, 3, 4, 5), -1), ((2, 3, 4, 5), 0),
                                         ((2, 3, 4, 5), 2), ((3, 4), -2)])
@pytest.mark.parametrize("opset", [9, 13])
def test_softmax(shape, axis, opset, rng):
    attrs = {} if axis is None else dict(axis=axis)
    # the reference evaluator ignores opset < 13's flattening
    engines = ("ort", "reference") if opset >= 13 else ("ort",)
    (y,) = check("Softmax", {"x": rand(rng, *shape) * 5}, attrs, opset=opset, engines=engines)
    assert y.dtype == np.float32


def test_softmax_kernel_takes_out_and_buffers_and_leaves_other_dtypes_to_numpy(rng):
    """Rows along the last axis (or before opset 13 the flattened tail) run the compiled
    kernel into ``out=`` or an array of ``buffers=``; float16, which it has no code for, and
    other axes still run (NumPy), into a new array."""
    from cso.buffers import Buffers
    x = rand(rng, 2, 3, 4, 5)
    for opset, axis in ((9, 1), (13, -1)):
        run = OPERATORS["Softmax"](Node.from_proto(_model("Softmax", ["x"], ["y"], dict(axis=axis),
                                                          opset, {"x": x}, {}).graph.node[0], opset), {})
        (want,) = run(x)
        out = np.empty_like(x)
        (got,) = run(x, out=out)
        assert got is out and np.array_equal(out, want)
        buffers = Buffers()
        (made,) = run(x, buffers=buffers)
        assert buffers.owns(made) and np.array_equal(made, want)
        with pytest.raises(ValueError, match="out= of shape"):
            run(x, out=np.empty((2, 3, 4, 6), np.float32))
    half = x.astype(np.float16)
    (y,) = check("Softmax", {"x": half}, dict(axis=-1), rtol=2e-3, atol=1e-3, engines=("reference",))
    assert y.dtype == np.float16


def test_softmax_opset_9_and_13_differ_on_4d_axis_1(rng):
    x = rand(rng, 2, 3, 4, 5)
    (old,) = check("Softmax", {"x": x}, dict(axis=1), opset=9, engines=("ort",))
    (new,) = check("Softmax", {"x": x}, dict(axis=1), opset=13)
    np.testing.assert_allclose(old.reshape(2, -1).sum(1), 1, rtol=1e-5)
    np.testing.assert_allclose(new.sum(1), 1, rtol=1e-5)


# --- load-time refusals --------------------------------------------------------------------

@pytest.mark.parametrize("op, attrs, kwargs, match", [
    ("Add", dict(broadcast=1), {}, r"'my_add'.*broadcast"),
    ("Relu", dict(alpha=1.0), {}, r"'my_relu'.*alpha"),
    ("MaxPool", dict(kernel_shape=[2, 2, 2]), {}, r"'my_maxpool'.*kernel_shape.*2-D"),
    ("MaxPool", dict(kernel_shape=[2, 2]), dict(outputs=("y", "indices")),
     r"'my_maxpool'.*Indices"),
    ("MaxPool", dict(kernel_shape=[2, 2], storage_order=1), dict(outputs=("y", "indices")),
     r"'my_maxpool'.*Indices"),
    ("MaxPool", {}, {}, r"'my_maxpool'.*kernel_shape"),
    ("MaxPool", dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", dilations=[2, 2]), {},
     r"'my_maxpool'.*dilations"),
    ("MaxPool", dict(kernel_shape=[3, 3], auto_pad="VALID", ceil_mode=1), {},
     r"'my_maxpool'.*ceil_mode"),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[0, 1]), {}, r"'my_maxpool'.*strides"),
    ("AveragePool", dict(kernel_shape=[3, 3], auto_pad="SAME", pads=[1, 1, 1, 1]), {},
     r"'my_averagepool'.*auto_pad"),
    ("AveragePool", dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", pads=[1, 1, 1, 1]), {},
     r"'my_averagepool'.*pads"),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[3, 0, 0, 0]), {}, r"'my_averagepool'.*pads"),
    ("AveragePool", dict(kernel_shape=[3, 3], dilations=[2, 2]), {},
     r"'my_averagepool'.*dilations"),
    ("AveragePool", dict(kernel_shape=[3, 3], count_include_pad=2), {},
     r"'my_averagepool'.*count_include_pad"),
    ("GlobalAveragePool", dict(p=2), {}, r"'my_globalaveragepool'.*'p'"),
    ("LRN", dict(alpha=1.0), {}, r"'my_lrn'.*size"),
    ("Concat", {}, {}, r"'my_concat'.*axis"),
    ("Constant", dict(value_string="x"), dict(inputs=()), r"'my_constant'.*value_string"),
    ("Constant", dict(value_int=1, value_float=1.0), dict(inputs=()), r"'my_constant'.*exactly"),
    ("ConstantOfShape", dict(value=numpy_helper.from_array(np.zeros(2, np.float32))), {},
     r"'my_constantofshape'.*value"),
    ("Flatten", dict(axes=1), {}, r"'my_flatten'.*axes"),
    ("Reshape", {}, {}, r"'my_reshape'.*input 1 \(shape\) is missing"),
    ("Transpose", dict(perm=[0, 0, 1]), {}, r"'my_transpose'.*perm"),
    ("Unsqueeze", {}, dict(opset=11), r"'my_unsqueeze'.*axes"),
    ("Unsqueeze", {}, {}, r"'my_unsqueeze'.*input 1 \(axes\) is missing"),
    ("Unsqueeze", dict(axes=[1]), {}, r"'my_unsqueeze'.*axes"),    # an attribute at opset 13
    ("Unsqueeze", dict(axes=[1, 1]), dict(opset=11), r"'my_unsqueeze'.*distinct"),
    ("Gemm", dict(broadcast=1), dict(inputs=("a", "b")), r"'my_gemm'.*broadcast"),
    ("Softmax", dict(axes=1), {}, r"'my_softmax'.*axes"),
    ("Dropout", dict(is_test=1), {}, r"'my_dropout'.*is_test"),
    ("Dropout", {}, dict(opset=10, outputs=("y", "mask")), r"'my_dropout'.*mask.*opset 12"),
])
def test_refused_at_load(op, attrs, kwargs, match):
    with pytest.raises(UnsupportedModel, match=match):
        build(op, attrs, **kwargs)


def test_refused_at_load_with_constants(rng):
    stats = _statistics(rng, 3)
    bn = dict(inputs=("x", "scale", "bias", "mean", "var"), constants=stats)
    with pytest.raises(UnsupportedModel, match=r"'my_batchnormalization'.*training_mode"):
        build("BatchNormalization", dict(training_mode=1), opset=15, **bn)
    with pytest.raises(UnsupportedModel, match=r"'my_batchnormalization'.*statistics"):
        build("BatchNormalization", {}, opset=9, outputs=("y", "mean_out", "var_out"), **bn)
    with pytest.raises(UnsupportedModel, match=r"'my_batchnormalization'.*spatial"):
        build("BatchNormalization", dict(spatial=0), opset=7, **bn)
    with pytest.raises(UnsupportedModel, match=r"'my_batchnormalization'.*input_var.*constant"):
        build("BatchNormalization", {}, inputs=("x", "scale", "bias", "mean", "v"),
              constants=stats)
    with pytest.raises(UnsupportedModel, match=r"'my_reshape'.*-1"):
        build("Reshape", inputs=("x", "s"), constants={"s": np.array([-1, -1], np.int64)})
    with pytest.raises(UnsupportedModel, match=r"'my_reshape'.*allowzero"):
        build("Reshape", dict(allowzero=1), opset=14, inputs=("x", "s"),
              constants={"s": np.array([0, -1], np.int64)})
    with pytest.raises(UnsupportedModel, match=r"'my_gemm'.*C of shape"):
        build("Gemm", inputs=("a", "b", "c"), constants={"b": np.ones((4, 5), np.float32),
                                                         "c": np.ones((3, 4), np.float32)})
    with pytest.raises(UnsupportedModel, match=r"'my_dropout'.*training_mode"):
        build("Dropout", opset=12, inputs=("x", "", "t"), constants={"t": np.array(True)})
    with pytest.raises(UnsupportedModel, match=r"'my_dropout'.*training_mode.*constant"):
        build("Dropout", opset=12, inputs=("x", "", "t"))


def test_refused_at_run_rather_than_wrong(rng):
    with pytest.raises(UnsupportedModel, match=r"'my_maxpool'.*4-D"):
        build("MaxPool", dict(kernel_shape=[2, 2]))(rand(rng, 1, 2, 3, 4, 5))
    with pytest.raises(UnsupportedModel, match=r"'my_averagepool'.*smaller than the window"):
        build("AveragePool", dict(kernel_shape=[4, 4]))(rand(rng, 1, 2, 3, 8))
    with pytest.raises(UnsupportedModel, match=r"'my_gemm'.*2-D"):
        build("Gemm", inputs=("a", "b"))(rand(rng, 4), rand(rng, 4, 2))
    with pytest.raises(ValueError):       # C may not enlarge A @ B
        build("Gemm", inputs=("a", "b", "c"))(rand(rng, 1, 4), rand(rng, 4, 2), rand(rng, 3, 2))
    # dtypes the compiled kernels have no code for, or an operator no meaning for
    half = rand(rng, 1, 2, 5, 5).astype(np.float16)
    for op, attrs in (("MaxPool", dict(kernel_shape=[2, 2])),
                      ("AveragePool", dict(kernel_shape=[2, 2])), ("GlobalAveragePool", {}),
                      ("GlobalMaxPool", {}), ("LRN", dict(size=3))):
        with pytest.raises(UnsupportedModel, match=rf"'my_{op.lower()}'.*float16"):
            build(op, attrs)(half)
    affine = AffineStep(Node("BatchNormalization", "my_bn", ["x"], ["y"]), 2)
    with pytest.raises(UnsupportedModel, match=r"'my_bn'.*float16"):
        affine(half)
    with pytest.raises(UnsupportedModel, match=r"'my_averagepool'.*int32"):
        build("AveragePool", dict(kernel_shape=[2, 2]))(np.ones((1, 2, 5, 5), np.int32))
    with pytest.raises(UnsupportedModel, match=r"'my_globalaveragepool'.*\(1, 2, 0, 3\)"):
        build("GlobalAveragePool")(np.ones((1, 2, 0, 3), np.float32))
