"""The ONNX activations as compiled kernels (``cso.activate``) on cso's threads: Clip,
LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu (opset 20) and Erf. Each takes ``out=``
and ``buffers=`` (so that a model's recorded run replays it) and refuses a dtype other than
float32 and float64, but Clip, which clips integers (shape arithmetic) with NumPy."""
import math
from functools import lru_cache

import numpy as np

from .. import Activation, activate
from .registry import input_name, operator, output, str_attr


def _float_attr(node, name, default):
    """Float attribute ``name``, ``default`` when absent, as ONNX keeps both: in float32."""
    value = node.attr(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise node.error(f"attribute {name}={value!r}: expected a number")
    return float(np.float32(value))


def _compiled(node, activation):
    """``run(x, out=None, buffers=None)`` of ``activation`` (an ``Activation``) on ``x``."""
    def run(x, out=None, buffers=None):
        if x.dtype not in (np.float32, np.float64):
            raise node.error(f"input of dtype {x.dtype} is not supported: float32, float64")
        return (activate(x, activation, output(node, x.shape, x.dtype, out, buffers)),)
    return run


def _simple(kind, **attrs):
    """The builder of an activation whose parameters are attributes with defaults ``attrs``
    ({ONNX name: (Activation parameter, default)})."""
    def build(node, constants):
        node.only(*attrs)
        params = {param: _float_attr(node, name, default)
                  for name, (param, default) in attrs.items()}
        try:
            activation = Activation(kind, **params)
        except (TypeError, ValueError) as err:
            raise node.error(str(err)) from None
        return _compiled(node, activation)
    return build


operator("Sigmoid", takes_out=True)(_simple("sigmoid"))
operator("Tanh", takes_out=True)(_simple("tanh"))
operator("Erf", takes_out=True)(_simple("erf"))
operator("HardSwish", takes_out=True)(_simple("hardswish"))
operator("LeakyRelu", takes_out=True)(_simple("leaky_relu", alpha=("alpha", 0.01)))
operator("HardSigmoid", takes_out=True)(
    _simple("hardsigmoid", alpha=("alpha", 0.2), beta=("beta", 0.5)))


@operator("Gelu", takes_out=True)
def _build_gelu(node, constants):
    node.only("approximate")
    approximate = str_attr(node, "approximate", "none", ("none", "tanh"))
    return _compiled(node, Activation("gelu", approximate=approximate))


@operator("Clip", captures_constants=True, takes_out=True)
def _build_clip(node, constants):
    """Clip: bounds as attributes (before opset 11) or as optional inputs (from opset 11),
    constant or made at run time; ``min(max(x, min), max)``, so all ``max`` when min > max.
    Integer inputs (shape arithmetic) are clipped by NumPy."""
    if node.opset < 11:
        node.only("min", "max")
        known = [_float_attr(node, "min", -math.inf), _float_attr(node, "max", math.inf)]
    else:
        node.only()
        known = [constants.get(input_name(node, i)) for i in (1, 2)]
        for i, value in enumerate(known, 1):
            if value is not None and value.size != 1:
                raise node.error(f"input {i} (a bound) must be a scalar, got shape {value.shape}")

    def run(x, low=None, high=None, out=None, buffers=None):
        low, high = (k if v is None else v for k, v in zip(known, (low, high)))
        if x.dtype.kind in "iu":
            y = x if low is None else np.maximum(x, np.asarray(low).astype(x.dtype))
            y = y if high is None else np.minimum(y, np.asarray(high).astype(x.dtype))
            result = output(node, x.shape, x.dtype, out, buffers)
            np.copyto(result, y)
            return (result,)
        bounds = tuple(None if value is None else float(np.asarray(value).reshape(()))
                       for value in (low, high))
        try:
            activation = _clip(*bounds)
        except ValueError as err:   # a NaN bound
            raise node.error(str(err)) from None
        return _compiled(node, activation)(x, out, buffers)
    # bounds made at run time are values, not addresses: a replay of its job would keep the
    # bounds of the run recorded
    run.jobs_only = all(input_name(node, i) in ("", *constants) for i in (1, 2))
    return run


@lru_cache(maxsize=256)
def _clip(low, high):
    """The clip activation between ``low`` and ``high`` (None: unbounded there)."""
    return Activation("clip", **{name: value for name, value in (("min", low), ("max", high))
                                 if value is not None})
