"""The pools: MaxPool, AveragePool and their global forms, compiled kernels (``kernels``) on
cso's threads."""
from .. import get_num_threads
from . import kernels
from .registry import ints, kernel_input, operator, output, refuse_outputs

class _PoolGeometry:
    """The 2-D window geometry of a MaxPool / AveragePool node, checked at load time; per
    input size it gives each spatial axis as ``(out, head, end)``: output length, padding
    before, and where the explicit/auto padding ends (in the padded coordinates)."""

    AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")

    def __init__(self, node, dilations):
        kernel = node.attr("kernel_shape")
        if kernel is None:
            raise node.error("attribute kernel_shape is missing")
        if not isinstance(kernel, list) or len(kernel) != 2:
            raise node.error(f"kernel_shape={kernel!r}: only 2-D pools (NCHW) are supported")
        self.kernel = ints(node, "kernel_shape", 2, None, 1)
        self.strides = ints(node, "strides", 2, [1, 1], 1)
        self.dilations = ints(node, "dilations", 2, [1, 1], 1) if dilations else [1, 1]
        self.pads = ints(node, "pads", 4, [0, 0, 0, 0], 0)
        self.auto_pad = node.attr("auto_pad", "NOTSET")
        if self.auto_pad not in self.AUTO_PADS:
            raise node.error(f"auto_pad={self.auto_pad!r} is not supported "
                             f"(supported: {list(self.AUTO_PADS)})")
        if self.auto_pad != "NOTSET" and any(self.pads):
            raise node.error(f"pads={self.pads} cannot be combined with "
                             f"auto_pad={self.auto_pad!r}")
        self.ceil_mode = node.attr("ceil_mode", 0)
        if self.ceil_mode not in (0, 1):
            raise node.error(f"ceil_mode={self.ceil_mode!r} must be 0 or 1")
        if self.ceil_mode and self.auto_pad != "NOTSET":
            # the spec's VALID/SAME output sizes ignore ceil_mode, onnxruntime's do not
            raise node.error(f"ceil_mode=1 with auto_pad={self.auto_pad!r} is not supported")
        if self.auto_pad.startswith("SAME") and self.dilations != [1, 1]:
            # onnxruntime pads for the undilated kernel, the spec for the dilated one
            raise node.error(f"dilations={self.dilations} with auto_pad={self.auto_pad!r} is "
                             f"not supported")
        if any(p >= k for p, k in zip(self.pads, self.kernel * 2)):
            raise node.error(f"pads={self.pads} must be smaller than kernel_shape={self.kernel}")
        self.node = node

    def axes(self, x):
        if x.ndim != 4:
            raise self.node.error(f"input of shape {x.shape}: only 4-D NCHW input is "
                                  f"supported")
        return tuple(self._axis(a, size) for a, size in enumerate(x.shape[2:]))

    def _axis(self, a, size):
        k, s, d = self.kernel[a], self.strides[a], self.dilations[a]
        span = (k - 1) * d + 1
        if self.auto_pad == "VALID":
            head = tail = 0
        elif self.auto_pad.startswith("SAME"):
            out = -(-size // s)
            total = max((out - 1) * s + span - size, 0)
            head = total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2
            tail = total - head
        else:
            head, tail = self.pads[a], self.pads[a + 2]
        room = size + head + tail - span
        if room < 0:
            raise self.node.error(f"input size {size} is smaller than the window ({span}) on "
                                  f"spatial axis {a}")
        out = (-(-room // s) if self.ceil_mode else room // s) + 1
        if self.ceil_mode and (out - 1) * s >= size + head:
            out -= 1                  # the last window must start inside the input or its head
        return out, head, head + size + tail

def _pool(kind, x, geometry, axes, count_bounds=None, out=None, buffers=None):
    """The ``kind`` ("max" or "average") pool of NCHW ``x``, compiled (``kernels.pool``), made
    in ``out`` (a C-contiguous array of its shape: the model hands a pool its channels of the
    Concat that reads it), else in an array from ``buffers``; one window that is the whole
    plane (the 7x7 average pools that end ResNet and DenseNet) as a global pool, whose pass
    goes a vector at a time down the plane (21 against 140 us on ResNet-50's 2048 planes of
    7x7, Zen 3)."""
    (oh, top, bottom), (ow, left, right) = axes
    out = output(geometry.node, x.shape[:2] + (oh, ow), x.dtype, out, buffers)
    if ((oh, ow, top, left, bottom, right) == (1, 1, 0, 0) + x.shape[2:]
            and tuple(geometry.kernel) == x.shape[2:] and tuple(geometry.dilations) == (1, 1)):
        return _global_pool(kind, geometry.node, x, out)[0]
    x = kernel_input(geometry.node, x, floats_only=kind == "average")
    return kernels.pool(kind, x, out, geometry.kernel, geometry.strides, geometry.dilations,
                        (top, left), count_bounds, get_num_threads())

@operator("MaxPool", takes_out=True)
def _build_max_pool(node, constants):
    node.only("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
              "strides")
    refuse_outputs(node, 1, "Indices")     # storage_order only matters to Indices
    geometry = _PoolGeometry(node, dilations=True)
    omitted = (None,) * (len(node.outputs) - 1)

    def run(x, out=None, buffers=None):
        return (_pool("max", x, geometry, geometry.axes(x), None, out, buffers),) + omitted
    return run


@operator("AveragePool", takes_out=True)
def _build_average_pool(node, constants):
    node.only("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
    geometry = _PoolGeometry(node, dilations=False)
    include_pad = node.attr("count_include_pad", 0)
    if include_pad not in (0, 1):
        raise node.error(f"count_include_pad={include_pad!r} must be 0 or 1")

    def run(x, out=None, buffers=None):
        axes = geometry.axes(x)
        # count_include_pad counts the padding, not what ceil_mode adds past it
        bounds = [(-head, end - head) if include_pad else (0, size)
                  for (_, head, end), size in zip(axes, x.shape[2:])]
        return (_pool("average", x, geometry, axes, bounds, out, buffers),)
    return run


def _global_pool(kind, node, x, out=None, buffers=None):
    """The ``kind`` ("max" or "average") of each (image, channel)'s spatial elements of ``x``,
    compiled (``kernels.global_pool``), shaped (N, C, 1, ...) (in ``out`` or an array from
    ``buffers`` if given)."""
    if x.ndim < 3 or 0 in x.shape[2:]:
        raise node.error(f"input of shape {x.shape} has no spatial elements to pool")
    x = kernel_input(node, x, floats_only=kind == "average")
    out = output(node, x.shape[:2] + (1,) * (x.ndim - 2), x.dtype, out, buffers)
    if out.size:   # an empty batch has nothing to pool
        kernels.global_pool(kind, x, out, get_num_threads())
    return (out,)


@operator("GlobalAveragePool", takes_out=True)
def _build_global_average_pool(node, constants):
    node.only()
    return lambda x, out=None, buffers=None: _global_pool("average", node, x, out, buffers)


@operator("GlobalMaxPool", takes_out=True)
def _build_global_max_pool(node, constants):
    node.only()
    return lambda x, out=None, buffers=None: _global_pool("max", node, x, out, buffers)
