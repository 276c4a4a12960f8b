"""cso.onnx's operators beyond the first set (elementwise arithmetic, comparisons, Cast, MatMul,
the reductions, shape arithmetic and indexing, Pad, Resize, LayerNormalization): each against
onnxruntime (and the onnx reference evaluator where it follows the specification) on one-node
models, over its attributes and opset forms, and the load-time refusals."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from bench.models import onnxruntime_session  # noqa: E402
from cso.onnx.node import UnsupportedModel  # noqa: E402

from .onnx_models import build, check  # noqa: E402


def rand(rng, *shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape), dtype)


def ints(rng, *shape, low=-9, high=10, dtype=np.int64):
    return rng.integers(low, high, shape).astype(dtype)


def i64(*values):
    return np.array(values, np.int64)


# --- elementwise arithmetic ----------------------------------------------------------------

SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((1, 3, 1), (2, 1, 5)), ((4,), ()),
          ((), (2, 3)), ((0, 3), (1, 3))]


@pytest.mark.parametrize("op", ["Sub", "Div", "Pow"])
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("opset", [7, 13, 15])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_arithmetic(op, shapes, opset, dtype, rng):
    a, b = rand(rng, *shapes[0], dtype=dtype), rand(rng, *shapes[1], dtype=dtype)
    if op == "Pow":
        a = np.asarray(np.abs(a) + 0.5, dtype)     # real powers
    (y,) = check(op, {"a": a, "b": b}, opset=opset)
    assert y.dtype == dtype


def test_binary_with_a_constant_operand(rng):
    x = rand(rng, 2, 3)
    (y,) = check("Sub", {"x": x}, constants={"c": np.float32(1.5)})
    np.testing.assert_array_equal(y, x - np.float32(1.5))
    check("Div", {"x": x}, constants={"c": rand(rng, 3)})


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_division_truncates_toward_zero(dtype, rng):
    a = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, -4, 5, 5], dtype)
    (y,) = check("Div", {"a": a, "b": b}, engines=("ort",))
    np.testing.assert_array_equal(y, [3, -3, -3, 3, 0, 2, 1, 0, 0])
    check("Div", {"a": ints(rng, 3, 4, dtype=dtype), "b": ints(rng, 4, low=1, dtype=dtype)},
          engines=("ort",))
    with pytest.raises(UnsupportedModel, match="'my_div'.*by zero"):
        build("Div", inputs=("a", "b"))(a, np.zeros_like(b))


def test_pow_exponent_types(rng):
    x = np.abs(rand(rng, 2, 5)) + 0.1
    # a float base to an integer (or double) exponent: the output is the base's type (opset 12+)
    (y,) = check("Pow", {"x": x, "e": ints(rng, 5, low=-3, high=4)}, opset=15)
    assert y.dtype == np.float32
    check("Pow", {"x": x, "e": np.array([2.0, 0.5], np.float64).reshape(2, 1)}, opset=15)
    (y,) = check("Pow", {"x": x}, opset=13, constants={"e": np.float32(2)})
    np.testing.assert_allclose(y, x * x, rtol=1e-6)
    # integers, negative exponents truncated as 1 / x ** -y
    base = np.array([2, -2, 3, 1, -1, -1, 2, 0], np.int64)
    exponent = np.array([3, 3, 0, -2, -3, -2, -1, 2], np.int64)
    (y,) = check("Pow", {"x": base, "e": exponent}, opset=15, engines=("ort",))
    np.testing.assert_array_equal(y, [8, -8, 1, 1, -1, 1, 0, 0])
    check("Pow", {"x": ints(rng, 3, 4, low=-5, high=6), "e": ints(rng, 4, low=0, high=4)},
          opset=15)


UNARY = {"Neg": np.negative, "Abs": np.abs, "Sign": np.sign, "Sqrt": np.sqrt, "Exp": np.exp,
         "Log": np.log, "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil,
         "Round": np.round}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opset", [6, 13])
def test_unary(op, dtype, opset, rng):
    if op in ("Sign", "Round") and opset < 11:
        opset = 11
    x = (rand(rng, 3, 4, 5, dtype=dtype) * 3).astype(dtype)
    # the edges of the domains: zero, negative zero, halves (Round: to even), inf, NaN
    edges = np.array([0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, np.inf, -np.inf, np.nan], dtype)
    for data in (x, edges, x[:0]):
        (y,) = check(op, {"x": data}, opset=opset)
        assert y.dtype == dtype
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(y, UNARY[op](data).astype(dtype))


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_unary_integers(op, dtype, rng):
    (y,) = check(op, {"x": ints(rng, 3, 5, dtype=dtype)})
    assert y.dtype == dtype


@pytest.mark.parametrize("op", ["Min", "Max", "Mean"])
@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3), (2, 3)], [(1, 3), (2, 1), (3,)],
                                    [(4, 1, 3), (2, 3), (1,), (4, 2, 3)]])
@pytest.mark.parametrize("opset", [8, 13])
def test_variadic(op, shapes, opset, rng):
    feeds = {f"x{i}": rand(rng, *shape) for i, shape in enumerate(shapes)}
    # the reference evaluator's Mean adds in place into its first input, which cannot broadcast
    broadcast = len({shape for shape in shapes}) > 1
    (y,) = check(op, feeds, opset=opset,
                 engines=("ort",) if op == "Mean" and broadcast else ("ort", "reference"))
    if len(shapes) == 1:
        np.testing.assert_array_equal(y, feeds["x0"])


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_min_max_integers(op, rng):
    check(op, {"a": ints(rng, 3, 4, dtype=np.int32), "b": ints(rng, 4, dtype=np.int32)})
    check(op, {"a": ints(rng, 3, 4), "b": ints(rng, 4), "c": ints(rng, 1, 1)})


@pytest.mark.parametrize("op, function", [
    ("Equal", np.equal), ("Less", np.less), ("Greater", np.greater),
    ("LessOrEqual", np.less_equal), ("GreaterOrEqual", np.greater_equal)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_comparisons(op, function, dtype, rng):
    a = ints(rng, 3, 4, low=-3, high=3).astype(dtype)
    b = ints(rng, 4, low=-3, high=3).astype(dtype)
    (y,) = check(op, {"a": a, "b": b}, opset=16)
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, function(a, b))


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op, rng):
    a, b = rng.random((3, 4)) < 0.5, rng.random((4,)) < 0.5
    check(op, {"a": a, "b": b})
    check("Not", {"x": a})


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_where(dtype, rng):
    condition = rng.random((2, 1, 4)) < 0.5
    a, b = ints(rng, 3, 4).astype(dtype), ints(rng, 2, 3, 1).astype(dtype)
    (out,) = check("Where", {"c": condition, "a": a, "b": b}, opset=16)
    assert out.shape == (2, 3, 4) and out.dtype == dtype
    np.testing.assert_array_equal(out, np.where(condition, a, b))
    check("Where", {"c": condition, "a": a, "b": b}, opset=9)
    check("Where", {"c": condition}, constants={"a": a, "b": b}, opset=16)


CASTS = [np.float32, np.float64, np.int32, np.int64, np.bool_, np.float16, np.uint8, np.int8]


@pytest.mark.parametrize("source", [np.float32, np.float64, np.int64, np.int32, np.bool_])
@pytest.mark.parametrize("target", CASTS)
@pytest.mark.parametrize("opset", [9, 13, 19])
def test_cast(source, target, opset, rng):
    x = rand(rng, 3, 5) * 4
    x[0, :3] = [-2.7, 2.7, -0.0]                  # truncated toward zero
    if np.dtype(target).kind in "ub" or np.dtype(source).kind == "u":
        x = np.abs(x)
    x = x.astype(source)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    (y,) = check("Cast", {"x": x}, dict(to=to), opset=opset)
    assert y.dtype == target
    if source == np.float32 and target == np.int64:
        np.testing.assert_array_equal(y[0, :3], [-2, 2, 0])


def test_cast_same_type_and_saturate(rng):
    x = rand(rng, 4)
    (y,) = check("Cast", {"x": x}, dict(to=1))
    np.testing.assert_array_equal(y, x)
    # (onnxruntime refuses saturate on a cast to a type other than float 8, which it ignores)
    check("Cast", {"x": x}, dict(to=7, saturate=0), opset=19, engines=("reference",))


def test_cast_like(rng):
    x = rand(rng, 3, 4) * 10
    (y,) = check("CastLike", {"x": x}, opset=15, constants={"t": np.zeros(0, np.int32)})
    assert y.dtype == np.int32
    (y,) = check("CastLike", {"x": x, "t": np.zeros(2, np.float64)}, opset=15)
    assert y.dtype == np.float64


# --- MatMul --------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 6)), ((2, 3, 4), (4, 6)),
                                    ((3, 4), (2, 4, 1)), ((0, 4), (4, 3)), ((3, 0), (0, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul(shapes, dtype, rng):
    a, b = rand(rng, *shapes[0], dtype=dtype), rand(rng, *shapes[1], dtype=dtype)
    (y,) = check("MatMul", {"a": a, "b": b}, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)
    check("MatMul", {"a": a}, constants={"b": b}, opset=9, rtol=1e-5, atol=1e-5)


def test_matmul_of_a_strided_stack_by_a_matrix(rng):
    """Channels-last rows (a Transpose's view) by one matrix: one GEMM of every row."""
    a = rand(rng, 2, 16, 5, 7).transpose(0, 2, 3, 1)
    b = rand(rng, 16, 9)
    (y,) = build("MatMul", inputs=("a", "b"))(a, b)
    assert y.shape == (2, 5, 7, 9) and y.flags.c_contiguous
    np.testing.assert_allclose(y, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)
    assert a.base is not None and not a.flags.c_contiguous   # the input left as it was


def test_matmul_integers_and_mismatch(rng):
    check("MatMul", {"a": ints(rng, 2, 3, 4), "b": ints(rng, 4, 2)})
    with pytest.raises(UnsupportedModel, match="'my_matmul'.*do not multiply"):
        build("MatMul", inputs=("a", "b"))(rand(rng, 3, 4), rand(rng, 5, 2))
    with pytest.raises(UnsupportedModel, match="'my_matmul'.*scalars"):
        build("MatMul", inputs=("a", "b"))(np.float32(1), rand(rng, 5, 2))


# --- reductions ----------------------------------------------------------------------------

REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
AXES = [None, [1], [-1], [0, 2], [-1, 0, 1]]


def _reduce(op, x, axes, keepdims, opset, **kwargs):
    attrs = {} if keepdims is None else dict(keepdims=keepdims)
    moved = 13 if op == "ReduceSum" else 18
    if opset < moved:
        if axes is not None:
            attrs["axes"] = axes
        return check(op, {"x": x}, attrs, opset=opset, **kwargs)
    constants = {} if axes is None else {"axes": i64(*axes)}
    return check(op, {"x": x}, attrs, opset=opset, constants=constants, **kwargs)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [None, 0, 1])
