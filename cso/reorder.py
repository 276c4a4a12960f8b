"""NCHW or channels last to channel blocks and back in compiled code, over a tensor's (image,
block) units, in parts on cso's threads: NCHW by the block transpose of
``microkernels.transpose``, channels last a vector a pixel.

A block of L channels (the vector lanes) is, per L pixels, an L x L transpose between the NCHW
planes (a channel a row, H*W apart) and the blocked pixels (a pixel a row of L lanes): vector
loads, shuffles and stores, where NumPy's strided copy moves an element at a time
(docs/design/layouts.md has the figures). Edges (a last block of fewer channels, a last run of
fewer pixels) go masked; a last block's padding lanes are zeroed first."""
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
PART_ARGS = ("x", "out", "units", "blocks", "channels", "pixels", "to_blocks", "channels_last",
             "parts")


def define_reorder_part(module, spec):
    """``void reorder_part_<transpose>(int64 *args, int64 part)`` (``cso.jobs``): units
    (image, block) of ``args``' share ``part`` of ``parts`` moved between blocks (N, blocks,
    H*W, L) and NCHW (N, C, H*W), or channels last (N, H*W, C) when ``channels_last`` is
    set; into blocks when ``to_blocks`` is (args as ``PART_ARGS`` names them; ``spec`` a
    ``TransposeSpec``, L its lanes)."""
    block_transpose = transpose.define_transpose(module, spec)
    block_transpose.linkage = "internal"
    code = LoopCode(module, f"reorder_part_{spec.name}", ("args", "part"), pointer_args=("args",))
    args, part = code.args("args", "part")
    x, out, units, blocks, channels, pixels, to_blocks, channels_last, parts = (
        code.load(args, k) for k in range(len(PART_ARGS)))
    lanes, item = spec.lanes, np.dtype(spec.np_dtype).itemsize
    vector = lanes * item
    with code.range(units * part // parts, units * (part + 1) // parts) as unit:
        n, block = unit // blocks, unit % blocks
        held = code.min(lanes, channels - block * lanes)   # the block's channels
        pixel_rows = unit * pixels * vector                 # its pixels, in bytes
        with code.if_((to_blocks != 0) & (held < lanes)):   # the padding lanes: zero
            code.zero(out + pixel_rows, pixels * vector)
        with code.if_else(channels_last != 0) as (nhwc, nchw):
            with nhwc:   # a block's pixels L channels apart: a vector each
                first = (n * pixels * channels + block * lanes) * item
                with code.range(0, pixels) as p:
                    at, other = pixel_rows + p * vector, first + p * channels * item
                    src, dst = (code.choose(to_blocks != 0, x + other, x + at),
                                code.choose(to_blocks != 0, out + at, out + other))
                    with code.if_else(held == lanes) as (whole, part_block):
                        with whole:
                            code.copy(dst, src, vector)
                        with part_block:
                            code.copy(dst, src, held * item)
            with nchw:   # L x L transposes between the planes and the pixels
                planes = (n * channels + block * lanes) * pixels * item
                with code.range(0, pixels, lanes) as p0:
                    run = code.min(lanes, pixels - p0)
                    with code.if_else(to_blocks != 0) as (into, back):
                        with into:
                            code.call(block_transpose, x + planes + p0 * item, pixels,
                                      out + pixel_rows + p0 * vector, lanes, held, run, 0, 0, 0)
                        with back:
                            code.call(block_transpose, x + pixel_rows + p0 * vector, lanes,
                                      out + planes + p0 * item, pixels, run, held, 0, 0, 0)
    code.ret()
    return code.function


def reorder_lanes(dtype):
    """The block size the compiled reorder moves for ``dtype``: the default ISA's lanes."""
    return _spec(np.dtype(dtype), os.environ.get(ISA_ENV)).lanes


def to_blocks(x, out):
    """``out`` (N, ceil(C/L), H, W, L) = ``x`` (N, C, H, W) in blocks of L =
    ``reorder_lanes`` channels, the padding lanes zero; both C-contiguous of one dtype."""
    return _run(x, out, x.shape[1], True, False)


def to_nchw(x, out):
    """``out`` (N, C, H, W) = the blocked ``x`` (N, ceil(C/L), H, W, L) as NCHW, the padding
    lanes dropped; both C-contiguous of one dtype."""
    return _run(x, out, out.shape[1], False, False)


def nhwc_to_blocks(x, out):
    """``out`` (N, ceil(C/L), H, W, L) = the channels-last ``x`` (N, H, W, C) in blocks of L
    channels, the padding lanes zero; both C-contiguous of one dtype."""
    return _run(x, out, x.shape[3], True, True)


def to_nhwc(x, out):
    """``out`` (N, H, W, C) = the blocked ``x`` (N, ceil(C/L), H, W, L) channels last, the
    padding lanes dropped; both C-contiguous of one dtype."""
    return _run(x, out, out.shape[3], False, True)


@lru_cache(maxsize=None)
def _spec(dtype, isa_setting):
    """The transpose's spec for ``dtype`` on the default ISA, which ``isa_setting``
    (``$CSO_ISA``) decides."""
    return TransposeSpec(dtype_name(dtype), default_isa().name)


@lru_cache(maxsize=None)
def _address(dtype, isa_setting):
    return native_function(define_reorder_part, _spec(dtype, isa_setting)).address


def _run(x, out, channels, into_blocks, channels_last):
    blocked = out if into_blocks else x
    n, blocks, h, w, lanes = blocked.shape
    if n * blocks == 0 or h * w == 0:
        return out
    units, pixels = n * blocks, h * w
    parts = max(1, min(get_num_threads(), units, blocked.size // MIN_PART, MAX_PARTS))
    args = np.array([data_address(x), data_address(out), units, blocks, channels, pixels,
                     int(into_blocks), int(channels_last), parts], np.int64)
    run_parts(_address(x.dtype, os.environ.get(ISA_ENV)), data_address(args), parts,
              get_num_threads(), keep=(args,))
    return out
