"""NCHW or channels last to channel blocks and back, and NCHW to channels last and back, in
compiled code, over units of a tensor (image and block, or image and run of pixels), in parts
on cso's threads: NCHW by the block transpose of ``microkernels.transpose``, channels last to
blocks a vector a pixel.

A block of L channels (the vector lanes) is, per L pixels, an L x L transpose between the NCHW
planes (a channel a row, H*W apart) and the blocked pixels (a pixel a row of L lanes) or the
channels-last ones (a pixel a row of C channels, the block's L of them): vector loads, shuffles
and stores, where NumPy's strided copy moves an element at a time (docs/design/layouts.md has
the figures). Edges (a last block of fewer channels, a last run of fewer pixels) go masked; a
last block's padding lanes are zeroed first."""
import os
from functools import lru_cache

import numpy as np

from microkernels import TransposeSpec, transpose
from microkernels.dtypes import dtype_name
from microkernels.isa import ISA_ENV, default_isa
from microkernels.jit import native_function
from microkernels.loop_ir import LoopCode

from .jobs import data_address, run_parts
from .pool import MAX_PARTS
from .threads import get_num_threads

MIN_PART = 16384   # elements a part moves at least: a smaller share costs more to hand out
PART_ARGS = ("x", "out", "units", "per_image", "blocks", "channels", "pixels", "to_pixels", "kind",
             "parts")
RUN_PIXELS = 64   # pixels a unit moves between NCHW and channels last (a multiple of the lanes)
# what a reorder moves between (``kind``): NCHW planes and blocks, channels-last pixels and
# blocks, NCHW planes and channels-last pixels; ``to_pixels``: into the second
PLANES_BLOCKS, NHWC_BLOCKS, PLANES_NHWC = 0, 1, 2


