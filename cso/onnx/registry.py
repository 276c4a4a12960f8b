"""The table of ONNX operators (other than Conv) and the helpers their builders share.

``OPERATORS[op_type](node, constants)`` builds an operator at load time and returns
``run(*inputs) -> tuple of outputs`` (one per ``node.outputs`` entry, None for an omitted one).
A builder checks every attribute and every input that must be constant while the model loads,
and precomputes what depends only on constants; an operator it cannot run exactly raises
``node.error(...)`` (an ``UnsupportedModel``) then, never a wrong answer later. Outputs keep the
input's dtype, and no operator writes into its inputs (some return views of them).

The builders live in the families ``ops_*`` (each imports this module, never another family);
``ops`` imports them all, which registers them.
"""
import numpy as np

from . import kernels

OPERATORS = {}
CAPTURES_CONSTANTS = set()   # op types registered with captures_constants=True
TAKES_OUT = set()            # op types registered with takes_out=True


def operator(*op_types, captures_constants=False, takes_out=False):
    """Register the decorated builder for ``op_types``. ``captures_constants``: it keeps every
    constant input it uses beyond the first, so the model passes None for those at run time
    and does not keep the constants themselves. ``takes_out``: its run takes ``out=`` (an array
    to make the output in) and ``buffers=`` (a ``Buffers`` to take it from), and on the inputs
    its kernels take (C-contiguous, of their dtypes and shapes) runs compiled kernels alone;
    on others it runs NumPy (a Softmax over another axis, a Mul of other shapes, an integer
    Clip), and a recording, seeing no job, stops there."""
    def register(build):
        for op_type in op_types:
            OPERATORS[op_type] = build
            if captures_constants:
                CAPTURES_CONSTANTS.add(op_type)
            if takes_out:
                TAKES_OUT.add(op_type)
        return build
    return register


def input_name(node, index):
    """The name of input ``index``, '' when omitted."""
    return node.inputs[index] if index < len(node.inputs) else ""


def constant(node, constants, index, what, required=True):
    """Input ``index`` as a load-time constant (None when omitted and not required)."""
    name = input_name(node, index)
    if not name:
        if required:
            raise node.error(f"input {index} ({what}) is missing")
        return None
    if name not in constants:
        raise node.error(f"input {index} ({what}, {name!r}) must be a constant known at load "
                         f"time")
    return constants[name]


def captured(node, constants, index):
    """Input ``index`` if it is a load-time constant, else None (omitted, or made at run time):
    a builder registered with ``captures_constants`` keeps it, and its run gets None for it."""
    return constants.get(input_name(node, index))


def int_input(node, constants, index, what):
    """``value(given=None)``: input ``index`` (``what``, required) as a list of ints, the
    load-time constant (checked once, here; a run then gets None for it) or the tensor a run
    passes (checked then)."""
    require_input(node, index, what)
    fixed = captured(node, constants, index)
    fixed = None if fixed is None else int_values(node, fixed, what)
    return lambda given=None: fixed if given is None else int_values(node, given, what)


def require_input(node, index, what):
    """Raise unless input ``index`` (``what``) is given."""
    if not input_name(node, index):
        raise node.error(f"input {index} ({what}) is missing")


def refuse_outputs(node, first, what):
    """Refuse the optional outputs from ``first`` on when any is requested."""
    if any(node.outputs[first:]):
        raise node.error(f"output(s) {[o for o in node.outputs[first:] if o]} ({what}) are not "
                         f"supported")


def ints(node, name, length, default, minimum):
    values = node.attr(name, default)
    if (not isinstance(values, (list, tuple)) or len(values) != length
            or any(not isinstance(v, int) or v < minimum for v in values)):
        raise node.error(f"attribute {name}={values!r}: expected {length} integers >= {minimum}")
    return list(values)


