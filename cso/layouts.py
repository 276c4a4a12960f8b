"""Activation layouts besides NCHW: channel-blocked arrays (``Blocked``) that convolutions read
and write directly, and channels-last (NHWC) arrays in and out.

A ``Blocked`` holds an N x C x H x W tensor as ``data`` of shape N x ceil(C/B) x H x W x B: B
channels a block, each pixel's block contiguous (NCHWc, as onnxruntime and oneDNN keep
activations between layers). B is the vector width in floats of the kernels that wrote it (16
on AVX-512, 8 on AVX2, 4 on NEON; ``block_size``), so that a convolution loads a block as one
vector of filters' outputs and broadcasts an input pixel's channel from it, without packing.
The channels past C in the last block are padding: a convolution writes them (as the output of
zero filters) and never reads them into a result, so they hold finite values, not necessarily
zeros. A chain of convolutions on ``Blocked`` values reorders nothing between them:

    x = cso.Blocked.from_nchw(image)          # once, at the input
    y = conv2(conv1(x))                       # Conv2d calls: Blocked in, Blocked out
    result = y.to_nchw()                      # once, at the output

Any block size is read correctly (a ``Blocked`` pickled on an AVX-512 machine and loaded on an
AVX2 one is re-blocked on its way in, when the kernels cannot read its blocks as they are).
A channels-last (NHWC) array is the blocked layout with one block of all C channels:
``Blocked.from_nhwc`` wraps one without a copy, and ``Conv2d(...)(x, layout="nhwc")`` takes
and returns NHWC arrays.
"""
from types import SimpleNamespace

import numpy as np

from csa import DepthwisePlan
from csa.layout import blocked_fits, merged_groups, padded_groups, subsampled
from microkernels.aligned import aligned_empty

from . import reorder
from .arguments import FLOAT_DTYPES, check_array, conv_spec, padding_rule
from .reorder import reorder_lanes
from .host import host_machine

LAYOUTS = ("nchw", "nhwc", "blocked")   # what a call's ``out_layout`` may ask for


def block_size(dtype, isa=None):
    """Channels a block for ``dtype`` on kernel ISA ``isa`` (default: the host's): its vector
    lanes."""
    return host_machine(isa).vector_bytes // np.dtype(dtype).itemsize


