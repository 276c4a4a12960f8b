"""Elementwise ONNX operators in vectorised NumPy: arithmetic with NumPy's (multidirectional)
broadcasting, comparisons and logic, Where, Cast; a squeeze-excitation Mul compiled (Relu and
the other activations: ``ops_activation``). Outputs are arrays (0-d ones too, not NumPy's
scalars) of the inputs' dtype (comparisons make bool); none writes into its inputs."""
import numpy as np

from .. import get_num_threads
from . import kernels
from .registry import (DTYPES, captured, floats, int_attr, operator, output, require_input,
                       written)


# --- the first set: Add and Mul (also fused, see ``fusion``), Sum, Identity ----------------

def _binary(ufunc):
    """The builder of ``ufunc`` of two inputs; its output an array also when they are 0-d
    (where NumPy's ufuncs give a scalar, np.float32 say: every operator's outputs are
    arrays)."""
    def build(node, constants):
        node.only()
        return lambda a, b: (np.asarray(ufunc(a, b)),)
    return build


@operator("Add", takes_out=True)
def _build_add(node, constants):
    """Add; of two float tensors of one shape (a residual sum no convolution could take) a
    compiled job (``kernels.add``) that a recorded run replays."""
    node.only()

    def run(a, b, out=None, buffers=None):
        if (a.shape == b.shape and a.dtype == b.dtype and a.dtype in (np.float32, np.float64)
                and a.flags.c_contiguous and b.flags.c_contiguous and a.size):
            result = output(node, a.shape, a.dtype, out, buffers)
            return (kernels.add(a, b, result, get_num_threads()),)
        return (written(node, np.asarray(np.add(a, b)), out),)
    run.jobs_only = True
    return run


@operator("Mul", takes_out=True)
def _build_mul(node, constants):
    """Mul; a squeeze-excitation gate, (N, C, H, W) times (N, C, 1, 1), as a compiled scaling
    of each plane (``kernels.affine``), a job a recorded run replays."""
    node.only()
    zeros = {}   # (planes, dtype) -> the shift the scaling adds: none

    def run(a, b, out=None, buffers=None):
        planes = _gated_planes(a, b)
        if planes is not None:
            x, gate = planes
            result = output(node, x.shape, x.dtype, out, buffers)
            n, c = x.shape[:2]
            key = (n * c, x.dtype)
            if key not in zeros:
                zeros[key] = np.zeros(n * c, x.dtype)
            flat = (1, n * c) + x.shape[2:]   # each plane its own scale
            kernels.affine(x.reshape(flat), result.reshape(flat),
                           np.ascontiguousarray(gate).reshape(-1), zeros[key], False,
                           get_num_threads())
            return (result,)
        shape, dtype = np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b)
        if out is None and buffers is not None:
            out = buffers.get(shape, dtype)
        return (np.asarray(np.multiply(a, b, out=out)),)
    return run


def _gated_planes(a, b):
    """(x, gate) when one of ``a`` and ``b`` is a C-contiguous float (N, C, H, W) tensor and
    the other an (N, C, 1, 1) gate of its dtype, else None."""
    for x, gate in ((a, b), (b, a)):
        if (x.ndim == 4 and gate.shape == x.shape[:2] + (1, 1) and x.dtype == gate.dtype
                and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous and x.size):
            return x, gate
    return None


@operator("Sum")
def _build_sum(node, constants):
    node.only()

    def run(*xs):
        total = xs[0]
        for x in xs[1:]:
            if total is not xs[0] and np.broadcast_shapes(total.shape, x.shape) == total.shape:
                np.add(total, x, out=total)      # accumulate in the first sum's array
            else:
                total = np.add(total, x)
        return (np.asarray(total),)
    return run


@operator("Identity")
def _build_identity(node, constants):
    node.only()
    return lambda x: (x,)


# --- arithmetic ----------------------------------------------------------------------------
# (ONNX's broadcasting since opset 7 is NumPy's; before it, ``broadcast`` / ``axis`` /
# ``consumed_inputs`` attributes are refused by ``node.only()``, and without them the operands
# have one shape, which NumPy runs the same)

operator("Sub")(_binary(np.subtract))
operator("And")(_binary(np.logical_and))
operator("Or")(_binary(np.logical_or))
operator("Xor")(_binary(np.logical_xor))
operator("Equal")(_binary(np.equal))
operator("Less")(_binary(np.less))
operator("Greater")(_binary(np.greater))
operator("LessOrEqual")(_binary(np.less_equal))
operator("GreaterOrEqual")(_binary(np.greater_equal))


@operator("Div")
def _build_div(node, constants):
    node.only()

    def run(a, b):
        if a.dtype.kind in "iu":
            # integers divide truncating toward zero (C's), not flooring (NumPy's //)
            if b.size and not np.all(b):
                raise node.error("integer division by zero")
            q = np.floor_divide(a, b)
            return (np.asarray(q + ((q < 0) & (q * b != a))),)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.asarray(np.divide(a, b)),)
    return run


