"""Argument validation and normalisation for the public API.

Every bad argument raises ValueError or TypeError naming the argument and the shapes involved,
before anything is compiled or run.
"""
import numbers
import sys
from math import ceil

import numpy as np

from csa import ConvSpec
from microkernels.dtypes import NUMPY_NAMES

FLOAT_DTYPES = tuple(np.dtype(name) for name in NUMPY_NAMES)
# Every size, stride, padding and dilation stays below this, so that all index arithmetic in the
# compiled loop nest (products of two such numbers, and their sums) fits in int64.
INDEX_LIMIT = 2 ** 31


def is_masked(value):
    """Whether ``value`` is a NumPy masked array (without importing ``numpy.ma``, 20-40 ms at a
    model's load: no masked array exists until something else has imported it)."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(value, ma.MaskedArray)


def check_array(name, value):
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(value).__name__}")
    if is_masked(value):
        raise TypeError(f"{name} is a masked array; its mask would be ignored: pass "
                        f"{name}.filled(0) or another plain ndarray")
    if value.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {value.dtype} "
                        f"({name} of shape {value.shape})")
    return value


def _int(name, value, minimum):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if value >= INDEX_LIMIT:
        raise ValueError(f"{name} must be < 2**31, got {value!r}")
    return int(value)


def pair(name, value, minimum):
    """int or (h, w) -> (h, w)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair (h, w), got {value!r}")
        return (_int(name, value[0], minimum), _int(name, value[1], minimum))
    v = _int(name, value, minimum)
    return (v, v)


def padding_rule(value):
    """Normalise ``padding`` to a rule: 'same', or explicit (top, bottom, left, right)."""
    if isinstance(value, str):
        if value == "valid":
            return (0, 0, 0, 0)
        if value == "same":
            return "same"
        raise ValueError(f"padding must be an int, (h, w), ((top, bottom), (left, right)), "
                         f"'valid' or 'same', got {value!r}")
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, (tuple, list)) for v in value):
        (t, b), (l, r) = (pair("padding", v, 0) for v in value)
        return (t, b, l, r)
    h, w = pair("padding", value, 0)
    return (h, h, w, w)


def same_padding(size, kernel, stride, dilation):
    """(before, after) zero padding of one spatial dimension of ``size`` that ``padding='same'``
    gives (ONNX SAME_UPPER, TensorFlow 'SAME'): output = ceil(size / stride), an odd pad at
    the end."""
    extent = dilation * (kernel - 1) + 1
    total = max(0, (ceil(size / stride) - 1) * stride + extent - size)
    return total // 2, total - total // 2


def check_weight(w, bias, groups):
    check_array("weight", w)
    if w.ndim != 4:
        raise ValueError(f"expected 4-D weight (K, C/groups, R, S), got weight of shape {w.shape}")
    if min(w.shape) < 1:
        raise ValueError(f"weight dimensions must be >= 1, got weight of shape {w.shape}")
    groups = _int("groups", groups, 1)
    if w.shape[0] % groups:
        raise ValueError(f"groups={groups} must divide the {w.shape[0]} filters of weight {w.shape}")
    if bias is not None:
        check_array("bias", bias)
        if bias.dtype != w.dtype:
            raise TypeError(f"bias dtype {bias.dtype} differs from weight dtype {w.dtype}; "
                            "mixed dtypes are not supported")
        if bias.shape != (w.shape[0],):
            raise ValueError(f"expected bias of shape ({w.shape[0]},) for weight {w.shape}, "
                             f"got bias of shape {bias.shape}")
    return groups


def conv_spec(x_shape, x_dtype, w_shape, w_dtype, stride, padding, dilation, groups):
    """The ConvSpec of an input of ``x_shape`` (N, C, H, W) or unbatched (C, H, W), with every
    mismatch reported by name and the shapes as given. An empty batch plans as one image."""
    x_shape = tuple(x_shape)
    if x_dtype != w_dtype:
        raise TypeError(f"input dtype {x_dtype} differs from weight dtype {w_dtype}; "
                        "mixed dtypes are not supported")
    if len(x_shape) not in (3, 4):
        raise ValueError(f"expected 3-D (C, H, W) or 4-D (N, C, H, W) input, got input of shape "
                         f"{x_shape}")
    n, c, h, w = x_shape if len(x_shape) == 4 else (1,) + x_shape
    k, c_g, r, s = w_shape
    if c != c_g * groups:
        raise ValueError(f"expected input with {c_g * groups} channels for weight {tuple(w_shape)} "
                         f"and groups={groups}, got input of shape {x_shape}")
    if min(c, h, w) < 1:
        raise ValueError(f"input channels, height and width must be >= 1, got input of shape "
                         f"{x_shape}")
    if max(x_shape) >= INDEX_LIMIT:
        raise ValueError(f"input dimensions must be < 2**31, got input of shape {x_shape}")
    if padding == "same":
        pads = same_padding(h, r, stride[0], dilation[0]) + same_padding(w, s, stride[1], dilation[1])
    else:
        pads = padding
    extent_h, extent_w = dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1
    if extent_h > h + pads[0] + pads[1] or extent_w > w + pads[2] + pads[3]:
        raise ValueError(f"kernel of extent {extent_h}x{extent_w} (weight {tuple(w_shape)}, dilation "
                         f"{dilation}) is larger than the padded input "
                         f"{h + pads[0] + pads[1]}x{w + pads[2] + pads[3]} (input of shape "
                         f"{x_shape}, padding {pads})")
    if max(pads) >= INDEX_LIMIT:
        raise ValueError(f"padding must be < 2**31 per side, got {pads} for input of shape {x_shape}")
    return ConvSpec(max(n, 1), c, h, w, k, r, s, stride=stride, padding=pads, dilation=dilation,
                    groups=groups, dtype=x_dtype.name)


def check_channel_shuffle(value, weight_shape, groups):
    """A channel shuffle's group count: it must divide the input channels of a depthwise
    weight (one input channel per group)."""
    _int("channel_shuffle", value, 1)
    channels = weight_shape[1] * groups
    if value > 1 and (weight_shape[1] != 1 or channels % value):
        raise ValueError(f"channel_shuffle={value} needs a depthwise weight (one input channel "
                         f"per group) and must divide its {channels} input channels; got weight "
                         f"{weight_shape} with groups={groups}")
    return int(value)


def check_out(out, shape, dtype, x):
    """``out`` may have any strides (a non-contiguous one is filled through a temporary), but
    must not overlap the input ``x``."""
    if not isinstance(out, np.ndarray) or is_masked(out):
        raise TypeError(f"out must be a plain numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {out.dtype}")
    if out.shape != shape:
        raise ValueError(f"expected out of shape {shape}, got out of shape {out.shape}")
    if not out.flags.writeable:
        raise ValueError(f"out must be writeable, got a read-only array of shape {out.shape}")
    if np.may_share_memory(out, x):
        raise ValueError(f"out (shape {out.shape}) overlaps input (shape {x.shape})")
    return out
