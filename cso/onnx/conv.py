"""ONNX Conv as a prepared ``cso.Conv2d``, with the per-channel affine operators that follow it
(BatchNormalization, Mul and Add by constants) folded into its filters and bias, and a
following Relu fused into its store."""
import threading

import numpy as np

from .. import Conv2d, get_num_threads, same_padding
from . import kernels

BOUND_SHAPES = 8   # input shapes (and thread counts) a ConvStep keeps its bound calls for


def conv_attributes(node, weight):
    """(stride, dilation, groups, auto_pad, pads) of a Conv node whose weight is known; every
    attribute checked here, at load time."""
    node.only("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    if weight.ndim != 4:
        raise node.error(f"only 2-D convolutions are supported, got weight of shape {weight.shape}")
    if weight.dtype not in (np.float32, np.float64):
        raise node.error(f"weight must be float32 or float64, got {weight.dtype}")
    kernel = tuple(node.attr("kernel_shape", weight.shape[2:]))
    if kernel != weight.shape[2:]:
        raise node.error(f"kernel_shape {list(kernel)} differs from the weight's {weight.shape[2:]}")
    stride = tuple(node.attr("strides", (1, 1)))
    dilation = tuple(node.attr("dilations", (1, 1)))
    pads = tuple(node.attr("pads", (0, 0, 0, 0)))
    auto_pad = node.attr("auto_pad", "NOTSET")
    if len(stride) != 2 or len(dilation) != 2 or len(pads) != 4:
        raise node.error(f"strides {list(stride)}, dilations {list(dilation)} and pads "
                         f"{list(pads)} must have 2, 2 and 4 values for a 2-D convolution")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"auto_pad {auto_pad!r} is not an ONNX value")
    if auto_pad != "NOTSET" and "pads" in node.attrs:
        raise node.error(f"pads {list(pads)} given with auto_pad {auto_pad!r}")
    if min(stride + dilation) < 1 or min(pads) < 0:
        raise node.error(f"strides {list(stride)} and dilations {list(dilation)} must be >= 1 and "
                         f"pads {list(pads)} >= 0")
    groups = node.attr("group", 1)
    return stride, dilation, groups, auto_pad, pads


def explicit_pads(auto_pad, pads, size, kernel, stride, dilation):
    """((top, bottom), (left, right)) of an input of spatial ``size`` (h, w)."""
    if auto_pad == "VALID":
        return (0, 0), (0, 0)
    if auto_pad == "NOTSET":
        return (pads[0], pads[2]), (pads[1], pads[3])
    sides = [same_padding(*args) for args in zip(size, kernel, stride, dilation)]
    return tuple(s if auto_pad == "SAME_UPPER" else s[::-1] for s in sides)


class _BuiltOnce:
    """A step that builds its Conv2d on first use under ``self._lock``: it pickles without the
    lock and its bound calls (the Conv2d pickles as its filters and arguments), and the copy
    gets a lock of its own and binds again."""

    _per_process = {"_lock": threading.Lock}   # attributes a copy makes afresh

    def __getstate__(self):
        return {name: value for name, value in self.__dict__.items()
                if name not in self._per_process}

    def __setstate__(self, state):
        self.__dict__.update(state)
        for name, make in self._per_process.items():
            setattr(self, name, make())