def int_attr(node, name, default, choices=None):
    """Integer attribute ``name`` (``default`` when absent), one of ``choices`` if given."""
    value = node.attr(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or (
            choices is not None and value not in choices):
        expected = f"one of {list(choices)}" if choices is not None else "an integer"
        raise node.error(f"attribute {name}={value!r}: expected {expected}")
    return value


def int_list_attr(node, name, default=None):
    """A list-of-integers attribute (``default`` when absent)."""
    values = node.attr(name, default)
    if values is default:
        return values
    if not isinstance(values, (list, tuple)) or any(not isinstance(v, int) for v in values):
        raise node.error(f"attribute {name}={values!r}: expected a list of integers")
    return list(values)


def str_attr(node, name, default, choices):
    """String attribute ``name`` (``default`` when absent), one of ``choices``."""
    value = node.attr(name, default)
    if value not in choices:
        raise node.error(f"attribute {name}={value!r} is not supported (supported: "
                         f"{list(choices)})")
    return value


def int_values(node, value, what, ndim=1):
    """A constant or run-time integer tensor (``what``) as a list of Python ints (a scalar
    when ``ndim`` is 0; ``ndim`` None takes either, as a list)."""
    value = np.asarray(value)
    if value.dtype.kind not in "iu" or (ndim is not None and value.ndim != ndim):
        shape = {0: "a scalar", 1: "a 1-D tensor"}.get(ndim, "a tensor")
        raise node.error(f"{what} {value!r}: expected {shape} of integers")
    return int(value) if ndim == 0 else [int(v) for v in value.reshape(-1)]


def axis_in(node, axis, rank, what="axis"):
    """``axis`` in [-rank, rank) made non-negative (checked: a node error, not NumPy's)."""
    if not -rank <= axis < rank:
        raise node.error(f"{what}={axis} is out of range for a tensor of rank {rank}")
    return axis % rank if rank else axis


def axes_in(node, axes, rank, what="axes"):
    """Distinct axes in [-rank, rank) made non-negative, in the order given."""
    found = [axis_in(node, a, rank, what) for a in axes]
    if len(set(found)) != len(found):
        raise node.error(f"{what}={list(axes)} repeats an axis")
    return found


def output(node, shape, dtype, out, buffers):
    """``out`` if given (checked: a kernel writes it whole), else a new array (from
    ``buffers`` when given)."""
    if out is None:
        return buffers.get(shape, dtype) if buffers else np.empty(shape, dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise node.error(f"out= of shape {out.shape}, dtype {out.dtype} for an output of "
                         f"shape {shape}, dtype {dtype} (C-contiguous)")
    return out


def written(node, y, out):
    """``y``, copied into ``out`` when that is given: an operator that takes ``out=`` (an array
    the model makes its output in, a Concat's channels) and made ``y`` with NumPy."""
    if out is None:
        return y
    np.copyto(output(node, y.shape, y.dtype, out, None), y)
    return out


def kernel_input(node, x, floats_only):
    """``x`` C-contiguous for a compiled kernel (``kernels``), which has code for float32,
    float64 and, unless ``floats_only``, the integer types: another dtype is a clear error."""
    if not kernels.compiles(x.dtype) or (floats_only and x.dtype.kind != "f"):
        raise node.error(f"input of dtype {x.dtype} is not supported: float32, float64"
                         f"{'' if floats_only else ' or an integer type'}")
    return np.ascontiguousarray(x)


def floats(node, x):
    """``x``, checked to be of a floating-point dtype (the operators the ONNX specification
    defines on floats only, which NumPy would otherwise run in another dtype)."""
    if x.dtype.kind != "f":
        raise node.error(f"input of dtype {x.dtype} is not supported: a floating-point type")
    return x


# TensorProto.DataType -> NumPy dtype, for the numeric types (Cast's ``to``, stash_type)
DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8),
          4: np.dtype(np.uint16), 5: np.dtype(np.int16), 6: np.dtype(np.int32),
          7: np.dtype(np.int64), 9: np.dtype(np.bool_), 10: np.dtype(np.float16),
          11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64)}
