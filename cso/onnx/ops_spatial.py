"""Pad, Resize and Upsample in NumPy.

Resize is separable: each resized axis in turn, each output position along it the weighted sum
of a few taps of the input (nearest: one; linear: two, or with ``antialias`` the triangle
stretched by 1 / scale when downscaling; cubic: four, or stretched likewise), their indices
and weights computed once per input shape and kept. The source coordinates, the output sizes
made from scales and the scales made from sizes are computed in float32, as onnxruntime does,
so that the nearest pixel is the same one.
"""
import numpy as np

from .registry import (axes_in, captured, input_name, int_attr, int_list_attr, int_values,
                       operator, require_input, str_attr)


# --- Pad -----------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge")


def _pad(node, x, pads, axes, mode, value):
    """``x`` padded by ``pads`` (begins, then ends, one each per axis of ``axes``): negative
    pads crop first (as onnxruntime), then the others pad in ``mode``."""
    if len(pads) != 2 * len(axes):
        raise node.error(f"pads {pads}: expected {2 * len(axes)} values for axes {axes}")
    begin, end = [0] * x.ndim, [0] * x.ndim
    for a, head, tail in zip(axes, pads[:len(axes)], pads[len(axes):]):
        begin[a], end[a] = head, tail
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(begin, end, x.shape))
    if any(s.stop < s.start for s in crop):
        raise node.error(f"pads {pads} crop more than the input's shape {x.shape}")
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if not any(b or e for b, e in widths):
        return x
    if mode == "constant":
        return np.pad(x, widths, constant_values=value)
    for a, (b, e) in enumerate(widths):
        if (b or e) and x.shape[a] == 0:
            raise node.error(f"mode {mode!r} cannot pad an axis of length 0 (axis {a})")
        if mode == "reflect" and (b or e) and max(b, e) > x.shape[a] - 1:
            raise node.error(f"mode 'reflect' pads at most {x.shape[a] - 1} on axis {a} of "
                             f"length {x.shape[a]} (pads {pads})")
    return np.pad(x, widths, mode=mode)


@operator("Pad", captures_constants=True)
def _build_pad(node, constants):
    modes = _PAD_MODES + (("wrap",) if node.opset >= 19 else ())
    if node.opset < 11:      # pads ('paddings' at opset 1) and value are attributes
        name = "pads" if node.opset >= 2 else "paddings"
        node.only("mode", name, "value")
        fixed_pads = int_list_attr(node, name)
        if fixed_pads is None:
            raise node.error(f"attribute {name} is missing")
        value = node.attr("value", 0.0)
        if not isinstance(value, float):
            raise node.error(f"attribute value={value!r}: expected a float")
        fixed = [fixed_pads, np.float64(value), None]
        runtime = [False] * 3
        if len(node.inputs) > 1:
            raise node.error("pads and value are attributes before opset 11")
    else:
        node.only("mode")
        require_input(node, 1, "pads")
        if node.opset < 18 and input_name(node, 3):
            raise node.error("input 3 (axes) is an input from opset 18 on")
        fixed = [captured(node, constants, i) for i in (1, 2, 3)]
        runtime = [fixed[i] is None and bool(input_name(node, i + 1)) for i in range(3)]
        for i, what in ((0, "pads"), (2, "axes")):
            if fixed[i] is not None:
                fixed[i] = int_values(node, fixed[i], what)
    mode = str_attr(node, "mode", "constant", modes)

    def run(x, *values):
        pads, value, axes = (values[i] if runtime[i] else fixed[i] for i in range(3))
        if runtime[0]:
            pads = int_values(node, pads, "pads")
        axes = (list(range(x.ndim)) if axes is None
                else axes_in(node, int_values(node, axes, "axes") if runtime[2] else axes,
                             x.ndim))
        if value is None:
            value = 0
        else:
            value = np.asarray(value)
            if value.size != 1:
                raise node.error(f"constant_value of shape {value.shape}: expected a scalar")
            value = value.reshape(()).astype(x.dtype)
        return (_pad(node, x, pads, axes, mode, value),)
    return run