@pytest.mark.parametrize("opset", [11, 13, 18])
def test_reductions(op, axes, keepdims, opset, rng):
    x = rand(rng, 3, 4, 5)
    if op in ("ReduceLogSum", "ReduceL2"):
        x = np.abs(x) + 0.1
    if op == "ReduceProd":
        x = x / 2 + np.sign(x)       # no underflow
    (y,) = _reduce(op, x, axes, keepdims, opset, rtol=2e-6, atol=1e-6)
    assert y.dtype == np.float32
    reduced = range(3) if axes is None else [a % 3 for a in axes]
    assert y.ndim == (3 if keepdims in (None, 1) else 3 - len(set(reduced)))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd", "ReduceSumSquare", "ReduceL1"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reductions_of_integers_keep_their_dtype(op, dtype, rng):
    x = ints(rng, 3, 4, 2, low=-4, high=5, dtype=dtype)
    # the integer mean truncates toward zero (onnxruntime's; the reference averages in floats),
    # and the reference's ReduceSumSquare of int32 is int64
    engines = ("ort",) if op in ("ReduceMean", "ReduceSumSquare") else ("ort", "reference")
    (y,) = _reduce(op, x, [1], 0, 13, engines=engines)
    assert y.dtype == dtype


@pytest.mark.parametrize("opset", [13, 18])
def test_reduction_of_float64_and_a_scalar(opset, rng):
    _reduce("ReduceMean", rand(rng, 2, 7, dtype=np.float64), [-1], 1, opset)
    (y,) = _reduce("ReduceSum", np.array(2.5, np.float32), None, 0, opset)
    assert y.shape == () and y == 2.5


@pytest.mark.parametrize("op", REDUCTIONS)
def test_noop_with_empty_axes(op, rng):
    """No axes and noop_with_empty_axes=1: the operation over no axis, elementwise."""
    x = rand(rng, 2, 3)
    opset = 13 if op == "ReduceSum" else 18
    for constants in ({}, {"axes": np.zeros(0, np.int64)}):
        (y,) = check(op, {"x": x}, dict(noop_with_empty_axes=1), opset=opset,
                     constants=constants)
        if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd", "ReduceLogSumExp"):
            np.testing.assert_allclose(y, x, rtol=1e-6)
        elif op in ("ReduceL1", "ReduceL2"):
            np.testing.assert_allclose(y, np.abs(x), rtol=1e-6)
        (y,) = check(op, {"x": x}, dict(noop_with_empty_axes=0, keepdims=0), opset=opset,
                     constants=constants)
        assert y.shape == ()


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum"])
def test_reduction_axes_made_at_run_time(op, rng):
    x = rand(rng, 3, 4, 5)
    opset = 13 if op == "ReduceSum" else 18
    (y,) = check(op, {"x": x, "axes": i64(-1, 0)}, dict(keepdims=0), opset=opset)
    assert y.shape == (4,)


@pytest.mark.parametrize("op, identity", [("ReduceSum", 0), ("ReduceMax", -np.inf),
                                          ("ReduceMin", np.inf), ("ReduceProd", 1),
                                          ("ReduceSumSquare", 0), ("ReduceLogSumExp", -np.inf)])
def test_reduction_over_no_elements_is_its_identity(op, identity):
    x = np.zeros((2, 0, 3), np.float32)
    (y,) = check(op, {"x": x}, dict(keepdims=0), opset=18, constants={"axes": i64(1)},
                 engines=("reference",))
    np.testing.assert_array_equal(y, np.full((2, 3), identity, np.float32))


def _jobs(run, *args, **kwargs):
    """(``run``'s outputs, how many compiled jobs it ran)."""
    from cso.jobs import Recording
    with Recording() as recording:
        outputs = run(*args, **kwargs)
    return outputs, len(recording)


SPATIAL = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max}


