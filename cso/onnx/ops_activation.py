"""The ONNX activations as compiled kernels (``cso.activate``) on cso's threads: Relu, Clip,
LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu (opset 20) and Erf. Each takes ``out=``
and ``buffers=`` (so that a model's recorded run replays it) and refuses a dtype other than
float32 and float64, but Relu and Clip, which NumPy runs on integers (shape arithmetic) and
Relu on float16 too."""
import math
from functools import lru_cache

import numpy as np

from .. import Activation, activate
from .registry import input_name, operator, output, str_attr, written

FLOATS = (np.float32, np.float64)   # the dtypes cso.activate has kernels for


def _float_attr(node, name, default):
    """Float attribute ``name``, ``default`` when absent, as ONNX keeps both: in float32."""
    value = node.attr(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise node.error(f"attribute {name}={value!r}: expected a number")
    return float(np.float32(value))


def _activated(node, activation, x, out, buffers):
    """(``activation`` (an ``Activation``) of ``x``,) made in ``out`` or an array from
    ``buffers`` when given."""
    if x.dtype not in FLOATS:
        raise node.error(f"input of dtype {x.dtype} is not supported: float32, float64")
    return (activate(x, activation, output(node, x.shape, x.dtype, out, buffers)),)


def _compiled(node, activation):
    """``run(x, out=None, buffers=None)`` of ``activation`` on ``x``."""
    return lambda x, out=None, buffers=None: _activated(node, activation, x, out, buffers)


# op type -> (kind, {ONNX attribute: (Activation parameter, default)}) of the activations
# whose parameters are attributes (Clip's bounds are inputs from opset 11 on; Gelu's
# ``approximate`` is a string)
ATTRIBUTE_KINDS = {"Relu": ("relu", {}), "Sigmoid": ("sigmoid", {}), "Tanh": ("tanh", {}),
                   "Erf": ("erf", {}), "HardSwish": ("hardswish", {}),
                   "LeakyRelu": ("leaky_relu", {"alpha": ("alpha", 0.01)}),
                   "HardSigmoid": ("hardsigmoid", {"alpha": ("alpha", 0.2),
                                                   "beta": ("beta", 0.5)})}


def activation_of(node, constants):
    """The ``Activation`` ``node`` computes, its parameters read from its attributes or
    constant inputs; None for a Clip with a bound made at run time. Attributes its operator
    does not take raise ``node.error``."""
    if node.op_type == "Clip":
        known = _clip_bounds(node, constants)
        return _clip_between(node, *known) if _bounds_constant(node, constants) else None
    if node.op_type == "Gelu":
        node.only("approximate")
        return Activation("gelu", approximate=str_attr(node, "approximate", "none",
                                                       ("none", "tanh")))
    kind, attrs = ATTRIBUTE_KINDS[node.op_type]
    node.only(*attrs)
    params = {param: _float_attr(node, name, default) for name, (param, default) in attrs.items()}
    try:
        return Activation(kind, **params)
    except (TypeError, ValueError) as err:
        raise node.error(str(err)) from None


def constant_activation(node, constants):
    """The ``Activation`` ``node`` computes when its parameters are known at load time (a
    convolution's store can then apply it), else None: an operator that is no activation, a
    Clip with a bound made at run time, or attributes its operator refuses (it says why)."""
    if node.op_type not in (*ATTRIBUTE_KINDS, "Clip", "Gelu"):
        return None
    try:
        return activation_of(node, constants)
    except ValueError:   # an UnsupportedModel
        return None


@operator("Sigmoid", "Tanh", "Erf", "HardSwish", "LeakyRelu", "HardSigmoid", "Gelu",
          takes_out=True)
def _build_activation(node, constants):
    return _compiled(node, activation_of(node, constants))


@operator("Relu", takes_out=True)
def _build_relu(node, constants):
    """Relu (a Relu that follows a convolution or an affine step is fused into it)."""
    relu = activation_of(node, constants)

    def run(x, out=None, buffers=None):
        if x.dtype in FLOATS:
            return _activated(node, relu, x, out, buffers)
        return (written(node, np.asarray(np.maximum(x, x.dtype.type(0))), out),)
    return run


@operator("Clip", captures_constants=True, takes_out=True)
def _build_clip(node, constants):
    """Clip: bounds as attributes (before opset 11) or as optional inputs (from opset 11),
    constant or made at run time; ``min(max(x, min), max)``, so all ``max`` when min > max.
    Integer inputs (shape arithmetic) are clipped by NumPy."""
    known = _clip_bounds(node, constants)
    fixed = activation_of(node, constants)

    def run(x, low=None, high=None, out=None, buffers=None):
        low, high = (k if v is None else v for k, v in zip(known, (low, high)))
        if x.dtype.kind in "iu":
            y = x if low is None else np.maximum(x, np.asarray(low).astype(x.dtype))
            y = y if high is None else np.minimum(y, np.asarray(high).astype(x.dtype))
            return (written(node, y, out),)
        activation = fixed if fixed is not None else _clip_between(node, low, high)
        return _activated(node, activation, x, out, buffers)
    # bounds made at run time are values, not addresses: a replay of its job would keep the
    # bounds of the run recorded
    run.jobs_only = fixed is not None
    return run


def _clip_bounds(node, constants):
    """[min, max] as known at load time: numbers (attributes, before opset 11), constant
    one-element tensors, or None (absent, or made at run time)."""
    if node.opset < 11:
        node.only("min", "max")
        return [_float_attr(node, "min", -math.inf), _float_attr(node, "max", math.inf)]
    node.only()
    known = [constants.get(input_name(node, i)) for i in (1, 2)]
    for i, value in enumerate(known, 1):
        if value is not None and value.size != 1:
            raise node.error(f"input {i} (a bound) must be a scalar, got shape {value.shape}")
    return known


def _bounds_constant(node, constants):
    """Whether Clip ``node``'s bounds are all known at load time."""
    return all(input_name(node, i) in ("", *constants) for i in (1, 2))


def _clip_between(node, low, high):
    """The clip activation between ``low`` and ``high`` (numbers or one-element tensors; None:
    unbounded there)."""
    try:
        return _clip(*(None if value is None else float(np.asarray(value).reshape(()))
                       for value in (low, high)))
    except ValueError as err:   # a NaN bound
        raise node.error(str(err)) from None


@lru_cache(maxsize=256)
def _clip(low, high):
    """The clip activation between ``low`` and ``high`` (floats; None: unbounded there)."""
    return Activation("clip", **{name: value for name, value in (("min", low), ("max", high))
                                 if value is not None})

