"""The pools: MaxPool, AveragePool and their global forms, compiled kernels (``kernels``) on
cso's threads."""
import numpy as np

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

    def axes(self, size):
        """Each spatial axis of an input of spatial ``size`` (H, W)."""
        return tuple(self._axis(a, length) for a, length in enumerate(size))

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

class _Pool:
    """A MaxPool (``kind`` "max") or AveragePool ("average") node's run on NCHW values, and
    (``blocked``) on channel-blocked ones."""

    def __init__(self, kind, node):
        self.kind = kind
        self.geometry = _PoolGeometry(node, dilations=kind == "max")
        self.include_pad = node.attr("count_include_pad", 0) if kind == "average" else 0
        if self.include_pad not in (0, 1):
            raise node.error(f"count_include_pad={self.include_pad!r} must be 0 or 1")
        self.omitted = (None,) * (len(node.outputs) - 1)   # MaxPool's Indices, refused

    def __call__(self, x, out=None, buffers=None):
        """The pool of NCHW ``x``, made in ``out`` (a C-contiguous array of its shape: the
        model hands a pool its channels of the Concat that reads it), else in an array from
        ``buffers``; one window that is the whole plane (the 7x7 average pools that end ResNet
        and DenseNet) as a global pool, whose pass goes a vector at a time down the plane (21
        against 140 us on ResNet-50's 2048 planes of 7x7, Zen 3)."""
        node = self.geometry.node
        if x.ndim != 4:
            raise node.error(f"input of shape {x.shape}: only 4-D NCHW input is supported")
        axes = self.geometry.axes(x.shape[2:])
        out = output(node, x.shape[:2] + (axes[0][0], axes[1][0]), x.dtype, out, buffers)
        if self._global(x.shape[2:], axes):
            return _global_pool(self.kind, node, x, out) + self.omitted
        x = kernel_input(node, x, floats_only=self.kind == "average")
        return (kernels.pool(self.kind, x, out, *self._window(x.shape[2:], axes),
                             get_num_threads()),) + self.omitted

    def blocked(self, x, out=None, buffers=None):
        """The pool of channel-blocked ``x`` (N, blocks, H, W, L), C-contiguous and of a float
        dtype (``cso.onnx.layouts``), blocked as it."""
        axes = self.geometry.axes(x.shape[2:4])
        shape = x.shape[:2] + (axes[0][0], axes[1][0], x.shape[4])
        if out is None:
            out = buffers.get(shape, x.dtype) if buffers else np.empty(shape, x.dtype)
        if self._global(x.shape[2:4], axes):
            return (kernels.blocked_global_pool(self.kind, x, out, get_num_threads()),) + \
                self.omitted
        return (kernels.pool(self.kind, x, out, *self._window(x.shape[2:4], axes),
                             get_num_threads()),) + self.omitted

    def _global(self, size, axes):
        """Whether the one window is the whole plane."""
        (oh, top, bottom), (ow, left, right) = axes
        return ((oh, ow, top, left, bottom, right) == (1, 1, 0, 0) + tuple(size)
                and tuple(self.geometry.kernel) == tuple(size)
                and tuple(self.geometry.dilations) == (1, 1))

    def _window(self, size, axes):
        """The kernels' kernel, strides, dilations, head and count bounds (an average's: with
        count_include_pad, the padding but not what ceil_mode adds past it)."""
        geometry = self.geometry
        bounds = None
        if self.kind == "average":
            bounds = [(-head, end - head) if self.include_pad else (0, length)
                      for (_, head, end), length in zip(axes, size)]
        return (geometry.kernel, geometry.strides, geometry.dilations,
                (axes[0][1], axes[1][1]), bounds)


@operator("MaxPool", takes_out=True)
def _build_max_pool(node, constants):
    node.only("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
              "strides")
    refuse_outputs(node, 1, "Indices")     # storage_order only matters to Indices
    return _Pool("max", node)


@operator("AveragePool", takes_out=True)
def _build_average_pool(node, constants):
    node.only("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
    return _Pool("average", node)


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