# --- Resize and Upsample -------------------------------------------------------------------

_F = np.float32      # onnxruntime computes coordinates and scales in float32

_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source(mode, length_in, length_out, scale):
    """The source coordinate (float32) of each output position along an axis."""
    x = np.arange(length_out, dtype=_F)
    scale = _F(scale)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + _F(0.5)) / scale - _F(0.5)
    if mode == "pytorch_half_pixel":
        return (x + _F(0.5)) / scale - _F(0.5) if length_out > 1 else np.zeros(1, _F)
    if mode == "align_corners":
        if length_out == 1:
            return np.zeros(1, _F)
        return x * _F(length_in - 1) / _F(length_out - 1)
    if mode == "tf_half_pixel_for_nn":
        return (x + _F(0.5)) / scale
    assert mode == "half_pixel_symmetric", mode
    width = scale * _F(length_in)
    adjustment = _F(length_out) / width
    offset = _F(length_in) / _F(2) * (_F(1) - adjustment)
    return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(scale)
            - 0.5).astype(_F)


def _nearest(x, rounding, scale):
    """The nearest input index of each source coordinate (before clamping)."""
    floor = np.floor(x)
    if rounding == "floor":
        return floor
    if rounding == "ceil":
        return np.ceil(x)
    if rounding == "simple":          # Resize-10, Upsample: floor, ceil when downscaling
        return np.ceil(x) if scale < 1 else floor
    fraction = x - floor
    return floor + (fraction > 0.5 if rounding == "round_prefer_floor" else fraction >= 0.5)


def _cubic(t, a):
    """The cubic convolution kernel of Keys (coefficient ``a``) at distances ``t``."""
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


class _Resize:
    """The checked attributes of a Resize / Upsample node, and its taps per axis."""

    def __init__(self, node, mode, coordinates, rounding, cubic_a, exclude_outside, antialias):
        self.node, self.mode, self.coordinates = node, mode, coordinates
        self.rounding, self.cubic_a = rounding, cubic_a
        self.exclude_outside, self.antialias = exclude_outside, antialias
        self.taps = {}      # (length in, length out, scale) -> (indices, weights), (taps, out)

    def axis_taps(self, length_in, length_out, scale):
        key = (length_in, length_out, float(scale))
        if key not in self.taps:
            self.taps[key] = self._taps(length_in, length_out, scale)
        return self.taps[key]

    def _taps(self, length_in, length_out, scale):
        x = _source(self.coordinates, length_in, length_out, scale)
        last = length_in - 1
        if self.mode == "nearest":
            index = np.clip(_nearest(x, self.rounding, scale), 0, last).astype(np.intp)
            return index[None], None
        if self.mode == "linear" and not (self.antialias and scale < 1):
            # the coordinate clamped to the input, as onnxruntime: the edge pixels extend
            x = np.clip(x, _F(0), _F(last))
            low = np.minimum(x.astype(np.intp), last)
            high = np.minimum(low + 1, last)
            w_high = x - low.astype(_F)
            return np.stack([low, high]), np.stack([_F(1) - w_high, w_high]).astype(np.float64)
        # the cubic kernel (or a linear or cubic one stretched by 1 / scale when antialiasing
        # a downscale) over the taps around each coordinate, edge pixels repeated beyond the
        # input unless exclude_outside drops them (the weights then renormalised)
        stretch = min(float(scale), 1.0) if self.antialias else 1.0
        support = (1.0 if self.mode == "linear" else 2.0) / stretch
        x = x.astype(np.float64)
        floor = np.floor(x)
        first = floor - np.ceil(support) + 1
        offsets = np.arange(int(2 * np.ceil(support)))
        taps = first[None, :] + offsets[:, None]          # (taps, out)
        distance = (taps - x[None, :]) * stretch
        if self.mode == "linear":
            weights = np.clip(1 - np.abs(distance), 0, 1)
        else:
            weights = _cubic(distance, self.cubic_a)
        if self.exclude_outside:
            weights = np.where((taps < 0) | (taps > last), 0.0, weights)
        if self.antialias or self.exclude_outside:
            total = weights.sum(axis=0)
            weights = weights / np.where(total == 0, 1.0, total)
        return np.clip(taps, 0, last).astype(np.intp), weights

    def __call__(self, x, sizes, scales):
        """``x`` resized to the shape ``sizes`` with the per-axis ``scales``."""
        y = x
        for a, (length_in, length_out, scale) in enumerate(zip(x.shape, sizes, scales)):
            if length_out == length_in and scale == 1:
                continue
            if length_out and not length_in:
                raise self.node.error(f"axis {a} of length 0 cannot be resized to {length_out}")
            if not length_out:
                y = np.take(y, np.zeros(0, np.intp), axis=a)
                continue
            index, weights = self.axis_taps(length_in, length_out, scale)
            if weights is None:
                y = np.take(y, index[0], axis=a)
                continue
            shape = (-1,) + (1,) * (y.ndim - a - 1)
            weights = weights.astype(y.dtype)
            total = None
            for i, w in zip(index, weights):
                term = np.take(y, i, axis=a)
                term *= w.reshape(shape)
                if total is None:
                    total = term
                else:
                    total += term
            y = total
        return y