def has_blocked_plan(weight_shape, groups, dtype, isa=None):
    """Whether a convolution of OIHW ``weight_shape`` and ``groups`` runs on blocked values
    directly (``csa.layout.blocked_fits`` for blocks of ``block_size(dtype, isa)``), not
    through NCHW."""
    k, c_per_group = weight_shape[:2]
    return blocked_fits(SimpleNamespace(groups=groups, c_per_group=c_per_group,
                                        k_per_group=k // groups), block_size(dtype, isa))


def merged_on_blocks(spec, isa=None):
    """How many groups of ``spec`` (a ``csa.ConvSpec``) its blocked calls run as one group of
    whole blocks (``csa.layout.merged_groups``, ``Conv2d._merged``) with kernels of ``isa``
    (default: the host's), on an output plane of at most the record's
    ``merged_groups_max_plane`` pixels; 1 where they do not."""
    m = merged_groups(spec, block_size(spec.dtype, isa))
    if m > 1 and spec.p * spec.q <= host_machine(isa).tuning.merged_groups_max_plane:
        return m
    return 1


def runs_padded_merge(spec, isa=None):
    """Whether calls of ``spec`` on NCHW planes, channels last or blocks of other lanes, whose
    groups merge onto blocks (``merged_on_blocks``) padded with zero groups
    (``csa.layout.padded_groups``), run that merge: on an output plane of at most the
    record's ``padded_merge_max_plane`` pixels. Channels-last input (and other blocks) is
    copied into blocks of the kernels' lanes first, where RegNet's groups of 8 channels (of 4
    on the AVX2 kernels) ran 1.1-2.6x the NCHW plan with reorders around it; NCHW planes are
    read by the merge's slab fills and its output written as planes from each band (where its
    groups are one block each: ``Conv2d._nchw_on_blocks``), 1.1-2x the NCHW plan at 1 thread
    (csa/TUNING.md, "Groups merged onto blocks")."""
    return spec.p * spec.q <= host_machine(isa).tuning.padded_merge_max_plane


def merges_in_whole(weight_shape, groups, input_shape, dtype, stride, padding, dilation,
                    isa=None):
    """Whether a convolution of OIHW ``weight_shape``, ``groups``, on an input of
    ``input_shape`` (N, C, H, W; ``padding`` as ``Conv2d`` takes it) runs its blocked calls
    with its groups merged onto whole blocks, in whole merges (``merged_on_blocks``; a
    merge padded with zero groups reads blocks only, not NCHW planes)."""
    dtype = np.dtype(dtype)
    spec = conv_spec(input_shape, dtype, weight_shape, dtype, stride, padding_rule(padding),
                     dilation, groups)
    m = merged_on_blocks(spec, isa)
    return m > 1 and not padded_groups(spec, m)


class Blocked:
    """An N x C x H x W tensor held channel-blocked (see the module's docstring): ``data``, a
    C-contiguous N x ceil(C/B) x H x W x B array, and ``channels``, C."""

    __slots__ = ("data", "channels")

    def __init__(self, data, channels):
        if not isinstance(data, np.ndarray) or data.ndim != 5:
            raise TypeError(f"Blocked data must be a 5-D numpy.ndarray (N, C/B, H, W, B), got "
                            f"{type(data).__name__} of shape {getattr(data, 'shape', None)}")
        if data.dtype not in (np.float32, np.float64) or not data.flags.c_contiguous:
            raise TypeError(f"Blocked data must be C-contiguous float32 or float64, got "
                            f"{data.dtype} of shape {data.shape}")
        blocks, block = data.shape[1], data.shape[4]
        if (not isinstance(channels, (int, np.integer)) or isinstance(channels, bool)
                or not (blocks - 1) * block < channels <= blocks * block):
            raise ValueError(f"Blocked channels must be an int filling the last of {blocks} "
                             f"blocks of {block} (from {(blocks - 1) * block + 1} to "
                             f"{blocks * block}), got {channels!r}")
        self.data, self.channels = data, int(channels)

    @property
    def shape(self):
        """(N, C, H, W), the tensor's shape."""
        n, _, h, w, _ = self.data.shape
        return (n, self.channels, h, w)

    @property
    def block(self):
        return self.data.shape[4]

    @property
    def dtype(self):
        return self.data.dtype

    @classmethod
    def made(cls, data, channels):
        """A Blocked of ``data`` this package made right (no checks: they cost more than a
        small layer's call)."""
        value = cls.__new__(cls)
        value.data, value.channels = data, channels
        return value

    @classmethod
    def empty(cls, shape, dtype, block):
        """An uninitialised Blocked of ``shape`` (N, C, H, W), its data on a cache line."""
        n, c, h, w = shape
        return cls(aligned_empty((n, -(-c // block), h, w, block), dtype), c)

    @classmethod
    def from_nchw(cls, x, block=None):
        """``x`` (N, C, H, W) blocked by ``block`` channels (default ``block_size``), the
        padding channels zero."""
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            raise TypeError(f"from_nchw takes a 4-D numpy.ndarray (N, C, H, W), got "
                            f"{type(x).__name__} of shape {getattr(x, 'shape', None)}")
        block = block_size(x.dtype) if block is None else block
        if not isinstance(block, (int, np.integer)) or isinstance(block, bool) or block < 1:
            raise ValueError(f"block must be a positive int (channels a block), got {block!r}")
        n, c, h, w = x.shape
        result = cls.empty(x.shape, x.dtype, block)
        if x.dtype in FLOAT_DTYPES and x.flags.c_contiguous and block == reorder_lanes(x.dtype):
            reorder.to_blocks(x, result.data)
            return result
        padded = -(-c // block) * block
        if padded > c:
            result.data[:, -1, :, :, c - padded:] = 0
        full, rest = divmod(c, block)
        view = result.data.transpose(0, 1, 4, 2, 3)   # N, C/B, B, H, W
        view[:, :full] = x[:, :full * block].reshape(n, full, block, h, w)
        if rest:
            view[:, full, :rest] = x[:, full * block:]
        return result

    @classmethod
    def from_nhwc(cls, x):
        """``x`` (N, H, W, C), C-contiguous, as one block of all C channels: a view, no copy."""
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            raise TypeError(f"from_nhwc takes a 4-D numpy.ndarray (N, H, W, C), got "
                            f"{type(x).__name__} of shape {getattr(x, 'shape', None)}")
        n, h, w, c = x.shape
        return cls(np.ascontiguousarray(x).reshape(n, 1, h, w, c), c)

    def to_nchw(self):
        """The tensor as a new C-contiguous (N, C, H, W) array."""
        n, c, h, w = self.shape
        if self.block == reorder_lanes(self.dtype):
            return reorder.to_nchw(self.data, np.empty(self.shape, self.dtype))
        if self.data.shape[1] == 1 and self.block == c:   # channels last
            return to_nchw(self.data.reshape(n, h, w, c), "nhwc")
        padded = self.data.shape[1] * self.block
        flat = self.data.transpose(0, 1, 4, 2, 3).reshape(n, padded, h, w)
        return np.ascontiguousarray(flat[:, :c])

    def to_nhwc(self):
        """The tensor as a C-contiguous (N, H, W, C) array: a view of ``data`` when it is one
        block of exactly C channels, else a copy."""
        n, c, h, w = self.shape
        if self.data.shape[1] == 1 and self.block == c:
            return self.data.reshape(n, h, w, c)
        if self.block == reorder_lanes(self.dtype):
            return reorder.to_nhwc(self.data, np.empty((n, h, w, c), self.dtype))
        flat = self.data.transpose(0, 2, 3, 1, 4).reshape(n, h, w, self.data.shape[1] * self.block)
        return np.ascontiguousarray(flat[..., :c])

    def reblocked(self, block):
        """The tensor in blocks of ``block`` channels (itself when they are already)."""
        if block == self.block:
            return self
        n, c, h, w = self.shape
        if self.data.shape[1] == 1 and self.block == c and block == reorder_lanes(self.dtype):
            result = Blocked.empty(self.shape, self.dtype, block)   # channels last: one pass
            reorder.nhwc_to_blocks(self.data.reshape(n, h, w, c), result.data)
            return result
        return Blocked.from_nchw(self.to_nchw(), block)

    def __reduce__(self):
        return Blocked, (self.data, self.channels)

    def __repr__(self):
        return (f"Blocked(shape={self.shape}, block={self.block}, dtype={self.dtype})")


# --- what Conv2d calls on values of these layouts need ------------------------------------

def input_layout(x, layout):
    """The layout of call input ``x``: a ``Blocked``'s, else ``layout`` (default "nchw")."""
    if isinstance(x, Blocked):
        if layout not in (None, "blocked"):
            raise ValueError(f"layout={layout!r} describes an array input; the input is a "
                             f"cso.Blocked")
        return "blocked"
    if layout is None:
        return "nchw"
    if layout not in ("nchw", "nhwc"):
        raise ValueError(f"layout must be 'nchw' or 'nhwc' (an array input's), got {layout!r}")
    return layout


def check_layout(name, value):
    if value not in LAYOUTS:
        raise ValueError(f"{name} must be one of {LAYOUTS}, got {value!r}")
    return value


def merged(shape, rows):
    """The data ``shape`` (NCHW, or blocked N, blocks, H, W, B) with ``rows`` of its rows
    merged into one (a plain 1x1's plane: the same pixels)."""
    return shape[:2] + (shape[2] // rows, shape[3] * rows) + tuple(shape[4:])


def reads_blocks(plan, block):
    """Whether ``plan``'s loop nest reads input blocks of ``block`` channels as they are: an
    NCHW input (blocks of one), the kernels' own blocks, or channels last (one block of all
    channels: read in place, each channel tile from its first channel in the pixel, or its
    pixels' channel tile moved into the slab's blocks); a strided 1x1's channels last only as
    one channel tile of one group, its slab holding the windows' whole pixels."""
    s = plan.spec
    if isinstance(plan, DepthwisePlan):   # (its fill moves NCHW and channels last into blocks)
        return block in (1, plan.lanes, s.c)
    return (block in (1, plan.lanes)
            or (block == s.c and (not subsampled(s)
                                  or (s.groups == 1 and plan.channel_tiles == 1))))


def unblock_into(data, out):
    """``out`` (N, C, H, W) = the blocked ``data`` (N, ceil(C/L), H, W, L) as NCHW, both
    C-contiguous of one dtype, L the kernels' lanes (``block_size``): compiled
    (``cso.reorder``), on cso's threads, a job a recording keeps."""
    lanes = reorder_lanes(data.dtype)
    if (data.shape[4] != lanes or not data.flags.c_contiguous or not out.flags.c_contiguous
            or out.dtype != data.dtype or out.shape[:1] + out.shape[2:] != data.shape[:1]
            + data.shape[2:4] or -(-out.shape[1] // lanes) != data.shape[1]):
        raise ValueError(f"unblock_into takes C-contiguous blocks of {lanes} channels and an "
                         f"NCHW out of their shape and dtype, got data {data.shape} "
                         f"{data.dtype}, out {out.shape} {out.dtype}")
    return reorder.to_nchw(data, out)


def check_out(out, out_layout, shape, dtype, block):
    """ValueError unless ``out`` is None or holds a result of NCHW ``shape`` in
    ``out_layout``: a Blocked of the kernels' ``block``, or an array (C-contiguous for
    NHWC, which the kernels write in place)."""
    if out is None:
        return
    if out_layout == "blocked":
        if not isinstance(out, Blocked) or out.shape != shape or out.block != block \
                or out.dtype != dtype or not out.data.flags.writeable:
            raise ValueError(f"out must be a writeable cso.Blocked of shape {shape}, block "
                             f"{block} and dtype {dtype}, got {out!r}")
        return
    check_array("out", out)
    expected = shape if out_layout == "nchw" else (shape[0], shape[2], shape[3], shape[1])
    if out.shape != expected or out.dtype != dtype:
        raise ValueError(f"out must have shape {expected} ({out_layout.upper()}) and dtype "
                         f"{dtype}, got {out.shape} {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"out must be writeable (an array of shape {out.shape})")
    if out_layout == "nhwc" and not out.flags.c_contiguous:
        raise ValueError(f"out (NHWC) must be a C-contiguous array, got strides "
                         f"{out.strides}")


def to_nchw(value, layout):
    """A ``Blocked``, or an array laid out as ``layout``, as an NCHW array."""
    if isinstance(value, Blocked):
        return value.to_nchw()
    if layout != "nhwc":
        return value
    n, h, w, c = value.shape
    return _relaid(value, (n, c, h, w), reorder.nhwc_to_nchw, (0, 3, 1, 2))


def from_nchw(value, layout, block):
    """An NCHW array as ``layout`` (a ``Blocked`` of ``block`` for "blocked")."""
    if layout == "blocked":
        return Blocked.from_nchw(value, block)
    if layout != "nhwc":
        return value
    n, c, h, w = value.shape
    return _relaid(value, (n, h, w, c), reorder.nchw_to_nhwc, (0, 2, 3, 1))


def _relaid(x, shape, compiled, axes):
    """``x``'s values in a new C-contiguous array of ``shape``: moved by ``compiled`` (a
    ``cso.reorder`` function) for the float dtypes, else by NumPy's transpose ``axes``."""
    if x.dtype in FLOAT_DTYPES and x.flags.c_contiguous:
        return compiled(x, np.empty(shape, x.dtype))
    return np.ascontiguousarray(x.transpose(axes))


def written(result, out):
    """``result``, or written into ``out`` (a Blocked's data, or an array) and ``out``."""
    if out is None:
        return result
    if isinstance(out, Blocked):
        out.data[...] = result.data
    else:
        out[...] = result
    return out