@pytest.mark.parametrize("op", list(SPATIAL))
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [-1, -2], [-2, 3]])
@pytest.mark.parametrize("keepdims", [None, 0, 1])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_over_the_spatial_axes_run_the_global_pool(op, axes, keepdims, opset, dtype,
                                                              rng):
    """Over axes 2 and 3 of a 4-D float tensor, however spelled (an attribute or an input,
    negative), one compiled job, against onnxruntime, the reference and float64 NumPy; NaN
    gives NaN (ReduceMax too, as NumPy's max); odd planes, of one pixel."""
    for shape in ((2, 3, 5, 7), (1, 4, 1, 1), (1, 2, 13, 11)):
        x = rand(rng, *shape, dtype=dtype)
        x[0, 1, 0, -1] = np.nan
        # (onnxruntime's ReduceMax skips NaN; the reference's, NumPy's and ours give NaN)
        engines = ("reference",) if op == "ReduceMax" else ("ort", "reference")
        (y,), jobs = _jobs(_reduce, op, x, axes, keepdims, opset, rtol=2e-6, atol=1e-6,
                           engines=engines)
        assert jobs == 1   # (onnxruntime and the reference run none)
        expected = SPATIAL[op](x.astype(np.float64), axis=(2, 3), keepdims=keepdims != 0)
        np.testing.assert_allclose(y, expected, rtol=1e-6 if dtype == np.float32 else 1e-13)
        assert y.dtype == dtype and np.isnan(y[0, 1]).all() and np.isfinite(y[1:, 2:]).all()


def _spatial_reduce(op, keepdims=1, axes=(2, 3)):
    """The operator ``op`` (opset 18) over constant ``axes``, as a model's step calls it."""
    return build(op, dict(keepdims=keepdims), opset=18, inputs=("x", "a"),
                 constants={"a": i64(*axes)})


@pytest.mark.parametrize("op", list(SPATIAL))
def test_spatial_reductions_are_jobs_into_out_or_buffers(op, rng):
    """The compiled pool is one job writing ``out=`` (a Concat's channels) or an array of
    ``buffers=``; other axes, dtypes, layouts and empty tensors run NumPy (no job), into
    ``out=`` too."""
    from cso.buffers import Buffers
    run = _spatial_reduce(op)
    x = rand(rng, 1, 3, 6, 5)
    want = SPATIAL[op](x, axis=(2, 3), keepdims=True)
    (y,), jobs = _jobs(run, x, None)
    assert jobs == 1 and isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    block = np.full((1, 5, 1, 1), 7, np.float32)
    (y,), jobs = _jobs(run, x, None, out=block[:, 1:4])
    assert jobs == 1 and y.base is block
    np.testing.assert_allclose(block[0, 1:4], want[0], rtol=1e-6)
    assert block[0, 0] == block[0, 4] == 7
    buffers = Buffers()
    (y,), jobs = _jobs(run, x, None, buffers=buffers)
    assert jobs == 1 and buffers.owns(y)
    with pytest.raises(UnsupportedModel, match=r"out= of shape \(1, 3\)"):
        run(x, None, out=np.empty((1, 3), np.float32))
    others = [(x[:, :, ::2], run), (x.astype(np.float16), run), (np.zeros((0, 3, 2, 2)), run),
              (np.zeros((1, 3, 0, 2)), run), (x, _spatial_reduce(op, axes=(1, 2, 3))),
              (x, _spatial_reduce(op, axes=(3,))), (x[0], _spatial_reduce(op, axes=(1, 2)))]
    if op != "ReduceMean":
        others.append((ints(rng, 1, 3, 4, 5), run))
    for value, other in others:
        (y,), jobs = _jobs(other, value, None)
        assert jobs == 0 and isinstance(y, np.ndarray) and y.dtype == value.dtype
    block = np.full((1, 5, 1, 1), 7, np.float16)
    (y,), jobs = _jobs(run, x.astype(np.float16), None, out=block[:, 1:4])
    assert jobs == 0 and y.base is block
    np.testing.assert_allclose(block[0, 1:4], want[0].astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("op, identity", [("ReduceMean", np.nan), ("ReduceSum", 0),
                                          ("ReduceMax", -np.inf)])
def test_spatial_reductions_of_empty_planes(op, identity):
    (y,) = _spatial_reduce(op, keepdims=0)(np.zeros((2, 3, 0, 4), np.float32), None)
    np.testing.assert_array_equal(y, np.full((2, 3), identity, np.float32))
    (y,) = _spatial_reduce(op, keepdims=0)(np.zeros((0, 3, 2, 4), np.float32), None)
    assert y.shape == (0, 3)


def test_spatial_reduction_of_axes_made_at_run_time_is_not_replayed(rng):
    """Axes made at run time run the kernel, but the step does not count as jobs alone (a
    replay would keep the recorded run's axes)."""
    node_axes = build("ReduceMean", opset=18, inputs=("x", "a"))
    x = rand(rng, 1, 3, 4, 5)
    (y,), jobs = _jobs(node_axes, x, i64(-1, 2))
    assert jobs == 1 and getattr(node_axes, "jobs_only", True) is False
    np.testing.assert_allclose(y, x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    assert _spatial_reduce("ReduceMean").jobs_only


# --- shape arithmetic and indexing ---------------------------------------------------------

@pytest.mark.parametrize("attrs", [{}, dict(start=1), dict(end=-1), dict(start=-3, end=3),
                                   dict(start=-10), dict(end=10), dict(start=3, end=1),
                                   dict(start=4)])
def test_shape(attrs, rng):
    x = rand(rng, 2, 3, 4, 5)
    (y,) = check("Shape", {"x": x}, attrs, opset=15)
    assert y.dtype == np.int64
    if not attrs:
        check("Shape", {"x": x}, opset=13)
        np.testing.assert_array_equal(y, [2, 3, 4, 5])


def test_size(rng):
    (y,) = check("Size", {"x": rand(rng, 2, 3, 4)})
    assert y.shape == () and y == 24
    check("Size", {"x": rand(rng, 0, 3)})


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("indices", [np.array(1), i64(-1), i64(0, 2, -2, 1),
                                     np.array([[0, -1], [1, 1]], np.int32)])
@pytest.mark.parametrize("constant", [True, False])
def test_gather(axis, indices, constant, rng):
    x = rand(rng, 3, 4, 5)
    kwargs = dict(constants={"i": indices}) if constant else {}
    feeds = {"x": x} if constant else {"x": x, "i": indices}
    (y,) = check("Gather", feeds, dict(axis=axis), inputs=("x", "i"), exact=True, **kwargs)
    np.testing.assert_array_equal(y, np.take(x, indices, axis=axis))
    check("Gather", feeds, dict(axis=axis), opset=11, inputs=("x", "i"), exact=True, **kwargs)


@pytest.mark.parametrize("batch_dims,data_shape,indices", [
    (0, (3, 4), [[1, 2], [-1, 0]]),            # elements
    (0, (3, 4, 5), [[2], [0], [-3]]),          # slices
    (0, (3, 4, 5), [[[1, 3, 4]], [[0, 0, 0]]]),
    (1, (2, 3, 4), [[1], [2]]),                # a row of each batch
    (1, (2, 3, 4), [[[0, 1], [2, 3]], [[1, -1], [0, 0]]]),
    (2, (2, 3, 4, 5), np.zeros((2, 3, 1, 2), np.int64)),
])
@pytest.mark.parametrize("constant", [True, False])
def test_gather_nd(batch_dims, data_shape, indices, constant, rng):
    x, indices = rand(rng, *data_shape), np.array(indices, np.int64)
    kwargs = dict(constants={"i": indices}) if constant else {}
    feeds = {"x": x} if constant else {"x": x, "i": indices}
    check("GatherND", feeds, dict(batch_dims=batch_dims), opset=12, inputs=("x", "i"),
          exact=True, **kwargs)
    if not batch_dims:
        check("GatherND", feeds, opset=11, inputs=("x", "i"), exact=True, **kwargs)


def test_gather_nd_refuses_what_does_not_index(rng):
    run = build("GatherND", dict(batch_dims=1), opset=12, inputs=("x", "i"))
    with pytest.raises(UnsupportedModel, match="'my_gathernd'.*out of range"):
        run(rand(rng, 2, 3), np.array([[3], [0]], np.int64))
    with pytest.raises(UnsupportedModel, match="'my_gathernd'.*do not index"):
        run(rand(rng, 2, 3), np.array([[0, 1], [0, 1]], np.int64))
    with pytest.raises(UnsupportedModel, match="'my_gathernd'.*do not index"):
        run(rand(rng, 2, 3), np.zeros((3, 1), np.int64))


def test_gather_of_a_shape(rng):
    # the shape code of the exporters: a dimension of a Shape, as a scalar
    (y,) = check("Gather", {"s": i64(2, 3, 4, 5)}, constants={"i": np.array(0, np.int64)})
    assert y.shape == () and y == 2
    with pytest.raises(UnsupportedModel, match="'my_gather'.*out of range"):
        build("Gather", inputs=("x", "i"), constants={"i": i64(4)})(rand(rng, 4, 2))


@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 3], [3, -4]])
def test_squeeze(axes, rng):
    x = rand(rng, 1, 3, 4, 1)
    attrs = {} if axes is None else dict(axes=axes)
    # the reference evaluator squeezes the axes one after the other
    engines = ("ort",) if axes == [3, -4] else ("ort", "reference")
    check("Squeeze", {"x": x}, attrs, opset=11, exact=True, engines=engines)
    constants = {} if axes is None else {"axes": i64(*axes)}
    (y,) = check("Squeeze", {"x": x}, opset=13, constants=constants, exact=True,
                 engines=engines)
    assert y.shape == ((3, 4) if axes is None or len(axes) == 2
                       else (3, 4, 1) if axes == [0] else (1, 3, 4))
    if axes is not None:
        check("Squeeze", {"x": x, "axes": i64(*axes)}, opset=13, exact=True, engines=engines)
    with pytest.raises(UnsupportedModel, match="'my_squeeze'.*length 1"):
        build("Squeeze", opset=13, inputs=("x", "a"), constants={"a": i64(1)})(x)