@operator("Pow")
def _build_pow(node, constants):
    node.only()

    def run(x, y):
        if x.dtype.kind == "f":
            # the exponent (of any numeric type since opset 12) in the base's dtype: the output
            # is the base's dtype
            with np.errstate(all="ignore"):
                return (np.asarray(np.power(x, y.astype(x.dtype, copy=False))),)
        if x.dtype.kind not in "iu" or y.dtype.kind not in "iu":
            raise node.error(f"a base of dtype {x.dtype} with an exponent of dtype {y.dtype} is "
                             f"not supported (a float base, or integers)")
        # integers: x ** y for y >= 0; for y < 0 the truncated 1 / x ** -y (1, -1 or 0)
        negative = y < 0
        z = np.power(x, np.where(negative, 0, y).astype(x.dtype, copy=False))
        if negative.any():
            if np.any(negative & (x == 0)):
                raise node.error("0 to a negative integer power")
            odd = (y % 2).astype(bool)
            z = np.where(negative, np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1),
                                                                   0)), z).astype(x.dtype)
        return (np.asarray(z),)
    return run


def _unary(ufunc, floats_only, domain=False):
    """``ufunc`` elementwise; ``floats_only``: the specification defines it on floats only (an
    integer input would come back in another dtype); ``domain``: NaN, inf or -inf for inputs
    outside its domain, as every engine gives, without NumPy's warnings."""
    def build(node, constants):
        node.only()

        def run(x):
            if floats_only:
                floats(node, x)
            if domain:
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    return (np.asarray(ufunc(x)),)
            return (np.asarray(ufunc(x)),)
        return run
    return build


operator("Neg")(_unary(np.negative, floats_only=False))
operator("Abs")(_unary(np.abs, floats_only=False))
operator("Sign")(_unary(np.sign, floats_only=False))
operator("Sqrt")(_unary(np.sqrt, floats_only=True, domain=True))
operator("Exp")(_unary(np.exp, floats_only=True, domain=True))
operator("Log")(_unary(np.log, floats_only=True, domain=True))
operator("Reciprocal")(_unary(np.reciprocal, floats_only=True, domain=True))
operator("Floor")(_unary(np.floor, floats_only=True))
operator("Ceil")(_unary(np.ceil, floats_only=True))
operator("Round")(_unary(np.round, floats_only=True))      # halves to even, as ONNX
operator("Not")(_unary(np.logical_not, floats_only=False))


def _variadic(ufunc):
    """Min / Max of one or more tensors, broadcast (opset 8 on; before, of one shape)."""
    def build(node, constants):
        node.only()
        if not node.inputs or not all(node.inputs):
            raise node.error("expected one or more inputs")

        def run(*xs):
            y = xs[0]
            for x in xs[1:]:
                y = ufunc(y, x)
            return (np.asarray(y),)
        return run
    return build


operator("Min")(_variadic(np.minimum))
operator("Max")(_variadic(np.maximum))


@operator("Mean")
def _build_mean(node, constants):
    node.only()
    if not node.inputs or not all(node.inputs):
        raise node.error("expected one or more inputs")

    def run(*xs):
        floats(node, xs[0])
        if len(xs) == 1:
            return (xs[0],)
        total = np.add(xs[0], xs[1])
        for x in xs[2:]:
            if np.broadcast_shapes(total.shape, x.shape) == total.shape:
                np.add(total, x, out=total)      # the sum's own array
            else:
                total = np.add(total, x)
        return (np.asarray(np.divide(total, total.dtype.type(len(xs)))),)
    return run


@operator("Where")
def _build_where(node, constants):
    node.only()

    def run(condition, x, y):
        if condition.dtype != np.bool_:
            raise node.error(f"condition of dtype {condition.dtype}: expected bool")
        return (np.asarray(np.where(condition, x, y)),)
    return run


# --- casts ---------------------------------------------------------------------------------

def _cast(x, dtype):
    """``x`` in ``dtype`` (itself when it is already): floats to integers truncate toward
    zero, anything nonzero (NaN too) is True."""
    return x if x.dtype == dtype else np.asarray(x).astype(dtype)


@operator("Cast")
def _build_cast(node, constants):
    node.only("saturate", "to")
    to = node.attr("to")
    if to not in DTYPES:
        raise node.error(f"attribute to={to!r} is not supported (supported: the numeric types "
                         f"{sorted(DTYPES)} of TensorProto.DataType)")
    # saturate (opset 19) concerns the float 8 types only, which are not supported
    int_attr(node, "saturate", 1, (0, 1))
    dtype = DTYPES[to]

    def run(x):
        with np.errstate(invalid="ignore", over="ignore"):
            return (_cast(x, dtype),)
    return run


@operator("CastLike", captures_constants=True)
def _build_cast_like(node, constants):
    node.only("saturate")
    int_attr(node, "saturate", 1, (0, 1))
    require_input(node, 1, "target_type")
    target = captured(node, constants, 1)

    def run(x, target_type=None):
        dtype = (target if target is not None else target_type).dtype
        if dtype not in DTYPES.values():
            raise node.error(f"target_type of dtype {dtype} is not supported")
        with np.errstate(invalid="ignore", over="ignore"):
            return (_cast(x, dtype),)
    return run