class ConvStep(_BuiltOnce):
    """A Conv node and what was folded into it: ``step(x)`` runs it. The Conv2d is built on the
    first call, which the loader makes on the model's input shape, so that its filters are
    packed and its loop nest compiled for that shape at load time."""

    _per_process = {"_lock": threading.Lock, "_bound": dict}

    def __init__(self, node, weight, bias):
        self.node = node
        self.stride, self.dilation, self.groups, self.auto_pad, self.pads = \
            conv_attributes(node, weight)
        if weight.shape[0] % self.groups:
            raise node.error(f"group={self.groups} does not divide the {weight.shape[0]} filters "
                             f"of weight {weight.shape}")
        self.weight = weight      # the model's, scaled per channel (``scale``) when built
        self.weight_shape = weight.shape
        self.scale = np.ones(weight.shape[0])
        self.bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
        self.activation = None   # a cso.Activation its store applies (fusion)
        self.residual = False   # adds its second input in the store (Conv2d accumulate)
        self.in_place = False   # ... in that input's own array (the loader says when it may)
        self.depthwise = weight.shape[1] == 1   # csa plans C/groups = 1 as depthwise
        self.channel_shuffle = 1   # reads its input through a channel shuffle of these groups
        # (the batch its shuffle's Reshapes fix, 0 for any; the first of them)
        self.shuffle_batch = (0, None)
        self.conv = None
        # its output held channel-blocked (``cso.onnx.layouts``): then its input is too, or
        # NCHW, as the values' arrays' dimensions say
        self.blocked = False
        self._lock = threading.Lock()
        self._bound = {}   # (input shape, threads) -> the Conv2d's bound call on it

    @property
    def channels(self):
        return self.bias.shape[0]

    # a call on C-contiguous arrays given ``buffers`` or ``out`` runs compiled code alone (the
    # residual's copy too; see ``cso.onnx.program``)
    jobs_only = True

    def fold_affine(self, scale, shift):
        """Fold ``y * scale + shift`` (per output channel) into the filters and bias (kept in
        float64 until the Conv2d is built in the model's dtype)."""
        self.scale = self.scale * scale
        self.bias = self.bias * scale + shift

    def __call__(self, x, residual=None, buffers=None, out=None):
        """The output (in ``out`` if given, else in an array from ``buffers``)."""
        if x.ndim != 4 and not (self.blocked and x.ndim == 5):
            raise self.node.error(f"input of shape {x.shape}: a 2-D convolution takes N, C, H, W")
        # (a blocked input's shape as NCHW)
        shape = x.shape if x.ndim == 4 else (x.shape[0], self.weight_shape[1] * self.groups) \
            + x.shape[2:4]
        if self.conv is None:
            with self._lock:
                if self.conv is None:
                    self.conv = self._build(shape)
        batch, reshape = self.shuffle_batch
        if batch and x.shape[0] != batch:   # as the Reshape fused away would
            raise reshape.error(f"input of shape {x.shape}: its shape fixes the batch at {batch}")
        key = (x.shape, get_num_threads())
        run = self._bound.get(key)
        if run is None:
            if len(self._bound) >= BOUND_SHAPES:   # a stream of batch sizes cannot grow it
                self._bound.clear()
            run = self._bound[key] = (self.conv.bound_blocked(shape, x.shape[4] if x.ndim == 5
                                                              else 1)
                                      if self.blocked else self.conv.bound(shape))
        if self.residual:
            if self.in_place:
                out = residual
            else:
                if out is None:
                    out = buffers.get(residual.shape, residual.dtype) if buffers else \
                        np.empty_like(residual)
                if (residual.flags.c_contiguous and out.flags.c_contiguous
                        and residual.dtype == out.dtype and residual.shape == out.shape
                        and not np.may_share_memory(residual, out)):
                    kernels.copy(residual, out, get_num_threads())
                else:
                    np.copyto(out, residual)
        elif out is None:
            if buffers is None and not self.blocked:
                return (self.conv(x),)
            out = (buffers.get(run.out_shape, x.dtype) if buffers
                   else np.empty(run.out_shape, x.dtype))
        return (run(x, out),)

    def padding_for(self, shape):
        """((top, bottom), (left, right)) of its convolution on an input of ``shape``."""
        return explicit_pads(self.auto_pad, self.pads, shape[2:], self.weight_shape[2:],
                             self.stride, self.dilation)

    def _build(self, shape):
        weight, dtype = self.weight, self.weight.dtype
        padding = self.padding_for(shape)
        if not np.all(self.scale == 1):
            weight = (weight * self.scale[:, None, None, None]).astype(dtype)
        try:
            conv = Conv2d(weight, self.bias.astype(dtype),
                          self.stride, padding, self.dilation, self.groups,
                          self.activation, input_shape=shape,
                          accumulate=self.residual, channel_shuffle=self.channel_shuffle,
                          input_layout="blocked" if self.blocked else "nchw")
        except (TypeError, ValueError) as err:
            raise self.node.error(f"input of shape {shape}: {err}") from None
        self.weight = None   # the Conv2d holds the filters, packed
        return conv


class GemmStep(_BuiltOnce):
    """Gemm with a constant B, ``alpha * A @ B (+ beta * C)``, as a 1x1 ``Conv2d`` on cso's own
    threads: A's M rows are the M positions of a one-column image, B's N columns the filters,
    C (one value per column) the bias. (NumPy's BLAS would bring threads of its own, which
    spin on the cores the convolutions use.) ``step(a)`` runs it; a Relu after it is fused."""

    # a call on a C-contiguous A given ``buffers`` runs compiled jobs alone: the convolution,
    # and for more than one row the transposes around it (so a recorded program replays a
    # model's classifier and what follows it; see ``cso.onnx.program``)
    jobs_only = True

    def __init__(self, node, b, c, channels_last_b):
        alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
        filters = b if channels_last_b else b.T         # (N, K)
        self.shape = filters.shape
        if alpha != 1:
            filters = (alpha * filters).astype(b.dtype)
        self.weight = filters.reshape(self.shape + (1, 1))   # a view of B when it is (N, K)
        bias = np.zeros(self.shape[0]) if c is None else np.broadcast_to(
            beta * c.astype(np.float64).reshape(-1), self.shape[:1])
        self.bias = bias.astype(b.dtype)
        self.node, self.activation, self.conv = node, None, None
        self._lock = threading.Lock()

    @property
    def channels(self):
        return self.shape[0]

    def __call__(self, a, buffers=None):
        n, k = self.shape
        if a.ndim != 2 or a.shape[1] != k:
            raise self.node.error(f"A of shape {a.shape} does not match B's {k} rows")
        if a.dtype != self.bias.dtype:
            raise self.node.error(f"A of dtype {a.dtype} does not match B's {self.bias.dtype}")
        m = a.shape[0]
        if self.conv is None:
            with self._lock:
                if self.conv is None:
                    self.conv = Conv2d(self.weight, self.bias,
                                       activation=self.activation,
                                       input_shape=(1, k, m, 1))
                    self.weight = None   # packed in the Conv2d
        a = np.ascontiguousarray(a)

        def empty(shape):
            return buffers.get(shape, a.dtype) if buffers else np.empty(shape, a.dtype)
        out, threads = empty((m, n)), get_num_threads()
        if m == 1:   # the row is the image's column, the output's row its filters' column
            self.conv(a.reshape(1, k, 1, 1), out=out.reshape(1, n, 1, 1))
            return (out,)
        x, y = empty((k, m)), empty((n, m))
        kernels.transpose(a, x, threads)
        self.conv(x.reshape(1, k, m, 1), out=y.reshape(1, n, m, 1))
        return (kernels.transpose(y, out, threads),)