def _float_attr(node, name, default):
    value = node.attr(name, default)
    if not isinstance(value, float):
        raise node.error(f"attribute {name}={value!r}: expected a float")
    return value


@operator("Resize", "Upsample", captures_constants=True)
def _build_resize(node, constants):
    resize = node.op_type == "Resize"
    modes = ("nearest", "linear", "cubic") if resize and node.opset >= 11 else (
        "nearest", "linear")
    axes, policy = None, "stretch"
    if not resize or node.opset < 11:
        # Upsample (scales an attribute at opset 7, an input from 9) and Resize-10: asymmetric
        # coordinates, the nearest pixel rounded down (up when downscaling, onnxruntime's)
        if not resize and node.opset < 9:
            node.only("mode", "scales")
            scales = node.attr("scales")
            if (not isinstance(scales, list) or not scales
                    or any(not isinstance(s, float) for s in scales)):
                raise node.error(f"attribute scales={scales!r}: expected a list of floats")
            fixed = {"scales": np.array(scales, _F)}
        else:
            node.only("mode")
            require_input(node, 1, "scales")
            fixed = {"scales": captured(node, constants, 1)}
        inputs = {"scales": 1}
        coordinates, rounding = "asymmetric", "simple"
        cubic_a, exclude_outside, antialias = -0.75, 0, 0
    else:
        names = ["coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                 "extrapolation_value", "mode", "nearest_mode"]
        coordinate_modes = _COORDINATES + (("tf_half_pixel_for_nn",) if node.opset < 13 else
                                           ("half_pixel_symmetric",) if node.opset >= 19 else ())
        if node.opset >= 18:
            names += ["antialias", "axes", "keep_aspect_ratio_policy"]
        node.only(*names)
        if node.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
            raise node.error("coordinate_transformation_mode='tf_crop_and_resize' is not "
                             "supported")
        coordinates = str_attr(node, "coordinate_transformation_mode", "half_pixel",
                               coordinate_modes)
        rounding = str_attr(node, "nearest_mode", "round_prefer_floor", _NEAREST_MODES)
        cubic_a = _float_attr(node, "cubic_coeff_a", -0.75)
        _float_attr(node, "extrapolation_value", 0.0)    # tf_crop_and_resize's only
        exclude_outside = int_attr(node, "exclude_outside", 0, (0, 1))
        antialias = int_attr(node, "antialias", 0, (0, 1))
        axes = int_list_attr(node, "axes")
        policy = str_attr(node, "keep_aspect_ratio_policy", "stretch",
                          ("stretch", "not_larger", "not_smaller"))
        if node.opset < 13:
            require_input(node, 2, "scales")     # (an empty tensor when sizes are given)
        inputs = {"scales": 2, "sizes": 3}
        fixed = {name: captured(node, constants, i) for name, i in inputs.items()}
    mode = str_attr(node, "mode", "nearest", modes)
    if antialias and mode == "nearest":
        raise node.error("antialias=1 applies to the linear and cubic modes only")
    run_resize = _Resize(node, mode, coordinates, rounding, cubic_a, exclude_outside, antialias)
    runtime = {name: fixed[name] is None and bool(input_name(node, i))
               for name, i in inputs.items()}
    for name, value in fixed.items():
        if value is not None and (value.ndim != 1 or value.dtype.kind != (
                "f" if name == "scales" else "i")):
            raise node.error(f"{name} {value!r}: expected a 1-D tensor of "
                             f"{'floats' if name == 'scales' else 'integers'}")

    known = [value is not None and value.size > 0 for value in fixed.values()]
    if not any(runtime.values()) and sum(known) != 1:
        raise node.error("exactly one of scales and sizes must be given")

    def target(shape, dtype, values):
        """The output's shape and per-axis scales for an input of ``shape`` and ``dtype``."""
        given = {name: values[i - 1] if runtime[name] else fixed[name]
                 for name, i in inputs.items()}
        scales, sizes = given["scales"], given.get("sizes")
        if scales is not None and scales.size == 0:
            scales = None                 # (an empty tensor: the sizes are given)
        if (scales is None) == (sizes is None):
            raise node.error("exactly one of scales and sizes must be given")
        resized = (list(range(len(shape))) if axes is None
                   else axes_in(node, axes, len(shape), "axes"))
        given = scales if scales is not None else sizes
        if given.ndim != 1 or len(given) != len(resized):
            raise node.error(f"{'scales' if scales is not None else 'sizes'} "
                             f"{given.tolist()}: expected {len(resized)} values (axes "
                             f"{resized} of an input of shape {shape})")
        out_shape, out_scales = list(shape), [_F(1)] * len(shape)
        if scales is not None:
            for a, s in zip(resized, scales.astype(_F)):
                if not s > 0:
                    raise node.error(f"scales {scales.tolist()} must be > 0")
                out_scales[a] = s
                out_shape[a] = int(s * _F(shape[a]))     # floor, in float32
        else:
            sizes = int_values(node, sizes, "sizes")
            for a, size in zip(resized, sizes):
                if size < 0:
                    raise node.error(f"sizes {sizes} must be >= 0")
                out_shape[a] = size
                out_scales[a] = _F(size) / _F(shape[a]) if shape[a] else _F(1)
            if policy != "stretch":
                pick = min if policy == "not_larger" else max
                scale = pick(out_scales[a] for a in resized)
                for a in resized:
                    out_scales[a] = scale
                    out_shape[a] = int(np.floor(scale * _F(shape[a]) + _F(0.5)))
        if mode != "nearest" and dtype.kind != "f":
            raise node.error(f"mode {mode!r} on an input of dtype {dtype}: a floating-point "
                             f"type is needed")
        if not resize and any(s < 1 for s in out_scales):
            raise node.error(f"Upsample scales {[float(s) for s in out_scales]} must be >= 1")
        return out_shape, out_scales

    def run(x, *values):
        return (run_resize(x, *target(x.shape, x.dtype, values)),)

    def blocked(x, channels, *values):
        """The resize of the channel-blocked ``x`` (N, blocks, H, W, L) of ``channels``
        channels (``cso.onnx.layouts``), blocked as it: its planes' axes resized alone."""
        shape = x.shape[:1] + (channels,) + x.shape[2:4]
        out_shape, out_scales = target(shape, x.dtype, values)
        if out_shape[:2] != list(shape[:2]) or out_scales[:2] != [1, 1]:
            raise node.error(f"a blocked input of {shape} resized to {out_shape} (scales "
                             f"{[float(s) for s in out_scales]}): only the spatial axes can be")
        return (run_resize(x, out_shape[:1] + [x.shape[1]] + out_shape[2:] + [x.shape[4]],
                           out_scales + [_F(1)]),)
    run.blocked = blocked
    return run