def define_reorder_part(module, spec):
    """``void reorder_part_<transpose>(int64 *args, int64 part)`` (``cso.jobs``): units of
    ``args``' share ``part`` of ``parts`` moved as ``kind`` says between NCHW (N, C, H*W),
    blocks (N, blocks, H*W, L) and channels last (N, H*W, C); into the second of the pair when
    ``to_pixels`` is set (args as ``PART_ARGS`` names them; ``spec`` a ``TransposeSpec``, L its
    lanes). A unit is (image, block), all its pixels; between NCHW and channels last (image,
    run of RUN_PIXELS pixels), all its blocks: the pixels' channels read or written whole,
    where a block's L of them in every pixel would use part of each line."""
    block_transpose = transpose.define_transpose(module, spec)
    block_transpose.linkage = "internal"
    code = LoopCode(module, f"reorder_part_{spec.name}", ("args", "part"), pointer_args=("args",))
    args, part = code.args("args", "part")
    x, out, units, per_image, blocks, channels, pixels, to_pixels, kind, parts = (
        code.load(args, k) for k in range(len(PART_ARGS)))
    lanes, item = spec.lanes, np.dtype(spec.np_dtype).itemsize
    vector = lanes * item
    by_runs = kind == PLANES_NHWC
    with code.range(units * part // parts, units * (part + 1) // parts) as unit:
        n, a = unit // per_image, unit % per_image
        p_lo = code.choose(by_runs, a * RUN_PIXELS, 0)
        p_hi = code.choose(by_runs, code.min(pixels, p_lo + RUN_PIXELS), pixels)
        with code.range(code.choose(by_runs, 0, a), code.choose(by_runs, blocks, a + 1)) as block:
            held = code.min(lanes, channels - block * lanes)   # the block's channels
            pixel_rows = (n * blocks + block) * pixels * vector   # its pixels, in bytes
            first = (n * pixels * channels + block * lanes) * item   # its first, channels last
            with code.if_((to_pixels != 0) & (held < lanes) & ~by_runs):
                code.zero(out + pixel_rows, pixels * vector)   # the padding lanes: zero
            with code.if_else(kind == NHWC_BLOCKS) as (nhwc, nchw):
                with nhwc:   # a block's pixels L channels apart: a vector each
                    with code.range(0, pixels) as p:
                        at, other = pixel_rows + p * vector, first + p * channels * item
                        src, dst = (code.choose(to_pixels != 0, x + other, x + at),
                                    code.choose(to_pixels != 0, out + at, out + other))
                        with code.if_else(held == lanes) as (whole, part_block):
                            with whole:
                                code.copy(dst, src, vector)
                            with part_block:
                                code.copy(dst, src, held * item)
                with nchw:   # L x L transposes between the planes and the pixels, L or C apart
                    planes = (n * channels + block * lanes) * pixels * item
                    pixel_side, step = (code.choose(by_runs, first, pixel_rows),
                                        code.choose(by_runs, channels, lanes))
                    with code.range(p_lo, p_hi, lanes) as p0:
                        run = code.min(lanes, p_hi - p0)
                        at = pixel_side + p0 * step * item
                        with code.if_else(to_pixels != 0) as (into, back):
                            with into:
                                code.call(block_transpose, x + planes + p0 * item, pixels,
                                          out + at, step, held, run, 0, 0, 0)
                            with back:
                                code.call(block_transpose, x + at, step,
                                          out + planes + p0 * item, pixels, run, held, 0, 0, 0)
    code.ret()
    return code.function


def reorder_lanes(dtype):
    """The block size the compiled reorder moves for ``dtype``: the default ISA's lanes."""
    return _spec(np.dtype(dtype), os.environ.get(ISA_ENV)).lanes


def to_blocks(x, out):
    """``out`` (N, ceil(C/L), H, W, L) = ``x`` (N, C, H, W) in blocks of L =
    ``reorder_lanes`` channels, the padding lanes zero; both C-contiguous of one dtype."""
    n, c, h, w = x.shape
    return _run(x, out, n, c, h * w, True, PLANES_BLOCKS)


def to_nchw(x, out):
    """``out`` (N, C, H, W) = the blocked ``x`` (N, ceil(C/L), H, W, L) as NCHW, the padding
    lanes dropped; both C-contiguous of one dtype."""
    n, c, h, w = out.shape
    return _run(x, out, n, c, h * w, False, PLANES_BLOCKS)


def nhwc_to_blocks(x, out):
    """``out`` (N, ceil(C/L), H, W, L) = the channels-last ``x`` (N, H, W, C) in blocks of L
    channels, the padding lanes zero; both C-contiguous of one dtype."""
    n, h, w, c = x.shape
    return _run(x, out, n, c, h * w, True, NHWC_BLOCKS)


def to_nhwc(x, out):
    """``out`` (N, H, W, C) = the blocked ``x`` (N, ceil(C/L), H, W, L) channels last, the
    padding lanes dropped; both C-contiguous of one dtype."""
    n, h, w, c = out.shape
    return _run(x, out, n, c, h * w, False, NHWC_BLOCKS)


def nchw_to_nhwc(x, out):
    """``out`` (N, H, W, C) = ``x`` (N, C, H, W) channels last; both C-contiguous of one
    dtype."""
    n, c, h, w = x.shape
    return _run(x, out, n, c, h * w, True, PLANES_NHWC)


def nhwc_to_nchw(x, out):
    """``out`` (N, C, H, W) = the channels-last ``x`` (N, H, W, C) as NCHW; both C-contiguous
    of one dtype."""
    n, c, h, w = out.shape
    return _run(x, out, n, c, h * w, False, PLANES_NHWC)


@lru_cache(maxsize=None)
def _spec(dtype, isa_setting):
    """The transpose's spec for ``dtype`` on the default ISA, which ``isa_setting``
    (``$CSO_ISA``) decides."""
    return TransposeSpec(dtype_name(dtype), default_isa().name)


@lru_cache(maxsize=None)
def _address(dtype, isa_setting):
    return native_function(define_reorder_part, _spec(dtype, isa_setting)).address


def _run(x, out, n, channels, pixels, to_pixels, kind):
    setting = os.environ.get(ISA_ENV)
    blocks = -(-channels // _spec(x.dtype, setting).lanes)
    per_image = -(-pixels // RUN_PIXELS) if kind == PLANES_NHWC else blocks
    units = n * per_image
    if units == 0 or pixels == 0 or channels == 0:
        return out
    parts = max(1, min(get_num_threads(), units, max(x.size, out.size) // MIN_PART, MAX_PARTS))
    args = np.array([data_address(x), data_address(out), units, per_image, blocks, channels,
                     pixels, int(to_pixels), kind, parts], np.int64)
    run_parts(_address(x.dtype, setting), data_address(args), parts,
              get_num_threads(), keep=(args,))
    return out