def gemm_as_conv(node, constants):
    """A ``GemmStep`` for ``node`` when B is a constant, A not transposed and C absent or one
    constant value per column; else None (the NumPy operator runs it)."""
    node.only("alpha", "beta", "transA", "transB")
    b = constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
    c_name = node.inputs[2] if len(node.inputs) > 2 else ""
    c = constants.get(c_name) if c_name else None
    if node.attr("transA", 0) or b is None or b.ndim != 2 or b.dtype not in (np.float32,
                                                                          np.float64):
        return None
    n = b.shape[0] if node.attr("transB", 0) else b.shape[1]
    if c_name and (c is None or c.size not in (1, n) or c.ndim > 2
                   or (c.ndim == 2 and c.shape[0] != 1)):
        return None
    return GemmStep(node, b, c, bool(node.attr("transB", 0)))


class MatMulStep(_BuiltOnce):
    """A MatMul of rows A (..., K) by a constant B (K, N) as a 1x1 convolution on channels-last
    values (``cso.Conv2d(..., layout="nhwc")``): A's rows are an image's pixels, its last axis
    their channels, so no transpose goes around it (ConvNeXt's MLPs, between the Transposes
    that put its channels last). A bias Add and an activation after it run in its store
    (``add_bias``, ``activation``); NumPy's BLAS ran them as three passes. ``step(a)`` runs
    it."""

    # a call on a C-contiguous A given ``buffers`` runs the convolution's jobs alone
    jobs_only = True

    def __init__(self, node, b):
        self.node, self.shape = node, b.shape   # (K, N)
        self.weight = np.ascontiguousarray(b.T).reshape(b.shape[1], b.shape[0], 1, 1)
        self.bias = np.zeros(b.shape[1], b.dtype)
        self.activation, self.conv = None, None
        self._lock = threading.Lock()

    @property
    def channels(self):
        return self.shape[1]

    def add_bias(self, values):
        self.bias = (self.bias + values).astype(self.bias.dtype)

    def __call__(self, a, buffers=None):
        k, n = self.shape
        if a.ndim < 2 or a.shape[-1] != k:
            raise self.node.error(f"A of shape {a.shape} does not match B's {k} rows")
        if a.dtype != self.bias.dtype:
            raise self.node.error(f"A of dtype {a.dtype} does not match B's {self.bias.dtype}")
        rows = a.size // k
        if self.conv is None:
            with self._lock:
                if self.conv is None:
                    self.conv = Conv2d(self.weight, self.bias, activation=self.activation,
                                       input_shape=(1, k, rows, 1))
                    self.weight = None   # packed in the Conv2d
        shape = a.shape[:-1] + (n,)
        out = buffers.get(shape, a.dtype) if buffers else np.empty(shape, a.dtype)
        if rows:
            self.conv(np.ascontiguousarray(a).reshape(1, rows, 1, k),
                      out=out.reshape(1, rows, 1, n), layout="nhwc", out_layout="nhwc")
        return (out,)


def matmul_as_conv(node, constants, shapes):
    """A ``MatMulStep`` for ``node`` when B is a 2-D float constant and A a value of two or
    more dimensions (known at load); else None (the NumPy operator runs it)."""
    node.only()
    b = constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
    a_shape = shapes.get(node.inputs[0])
    if (b is None or b.ndim != 2 or b.dtype not in (np.float32, np.float64)
            or node.inputs[0] in constants or a_shape is None or len(a_shape) < 2):
        return None
    return MatMulStep(node, b)


def matmul_bias(add, out, constants, shapes, channels):
    """The values of the bias ``add`` (an Add node, or None) adds to ``out``, a MatMul's
    output of ``channels`` columns: one constant per column, broadcast along the rows only;
    else None."""
    if add is None or add.op_type != "Add" or add.attrs or len(add.inputs) != 2 \
            or add.inputs.count(out) != 1:
        return None
    other = constants.get(add.inputs[1 - add.inputs.index(out)])
    if (other is None or other.dtype.kind != "f" or other.size != channels
            or other.shape[-1:] != (channels,)
            or shapes.get(add.outputs[0]) != shapes.get(out)):
        return None
    return other.reshape(channels).astype(np.float64)