SLICES = [  # starts, ends, axes, steps
    ([1], [3], None, None),
    ([0, 1], [2, -1], [0, 2], None),
    ([-2], [10_000], [-1], None),
    ([-100], [100], [1], None),
    ([3], [0], [1], [-1]),
    ([-1], [-10_000], [2], [-2]),
    ([9223372036854775807], [-9223372036854775808], [0], [-1]),
    ([4, 1], [0, 3], [2, 0], [-3, 2]),
    ([2], [1], [1], None),                              # empty
    ([0, 0, 0], [1, 1, 1], None, [1, 1, 1]),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
@pytest.mark.parametrize("opset", [10, 13])
def test_slice(starts, ends, axes, steps, opset, rng):
    x = rand(rng, 3, 4, 6)
    constants = {"starts": i64(*starts), "ends": i64(*ends)}
    inputs = ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        constants["axes"] = i64(*(axes if axes is not None else range(len(starts))))
        inputs.append("axes")
    if steps is not None:
        constants["steps"] = i64(*steps)
        inputs.append("steps")
    check("Slice", {"x": x}, opset=opset, inputs=inputs, constants=constants, exact=True)
    # the same, made at run time
    check("Slice", dict({"x": x}, **constants), opset=opset, inputs=inputs, exact=True)
    if steps is None and opset == 10:
        attrs = dict(starts=starts, ends=ends) | ({} if axes is None else dict(axes=axes))
        if min(axes or [0]) >= 0:
            check("Slice", {"x": x}, attrs, opset=9, exact=True)


def test_slice_omitted_axes_with_steps_and_int32(rng):
    x = rand(rng, 5, 6)
    check("Slice", {"x": x}, opset=13, inputs=("x", "s", "e", "", "st"), exact=True,
          constants={"s": np.array([4, 0], np.int32), "e": np.array([0, 6], np.int32),
                     "st": np.array([-1, 2], np.int32)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_opsets(axis, rng):
    x = rand(rng, 6, 6, 4)
    outputs = ("a", "b", "c")
    sizes = [1, 2, 3] if axis != -1 else [1, 1, 2]
    # equal parts (no split given)
    check("Split", {"x": x}, dict(axis=axis), opset=11, outputs=outputs[:2], exact=True)
    check("Split", {"x": x}, dict(axis=axis), opset=13, outputs=outputs[:2], exact=True)
    # split as an attribute, then as an input (constant or not)
    check("Split", {"x": x}, dict(axis=axis, split=sizes), opset=11, outputs=outputs, exact=True)
    check("Split", {"x": x}, dict(axis=axis), opset=13, outputs=outputs, exact=True,
          constants={"split": i64(*sizes)})
    check("Split", {"x": x, "split": i64(*sizes)}, dict(axis=axis), opset=18, outputs=outputs,
          exact=True)
    check("Split", {"x": x}, dict(axis=axis, split=[0, 6 if axis != -1 else 4]), opset=2,
          outputs=outputs[:2], exact=True, engines=("ort",))


@pytest.mark.parametrize("length, count", [(6, 3), (7, 3), (5, 2), (10, 4), (3, 3)])
def test_split_num_outputs(length, count, rng):
    x = rand(rng, 2, length)
    outputs = tuple(f"y{i}" for i in range(count))
    ys = check("Split", {"x": x}, dict(axis=1, num_outputs=count), opset=18, outputs=outputs,
               exact=True)
    chunk = -(-length // count)
    assert [y.shape[1] for y in ys] == [chunk] * (count - 1) + [length - chunk * (count - 1)]


@pytest.mark.parametrize("shape, target", [((3, 1), (2, 3, 4)), ((3, 4), (1, 1)),
                                           ((1,), (2, 3)), ((2, 1, 4), (3, 1)), ((), (2,)),
                                           ((3, 1), (3, 0))])
def test_expand(shape, target, rng):
    x = rand(rng, *shape)
    (y,) = check("Expand", {"x": x}, constants={"s": i64(*target)}, exact=True)
    assert y.shape == np.broadcast_shapes(shape, target)
    check("Expand", {"x": x, "s": i64(*target)}, opset=8, exact=True)
    check("Expand", {"x": ints(rng, *shape)}, constants={"s": i64(*target)})


@pytest.mark.parametrize("shape, repeats", [((2, 3), (1, 2)), ((2, 3), (3, 1)), ((3,), (0,)),
                                            ((2, 1, 2), (2, 2, 2))])
def test_tile(shape, repeats, rng):
    x = rand(rng, *shape)
    check("Tile", {"x": x}, constants={"r": i64(*repeats)}, exact=True)
    check("Tile", {"x": x, "r": i64(*repeats)}, opset=6, exact=True)


@pytest.mark.parametrize("start, limit, delta", [(0, 5, 1), (2, 11, 3), (10, 2, -3), (5, 5, 1),
                                                 (5, 0, 1), (-4, 4, 2)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64])
def test_range(start, limit, delta, dtype):
    feeds = {name: np.array(value, dtype) for name, value in
             (("start", start), ("limit", limit), ("delta", delta))}
    (y,) = check("Range", feeds, opset=11, exact=True)
    np.testing.assert_array_equal(y, np.arange(start, limit, delta))
    feeds = {"start": np.array(0.5, dtype), "limit": np.array(3.0, dtype),
             "delta": np.array(0.25, dtype)} if dtype in (np.float32, np.float64) else feeds
    check("Range", {}, opset=11, constants=feeds, inputs=("start", "limit", "delta"), exact=True)


def test_concat_of_shapes_and_reshape_of_them(rng):
    """The exporters' shape code: the batch of a Shape, with -1, as a Reshape's shape."""
    check("Concat", {"a": i64(2), "b": i64(-1)}, dict(axis=0), exact=True)
    check("Concat", {"a": i64(2, 3), "b": np.zeros(0, np.int64)}, dict(axis=-1), exact=True)


def test_constant_of_shape_from_a_shape():
    (y,) = check("ConstantOfShape", {"s": i64(2, 3)}, dict(
        value=numpy_helper.from_array(np.array([7], np.int64))), exact=True)
    assert y.dtype == np.int64
    (y,) = check("ConstantOfShape", {"s": np.zeros(0, np.int64)}, exact=True)
    assert y.shape == ()


# --- Pad -----------------------------------------------------------------------------------

PADS = [[1, 2, 0, 2, 1, 0], [0, 0, 0, 0, 0, 0], [2, 0, 1, 0, 3, 2], [-1, 1, 0, 1, -2, 3],
        [0, -1, -2, 0, 2, -1]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("opset", [2, 11, 13, 18])
def test_pad(mode, pads, opset, rng):
    x = rand(rng, 3, 4, 5)
    # the reference evaluator pads before it crops, onnxruntime (and we) after
    engines = ("ort",) if min(pads) < 0 else ("ort", "reference")
    if opset < 11:
        attrs = dict(mode=mode, pads=pads) | (dict(value=1.5) if mode == "constant" else {})
        check("Pad", {"x": x}, attrs, opset=opset, exact=True, engines=engines)
        return
    constants = {"pads": i64(*pads)}
    inputs = ["x", "pads"]
    if mode == "constant":
        constants["value"] = np.array(-2.5, np.float32)
        inputs.append("value")
    check("Pad", {"x": x}, dict(mode=mode), opset=opset, inputs=inputs, constants=constants,
          exact=True, engines=engines)
    check("Pad", dict({"x": x}, **constants), dict(mode=mode), opset=opset, inputs=inputs,
          exact=True, engines=engines)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_axes_and_wrap(mode, rng):
    x = ints(rng, 2, 3, 4)
    (y,) = check("Pad", {"x": x}, dict(mode=mode), opset=19, inputs=("x", "p", "", "a"),
                 constants={"p": i64(1, 2, 2, 0), "a": i64(-1, 1)}, exact=True)
    assert y.shape == (2, 5, 7)
    check("Pad", {"x": x}, dict(mode=mode), opset=19, inputs=("x", "p"),
          constants={"p": i64(0, -1, 2, 1, 1, -1)}, exact=True, engines=("ort",))
    if mode == "wrap":    # pads longer than the axis wrap around again
        check("Pad", {"x": x}, dict(mode=mode), opset=19, inputs=("x", "p"),
              constants={"p": i64(0, 4, 1, 0, 0, 9)}, exact=True, engines=("ort",))


def test_pad_opset_1_paddings(rng):
    x = rand(rng, 2, 3)
    (y,) = build("Pad", dict(paddings=[1, 0, 0, 2], value=7.0), opset=1)(x)
    np.testing.assert_array_equal(y, np.pad(x, ((1, 0), (0, 2)), constant_values=7))


def test_pad_refusals(rng):
    x = rand(rng, 3, 4)
    with pytest.raises(UnsupportedModel, match="'my_pad'.*reflect.*at most 3"):
        build("Pad", dict(mode="reflect"), inputs=("x", "p"),
              constants={"p": i64(0, 4, 0, 0)})(x)
    with pytest.raises(UnsupportedModel, match="'my_pad'.*crop more"):
        build("Pad", inputs=("x", "p"), constants={"p": i64(-2, 0, -2, 0)})(x)
    with pytest.raises(UnsupportedModel, match="'my_pad'.*mode='wrap'"):
        build("Pad", dict(mode="wrap"), opset=18, inputs=("x", "p"))
    with pytest.raises(UnsupportedModel, match="'my_pad'.*expected 4 values"):
        build("Pad", inputs=("x", "p"), constants={"p": i64(0, 1)})(x)


# --- Resize --------------------------------------------------------------------------------

COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
RESIZE_SCALES = [(1, 1, 2, 2), (1, 1, 0.5, 0.5), (1, 1, 1.7, 0.6), (1, 1, 3, 1),
                 (1, 1, 0.75, 2.5)]


def _resize(x, attrs, opset, scales=None, sizes=None, **kwargs):
    constants, inputs = {}, ["x", "roi" if opset < 13 else ""]
    if opset < 13:
        constants["roi"] = np.zeros(0, np.float32)
    if scales is not None:
        constants["scales"] = np.array(scales, np.float32)
        inputs.append("scales")
    else:
        if opset < 13:
            constants["scales"] = np.zeros(0, np.float32)
        inputs += ["scales" if opset < 13 else "", "sizes"]
        constants["sizes"] = i64(*sizes)
    return check("Resize", {"x": x}, attrs, opset=opset, inputs=inputs, constants=constants,
                 **kwargs)


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("scales", RESIZE_SCALES)
@pytest.mark.parametrize("opset", [11, 13, 18, 19])
def test_resize_nearest(coordinates, nearest_mode, scales, opset, rng):
    x = rand(rng, 2, 3, 5, 6)
    attrs = dict(mode="nearest", coordinate_transformation_mode=coordinates,
                 nearest_mode=nearest_mode)
    # the reference evaluator computes the coordinates in float64, onnxruntime (and we) in
    # float32: with scales such as 0.6 a coordinate that is an integer or a half in one is not
    # in the other, and floor, ceil or a tie can round it differently
    dyadic = all(float(np.float32(s)) * 4 == int(float(np.float32(s)) * 4) for s in scales)
    engines = ("ort", "reference") if coordinates != "align_corners" and dyadic else ("ort",)
    (y,) = _resize(x, attrs, opset, scales=scales, exact=True, engines=engines)
    assert y.shape == tuple(int(s * d) for s, d in zip(scales, x.shape))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("scales", RESIZE_SCALES)
@pytest.mark.parametrize("opset", [11, 13, 18])
def test_resize_linear_and_cubic(mode, coordinates, scales, opset, rng):
    x = rand(rng, 2, 3, 5, 6)
    attrs = dict(mode=mode, coordinate_transformation_mode=coordinates)
    # the reference evaluator's align_corners divides by the unrounded output length, and its
    # pytorch_half_pixel puts an output of length 1 at -0.5: onnxruntime follows the text
    engines = ("ort",) if coordinates == "align_corners" else ("ort", "reference")
    _resize(x, attrs, opset, scales=scales, rtol=1e-5, atol=2e-6, engines=engines)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [(2, 3, 10, 12), (2, 3, 3, 4), (2, 3, 1, 1), (2, 3, 7, 6)])
def test_resize_sizes(mode, sizes, rng):
    x = rand(rng, 2, 3, 5, 6)
    attrs = dict(mode=mode, coordinate_transformation_mode="pytorch_half_pixel")
    engines = ("ort",) if mode == "cubic" and min(sizes[2:]) < 5 else ("ort", "reference")
    if mode == "cubic" and sizes[2] == 1:
        engines = ("ort",)
    (y,) = _resize(x, attrs, 13, sizes=sizes, rtol=1e-5, atol=2e-6, engines=engines)
    assert y.shape == sizes
    _resize(x, dict(mode=mode), 11, sizes=sizes, rtol=1e-5, atol=2e-6,
            engines=("ort",) if mode == "cubic" and min(sizes[2:]) < 5 else ("ort", "reference"))


def test_resize_cubic_coefficient_and_exclude_outside(rng):
    x = rand(rng, 1, 2, 6, 5)
    for attrs in (dict(cubic_coeff_a=-0.5), dict(exclude_outside=1),
                  dict(cubic_coeff_a=-0.6, exclude_outside=1,
                       coordinate_transformation_mode="asymmetric")):
        _resize(x, dict(attrs, mode="cubic"), 13, scales=(1, 1, 2, 1.5), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_and_keep_aspect_ratio_policy(policy, mode, rng):
    x = rand(rng, 2, 3, 5, 6)
    attrs = dict(mode=mode, axes=[3, 2], keep_aspect_ratio_policy=policy)
    (y,) = check("Resize", {"x": x}, attrs, opset=18, inputs=("x", "", "", "sizes"),
                 constants={"sizes": i64(9, 8)}, rtol=1e-5, atol=2e-6)
    assert y.shape == {"stretch": (2, 3, 8, 9), "not_larger": (2, 3, 8, 9),
                       "not_smaller": (2, 3, 8, 10)}[policy]
    # negative axes (which onnxruntime's keep_aspect_ratio_policy and the reference evaluator
    # do not take)
    attrs["axes"] = [-1, -2]
    (negative,) = build("Resize", attrs, opset=18, inputs=("x", "", "", "sizes"),
                        constants={"sizes": i64(9, 8)})(x, None, None, None)
    np.testing.assert_array_equal(negative, y)
    check("Resize", {"x": x}, dict(mode=mode, axes=[3]), opset=18, inputs=("x", "", "s"),
          constants={"s": np.array([1.5], np.float32)}, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 0.5, 0.5), (1, 1, 0.3, 0.7), (1, 1, 2, 0.6)])
@pytest.mark.parametrize("coordinates", ["half_pixel", "pytorch_half_pixel"])
def test_resize_antialias(mode, scales, coordinates, rng):
    x = rand(rng, 1, 2, 12, 11)
    attrs = dict(mode=mode, antialias=1, coordinate_transformation_mode=coordinates)
    _resize(x, attrs, 18, scales=scales, rtol=1e-5, atol=2e-6)


def test_resize_half_pixel_symmetric(rng):
    x = rand(rng, 1, 2, 5, 7)
    for mode in ("nearest", "linear", "cubic"):
        attrs = dict(mode=mode, coordinate_transformation_mode="half_pixel_symmetric")
        # onnxruntime's nearest pixel for 0.6 rounds a source coordinate of 0.5000002 down;
        # the reference evaluator puts the first column of a halving (offset 0.5, source
        # 1.0) at 0
        engines = ("reference",) if mode == "nearest" else ("ort", "reference")
        _resize(x, attrs, 19, scales=(1, 1, 1.7, 0.6), rtol=1e-5, atol=2e-6, engines=engines)
        _resize(x, attrs, 19, scales=(1, 1, 2, 0.5), rtol=1e-5, atol=2e-6, engines=("ort",))
        _resize(x, attrs, 19, sizes=(1, 2, 8, 3), rtol=1e-5, atol=2e-6)


def test_resize_scales_made_at_run_time_and_other_ranks(rng):
    x = rand(rng, 1, 2, 4, 6)
    check("Resize", {"x": x, "scales": np.array([1, 1, 2, 0.5], np.float32)},
          dict(mode="linear"), opset=13, inputs=("x", "", "scales"), rtol=1e-5, atol=2e-6)
    # 3-D and 5-D inputs, an outer axis resized
    check("Resize", {"x": rand(rng, 2, 5, 6)}, dict(mode="linear"), opset=13,
          inputs=("x", "", "s"), constants={"s": np.array([1, 2, 0.5], np.float32)},
          rtol=1e-5, atol=2e-6)
    check("Resize", {"x": rand(rng, 1, 2, 3, 4, 5)}, dict(mode="nearest"), opset=13,
          inputs=("x", "", "s"), constants={"s": np.array([1, 2, 2, 1, 0.5], np.float32)},
          exact=True)
    # integers, nearest
    check("Resize", {"x": ints(rng, 1, 2, 3, 4, dtype=np.int32)}, dict(mode="nearest"),
          opset=13, inputs=("x", "", "s"), constants={"s": np.array([1, 1, 2, 2], np.float32)})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10_and_upsample(mode, rng):
    x = rand(rng, 1, 2, 3, 4)
    scales = np.array([1, 1, 2, 3], np.float32)
    kwargs = dict(rtol=1e-5, atol=2e-6, engines=("ort",))
    check("Resize", {"x": x}, dict(mode=mode), opset=10, constants={"s": scales}, **kwargs)
    check("Resize", {"x": x}, dict(mode=mode), opset=10,
          constants={"s": np.array([1, 1, 0.5, 0.75], np.float32)}, **kwargs)
    check("Upsample", {"x": x}, dict(mode=mode), opset=9, constants={"s": scales}, **kwargs)
    check("Upsample", {"x": x}, dict(mode=mode, scales=[1.0, 1.0, 2.0, 1.5]), opset=7,
          **kwargs)


# --- LayerNormalization --------------------------------------------------------------------

@pytest.mark.parametrize("shape, axis", [((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4, 5), -2),
                                         ((4, 7), 0), ((2, 5), -1)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_normalization(shape, axis, bias, dtype, rng):
    x = rand(rng, *shape, dtype=dtype) * 3 + 1
    normalized = shape[axis % len(shape):]
    constants = {"scale": rand(rng, *normalized, dtype=dtype)}
    if bias:
        constants["b"] = rand(rng, *normalized, dtype=dtype)
    attrs = dict(axis=axis, epsilon=1e-3)
    # float64 statistics for float64 (the reference evaluator has only float32's)
    stash, engines = ({}, ("ort", "reference")) if dtype == np.float32 else (
        dict(stash_type=11), ("ort",))
    (y,) = check("LayerNormalization", {"x": x}, attrs | stash, opset=17,
                 constants=constants, rtol=1e-5, atol=1e-5, engines=engines)
    assert y.dtype == dtype
    # Scale and B made at run time
    check("LayerNormalization", dict({"x": x}, **constants), attrs | stash, opset=17,
          rtol=1e-5, atol=1e-5, engines=engines)


def _layer_norm_reference(x, scale, bias, axis, epsilon):
    """LayerNormalization in float64 NumPy."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    double = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        centred = double - double.mean(axis=axes, keepdims=True)
        return centred / np.sqrt(np.mean(centred ** 2, axis=axes, keepdims=True) + epsilon) \
            * scale + (0 if bias is None else bias)


@pytest.mark.parametrize("shape, axis", [((2, 5, 1), -1), ((3, 3), 1), ((2, 4, 17), -1),
                                         ((1, 7, 7, 96), 3), ((1, 2, 768), -1),
                                         ((2, 3, 4, 5), -2), ((2, 3, 5), 0)])
@pytest.mark.parametrize("epsilon", [1e-6, 1e-3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_normalization_kernel(shape, axis, epsilon, bias, dtype, rng):
    """Constant Scale and B: one compiled job whatever the axis (the normalised span is each
    row's tail), Scale and B broadcast over it, against float64 NumPy to 1e-6 relative with
    float32 statistics (stash_type 1) too; rows of one constant give B; NaN and the infinities
    make their row NaN."""
    normalized = shape[axis % len(shape):]
    x = rand(rng, *shape, dtype=dtype) * 3 + 20
    x.reshape(-1, int(np.prod(normalized)))[0] = 0.5   # a constant row
    x.reshape(-1)[[-1, x.size // 2]] = np.nan, np.inf
    scale = rand(rng, *normalized[1:], dtype=dtype)   # broadcast over the first axis
    constants = {"scale": scale}
    if bias:
        constants["b"] = rand(rng, *normalized, dtype=dtype)
    run = build("LayerNormalization", dict(axis=axis, epsilon=epsilon), opset=17,
                inputs=["x", *constants], constants=constants)
    (y,), jobs = _jobs(run, x)
    assert jobs == 1 and y.dtype == dtype and y.shape == x.shape
    expected = _layer_norm_reference(x, scale, constants.get("b"), axis, np.float32(epsilon))
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert np.isnan(y).sum() == np.isnan(expected).sum() > 0


def test_layer_normalization_kernel_takes_out_and_buffers_and_numpy_does_the_rest(rng):
    """``out=`` and ``buffers=`` as the pools; Scale or B made at run time and float16 run
    NumPy (no job), into ``out=`` too; a Scale that does not broadcast names the node."""
    from cso.buffers import Buffers
    x = rand(rng, 2, 3, 8)
    constants = {"s": rand(rng, 8), "b": rand(rng, 8)}
    run = build("LayerNormalization", opset=17, inputs=("x", "s", "b"), constants=constants)
    (want,) = run(x)
    out = np.empty_like(x)
    (y,), jobs = _jobs(run, x, out=out)
    assert jobs == 1 and y is out and np.array_equal(out, want)
    buffers = Buffers()
    (y,), jobs = _jobs(run, x, buffers=buffers)
    assert jobs == 1 and buffers.owns(y) and np.array_equal(y, want)
    runtime = build("LayerNormalization", opset=17, inputs=("x", "s", "b"))
    (y,), jobs = _jobs(runtime, x, constants["s"], constants["b"], out=np.empty_like(x))
    assert jobs == 0
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    (y,), jobs = _jobs(run, x.astype(np.float16))
    assert jobs == 0 and y.dtype == np.float16
    np.testing.assert_allclose(y, want, rtol=1e-2, atol=1e-2)
    with pytest.raises(UnsupportedModel, match=r"'my_layernormalization'.*does not broadcast"):
        run(rand(rng, 2, 3, 5))


# --- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("op, attrs, kwargs, match", [
    ("Sub", dict(broadcast=1), dict(opset=6, inputs=("a", "b")), r"'my_sub'.*broadcast"),
    ("Div", dict(axis=1), dict(inputs=("a", "b")), r"'my_div'.*axis"),
    ("Sqrt", dict(alpha=1.0), {}, r"'my_sqrt'.*alpha"),
    ("Min", {}, dict(inputs=()), r"'my_min'.*one or more"),
    ("Cast", dict(to=8), {}, r"'my_cast'.*to=8"),
    ("Cast", {}, {}, r"'my_cast'.*to=None"),
    ("Cast", dict(to=1, saturate=2), dict(opset=19), r"'my_cast'.*saturate"),
    ("CastLike", {}, dict(opset=15), r"'my_castlike'.*target_type.*missing"),
    ("ReduceMean", dict(axes=[1]), dict(opset=18), r"'my_reducemean'.*axes"),
    ("ReduceSum", dict(axes=[1]), {}, r"'my_reducesum'.*axes"),
    ("ReduceMax", dict(keepdims=2), {}, r"'my_reducemax'.*keepdims"),
    ("ReduceMin", dict(noop_with_empty_axes=1), {}, r"'my_reducemin'.*noop_with_empty_axes"),
    ("ReduceMean", dict(select_last_index=1), {}, r"'my_reducemean'.*select_last_index"),
    ("Shape", dict(start=1.5), dict(opset=15), r"'my_shape'.*start"),
    ("Shape", dict(start=1), dict(opset=13), r"'my_shape'.*start"),
    ("Gather", dict(axis=0), {}, r"'my_gather'.*indices.*missing"),
    ("Squeeze", dict(axes=[0]), {}, r"'my_squeeze'.*axes"),
    ("Squeeze", dict(axes=[0]), dict(opset=11, inputs=("x", "a")), r"'my_squeeze'.*attribute"),
    ("Slice", {}, dict(inputs=("x", "s")), r"'my_slice'.*ends.*missing"),
    ("Slice", dict(starts=[0]), dict(opset=9), r"'my_slice'.*starts and ends"),
    ("Slice", dict(starts=[0], ends=[1]), {}, r"'my_slice'.*starts"),
    ("Split", dict(split=[1, 1]), dict(outputs=("a", "b")), r"'my_split'.*split"),
    ("Split", dict(num_outputs=3), dict(opset=18, outputs=("a", "b")), r"'my_split'.*num_outputs"),
    ("Split", dict(num_outputs=2), dict(opset=13, outputs=("a", "b")), r"'my_split'.*num_outputs"),
    ("Split", dict(split=[1, 2, 3]), dict(opset=11, outputs=("a", "b")), r"'my_split'.*2 outputs"),
    ("Split", {}, dict(opset=11, inputs=("x", "s"), outputs=("a", "b")),
     r"'my_split'.*attribute before opset 13"),
    ("Expand", {}, {}, r"'my_expand'.*shape.*missing"),
    ("Tile", {}, {}, r"'my_tile'.*repeats.*missing"),
    ("Pad", dict(mode="symmetric"), dict(inputs=("x", "p")), r"'my_pad'.*symmetric"),
    ("Pad", dict(mode="constant"), {}, r"'my_pad'.*pads.*missing"),
    ("Pad", dict(mode="constant"), dict(opset=2), r"'my_pad'.*pads is missing"),
    ("Pad", {}, dict(opset=13, inputs=("x", "p", "", "a")), r"'my_pad'.*axes.*opset 18"),
    ("Resize", dict(coordinate_transformation_mode="tf_crop_and_resize"),
     dict(inputs=("x", "r", "s")), r"'my_resize'.*tf_crop_and_resize"),
    ("Resize", dict(mode="area"), dict(inputs=("x", "r", "s")), r"'my_resize'.*mode='area'"),
    ("Resize", dict(nearest_mode="round"), dict(inputs=("x", "r", "s")),
     r"'my_resize'.*nearest_mode"),
    ("Resize", dict(coordinate_transformation_mode="tf_half_pixel_for_nn"),
     dict(inputs=("x", "r", "s")), r"'my_resize'.*tf_half_pixel_for_nn"),
    ("Resize", dict(coordinate_transformation_mode="half_pixel_symmetric"),
     dict(opset=18, inputs=("x", "r", "s")), r"'my_resize'.*half_pixel_symmetric"),
    ("Resize", dict(antialias=1), dict(opset=13, inputs=("x", "r", "s")),
     r"'my_resize'.*antialias"),
    ("Resize", dict(antialias=1), dict(opset=18, inputs=("x", "r", "s")),
     r"'my_resize'.*antialias.*linear and cubic"),
    ("Resize", dict(mode="cubic"), dict(opset=10, inputs=("x", "s")), r"'my_resize'.*cubic"),
    ("Resize", {}, dict(opset=11, inputs=("x", "r")), r"'my_resize'.*scales.*missing"),
    ("Resize", {}, dict(opset=13, inputs=("x", "r")), r"'my_resize'.*exactly one"),
    ("Upsample", dict(scales=[1.0, 2.0]), dict(opset=9), r"'my_upsample'.*scales"),
    ("Upsample", dict(scales=[1, 2]), dict(opset=7), r"'my_upsample'.*scales"),
    ("LayerNormalization", {}, dict(opset=17), r"'my_layernormalization'.*Scale.*missing"),
    ("LayerNormalization", dict(stash_type=10), dict(opset=17, inputs=("x", "s")),
     r"'my_layernormalization'.*stash_type"),
    ("LayerNormalization", {}, dict(opset=17, inputs=("x", "s"), outputs=("y", "mean")),
     r"'my_layernormalization'.*Mean"),
])
def test_refused_at_load(op, attrs, kwargs, match):
    with pytest.raises(UnsupportedModel, match=match):
        build(op, attrs, **kwargs)


def test_refused_at_load_with_constants():
    with pytest.raises(UnsupportedModel, match=r"'my_resize'.*exactly one"):
        build("Resize", opset=13, inputs=("x", "", "s", "z"),
              constants={"s": np.array([1, 2], np.float32), "z": i64(1, 2)})
    with pytest.raises(UnsupportedModel, match=r"'my_slice'.*starts.*integers"):
        build("Slice", inputs=("x", "s", "e"), constants={"s": np.array([0.5], np.float32),
                                                          "e": i64(1)})
    with pytest.raises(UnsupportedModel, match=r"'my_reducesum'.*axes.*integers"):
        build("ReduceSum", inputs=("x", "a"), constants={"a": np.array([[0]], np.int64)})
    with pytest.raises(UnsupportedModel, match=r"'my_split'.*split \[1, 2, 3\] for 2"):
        build("Split", outputs=("a", "b"), inputs=("x", "s"), constants={"s": i64(1, 2, 3)})
    with pytest.raises(UnsupportedModel, match=r"'my_split'.*both"):
        build("Split", dict(num_outputs=2), opset=18, outputs=("a", "b"), inputs=("x", "s"),
              constants={"s": i64(1, 2)})


def test_refused_at_run_rather_than_wrong(rng):
    x = rand(rng, 3, 4)
    for op in ("Sqrt", "Exp", "Log", "Reciprocal", "Floor"):
        with pytest.raises(UnsupportedModel, match=rf"'my_{op.lower()}'.*int64"):
            build(op)(ints(rng, 3))
    with pytest.raises(UnsupportedModel, match="'my_reducemean'.*axes=3 is out of range"):
        build("ReduceMean", dict(axes=[3]), opset=11)(x)
    with pytest.raises(UnsupportedModel, match="'my_reducemean'.*repeats"):
        build("ReduceMean", dict(axes=[1, -1]), opset=11)(x)
    with pytest.raises(UnsupportedModel, match="'my_split'.*does not add up"):
        build("Split", outputs=("a", "b"), inputs=("x", "s"), constants={"s": i64(1, 1)})(x)
    with pytest.raises(UnsupportedModel, match="'my_split'.*equal parts"):
        build("Split", dict(axis=1), outputs=("a", "b", "c"))(x)
    with pytest.raises(UnsupportedModel, match="'my_slice'.*steps may not be 0"):
        build("Slice", inputs=("x", "s", "e", "a", "t"),
              constants={"s": i64(0), "e": i64(1), "a": i64(0), "t": i64(0)})(x)
    with pytest.raises(UnsupportedModel, match="'my_expand'.*does not broadcast"):
        build("Expand", inputs=("x", "s"), constants={"s": i64(2, 4)})(x)
    with pytest.raises(UnsupportedModel, match="'my_tile'.*repeats"):
        build("Tile", inputs=("x", "r"), constants={"r": i64(2)})(x)
    with pytest.raises(UnsupportedModel, match="'my_range'.*delta may not be 0"):
        build("Range", inputs=("a", "b", "c"))(*(np.array(v, np.int64) for v in (0, 4, 0)))
    with pytest.raises(UnsupportedModel, match="'my_resize'.*linear.*int32"):
        build("Resize", dict(mode="linear"), inputs=("x", "", "s"),
              constants={"s": np.array([1, 2], np.float32)})(x.astype(np.int32))
    with pytest.raises(UnsupportedModel, match="'my_resize'.*expected 2 values"):
        build("Resize", inputs=("x", "", "s"),
              constants={"s": np.array([2], np.float32)})(x)
    with pytest.raises(UnsupportedModel, match="'my_upsample'.*>= 1"):
        build("Upsample", opset=9, inputs=("x", "s"),
              constants={"s": np.array([1, 0.5], np.float32)})(x)
    with pytest.raises(UnsupportedModel, match="'my_where'.*bool"):
        build("Where", inputs=("c", "a", "b"))(x, x, x)
    with pytest.raises(UnsupportedModel, match="'my_layernormalization'.*int64"):
        build("LayerNormalization", opset=17, inputs=("x", "s"),
              constants={"s": i64(1)})(ints(rng, 3))


# --- in a model ----------------------------------------------------------------------------

def _graph_model(nodes, inputs, outputs, initializers, opset):
    graph = helper.make_graph(
        nodes, "several",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       shape) for name, (shape, dtype) in inputs.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8 if opset <= 18 else 9)


@pytest.mark.parametrize("opset", [13, 18])
def test_operators_in_a_loaded_model(opset, rng):
    """A model that convolves, upsamples (Resize), pads, normalises (LayerNormalization from
    ReduceMean, Sub, Pow, Sqrt, Div as the exporters decompose it before opset 17), slices,
    splits and does shape arithmetic (Shape, Gather, Range, Cast, Expand, Tile, Where) loads
    with cso.onnx and matches onnxruntime, constant-captured inputs and all, on two batch sizes.
    """
    from cso.onnx import load
    make = helper.make_node
    reduce_axes = (dict(inputs=["c_axes"]) if opset >= 18 else dict(axes=[-1]))

    def reduce_mean(x, y):
        extra = reduce_axes.get("inputs", [])
        attrs = {k: v for k, v in reduce_axes.items() if k != "inputs"}
        return make("ReduceMean", [x] + extra, [y], keepdims=1, **attrs)

    nodes = [
        make("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
        make("Resize", ["conv", "", "scales"], ["up"], mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        make("Pad", ["up", "pads"], ["padded"], mode="reflect"),
        reduce_mean("padded", "mean"),
        make("Sub", ["padded", "mean"], ["centred"]),
        make("Pow", ["centred", "two"], ["square"]),
        reduce_mean("square", "variance"),
        make("Add", ["variance", "eps"], ["variance_eps"]),
        make("Sqrt", ["variance_eps"], ["std"]),
        make("Div", ["centred", "std"], ["normed"]),
        make("Slice", ["normed", "starts", "ends", "slice_axes", "steps"], ["sliced"]),
        make("Split", ["sliced", "split"], ["left", "right"], axis=1),
        make("Max", ["left", "right"], ["larger"]),
        # shape code: the last axis' length, as the exporters compute it
        make("Shape", ["larger"], ["shape"]),
        make("Gather", ["shape", "minus_one"], ["width"], axis=0),
        make("Range", ["zero", "width", "one"], ["positions"]),
        make("Cast", ["positions"], ["positions_f"], to=1),
        make("Less", ["positions_f", "half_width"], ["left_half"]),
        make("Where", ["left_half", "larger", "zero_f"], ["masked"]),
        make("Tile", ["masked", "repeats"], ["tiled"]),
        make("ReduceSum", ["tiled", "sum_axes"], ["out"], keepdims=0),
    ]
    initializers = {
        "w": rand(rng, 4, 3, 3, 3), "scales": np.array([1, 1, 2, 2], np.float32),
        "pads": i64(0, 0, 1, 2, 0, 0, 2, 1), "two": np.array(2, np.float32),
        "eps": np.array(1e-5, np.float32), "starts": i64(1, -1), "ends": i64(100, 0),
        "slice_axes": i64(2, 3), "steps": i64(2, -1), "split": i64(2, 2),
        "minus_one": np.array(-1, np.int64), "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64), "half_width": np.array(7.5, np.float32),
        "zero_f": np.array(0, np.float32), "repeats": i64(1, 1, 1, 2),
        "sum_axes": i64(2), "c_axes": i64(-1),
    }
    if opset < 18:
        initializers.pop("c_axes")
    model = _graph_model(nodes, {"x": (("N", 3, 6, 7), np.float32)}, ["out"], initializers, opset)
    loaded = load(model)
    for batch in (1, 3):
        x = rand(rng, batch, 3, 6, 7)
        want = onnxruntime_session(model, 1).run(None, {"x": x})[0]
        got = loaded.run(None, {"x": x})[0]
        assert got.shape == want.shape == (batch, 2, 32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
