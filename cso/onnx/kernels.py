"""Compiled kernels for the operators that cost the most around a model's convolutions:
MaxPool and AveragePool, LRN, and a per-channel affine map (+Relu).

Each is a numba ``cfunc`` ``void part(int64 *args, int64 part)`` that cso's own thread pool
runs (``cso.threads.run_parts``), on ``cso.get_num_threads()`` threads like the convolutions:
NumPy would run them on one thread, in several passes over memory, and a second thread pool
would spin on the cores the convolutions use. ``args`` holds the arrays' addresses and the
geometry; each part takes a contiguous share of the work (channel planes, or for LRN, whose
window runs along the channels, blocks of pixels). A kernel is compiled for a dtype on its
first use and cached on disk by numba (``cache=True``).
"""
import math

import numpy as np
from numba import cfunc, from_dtype, njit, types
from numba.extending import intrinsic

from microkernels.once import compiled_once

from ..threads import run_parts

PART_SIGNATURE = types.void(types.CPointer(types.int64), types.int64)
PARTS_PER_THREAD = 4   # shares smaller than a thread's so that an uneven part evens out
LRN_BLOCK = 256        # pixels an LRN part sums over at a time: channels x block stay in L2


@intrinsic
def _pointer(typingctx, address, dtype):
    """``address`` (an int64) as a pointer to ``dtype``'s elements."""
    pointer = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(types.int64, dtype), codegen


@njit(inline="always")
def _larger(acc, value):
    """max(acc, value) as one x86 max instruction (a NaN ``value`` is skipped, as
    onnxruntime's MLAS does); on a value in a register, not in memory, where LLVM would make
    the comparison a slow masked store."""
    return value if value > acc else acc


@njit(inline="always")
def _share(part, parts, total):
    """[start, stop) of part ``part`` of ``parts`` near-equal shares of ``total``."""
    return part * total // parts, (part + 1) * total // parts


@njit(inline="always")
def _taps(first, count, size, stride):
    """[lo, hi) of the outputs o whose tap o * stride + first (``first`` the tap's offset
    for output 0) lies in [0, size), over ``count`` outputs."""
    lo = 0 if first >= 0 else (-first + stride - 1) // stride
    hi = 0 if size <= first else min(count, (size - 1 - first) // stride + 1)
    return lo, max(lo, hi)


def _pool_part(kind, dtype, kh, kw, sw, dw):
    """The pool part function of ``kind`` "max" or "average" for windows of ``kh`` x ``kw``
    taps ``dw`` columns apart, ``sw`` columns from one output to the next: constants, so that
    the taps unroll and the loop along an output row vectorises, each output reduced in a
    register. Args: x, out, planes, H, W, OH, OW, sh, dh, top, left, then for "average" the
    rows [row_lo, row_hi) and columns [col_lo, col_hi) a window's divisor counts, and the
    parts. The windows of a row that hang over the image's edges take a path that checks
    each tap."""
    typ = from_dtype(dtype)
    is_max = kind == "max"
    lowest = typ(-np.inf if dtype.kind == "f" else np.iinfo(dtype).min)
    full = typ(1 / (kh * kw)) if not is_max else typ(1)

    def part(args, index):
        x, out = _pointer(args[0], typ), _pointer(args[1], typ)
        h, w, oh, ow, sh, dh, top, left = (args[3], args[4], args[5], args[6], args[7],
                                           args[8], args[9], args[10])
        row_lo, row_hi, col_lo, col_hi = args[11], args[12], args[13], args[14]
        # the outputs [inside_lo, inside_hi) of a row whose windows lie inside it
        inside_lo = _taps(-left, ow, w, sw)[0]
        inside_hi = max(inside_lo, _taps((kw - 1) * dw - left, ow, w, sw)[1])
        first, last = _share(index, args[15], args[2])
        for plane in range(first, last):
            for r in range(oh):
                at = (plane * oh + r) * ow          # out[at + o]
                y0 = r * sh - top
                inside = y0 >= 0 and y0 + (kh - 1) * dh < h
                lo, hi = (inside_lo, inside_hi) if inside else (0, 0)
                start = (plane * h + y0) * w - left   # the window of output o: x[start + o * sw]
                for o in range(lo, hi):
                    acc = x[start + o * sw]
                    for i in range(kh):
                        for j in range(kw):
                            if i or j:
                                value = x[start + o * sw + i * dh * w + j * dw]
                                acc = _larger(acc, value) if is_max else acc + value
                    out[at + o] = acc if is_max else acc * full
                o = 0
                while o < ow:   # the windows over an edge, tap by tap
                    if o == lo < hi:
                        o = hi
                        continue
                    x0 = o * sw - left
                    acc = lowest if is_max else typ(0)
                    for i in range(kh):
                        y = y0 + i * dh
                        for j in range(kw):
                            column = x0 + j * dw
                            if 0 <= y < h and 0 <= column < w:
                                value = x[(plane * h + y) * w + column]
                                acc = _larger(acc, value) if is_max else acc + value
                    if not is_max:   # the taps inside [row_lo, row_hi) x [col_lo, col_hi)
                        acc /= ((min(y0 + kh, row_hi) - max(y0, row_lo))
                                * (min(x0 + kw, col_hi) - max(x0, col_lo)))
                    out[at + o] = acc
                    o += 1
    return part


def _lrn_part(dtype):
    """The LRN part function; args: x, out, N, C, pixels, the float64 [alpha / size, beta,
    bias] address, channels before and after each channel's, the parts."""
    typ = from_dtype(dtype)

    def part(args, index):
        x, out = _pointer(args[0], typ), _pointer(args[1], typ)
        n, c, pixels, before, after = args[2], args[3], args[4], args[6], args[7]
        constants = _pointer(args[5], types.float64)
        scale, beta, bias = typ(constants[0]), constants[1], typ(constants[2])
        blocks = (pixels + LRN_BLOCK - 1) // LRN_BLOCK
        first, last = _share(index, args[8], n * blocks)
        for job in range(first, last):
            image, block = job // blocks, job % blocks
            start = block * LRN_BLOCK
            length = min(pixels - start, LRN_BLOCK)
            for k in range(c):     # out holds the window's sum of squares first
                total = (image * c + k) * pixels + start
                for p in range(length):
                    out[total + p] = 0
                for m in range(max(0, k - before), min(c, k + after + 1)):
                    source = (image * c + m) * pixels + start
                    for p in range(length):
                        out[total + p] += x[source + p] * x[source + p]
            for k in range(c):
                at = (image * c + k) * pixels + start
                if beta == 0.75:   # the usual exponent, as square roots (they vectorise)
                    for p in range(length):
                        base = bias + scale * out[at + p]
                        out[at + p] = x[at + p] / (math.sqrt(base) * math.sqrt(math.sqrt(base)))
                else:
                    for p in range(length):
                        out[at + p] = x[at + p] * (bias + scale * out[at + p]) ** -beta
    return part


def _affine_part(relu, dtype):
    """The per-channel ``x * scale + shift`` (then Relu) part function; args: x, out,
    planes, C, pixels, scale and shift addresses (in the dtype), the parts."""
    typ = from_dtype(dtype)
    zero = dtype.type(0)

    def part(args, index):
        x, out = _pointer(args[0], typ), _pointer(args[1], typ)
        c, pixels = args[3], args[4]
        scale, shift = _pointer(args[5], typ), _pointer(args[6], typ)
        first, last = _share(index, args[7], args[2])
        for plane in range(first, last):
            a, b = scale[plane % c], shift[plane % c]
            at = plane * pixels
            for p in range(pixels):
                value = x[at + p] * a + b
                out[at + p] = (value if value > zero else zero) if relu else value
    return part


@compiled_once
def _compiled(maker, *key):
    """``maker(*key)``'s part function compiled, once per process (and kept: the pool calls
    its address)."""
    return cfunc(PART_SIGNATURE, cache=True, error_model="numpy")(maker(*key))


def _run(function, args, work, threads):
    """Run ``function`` over ``work`` units in parts on up to ``threads`` threads; ``args``
    (int64) ends with the part count, which is set here."""
    parts = max(1, min(work, threads * PARTS_PER_THREAD if threads > 1 else 1))
    args[-1] = parts
    run_parts(function, args.ctypes.data, parts, threads)


def pool(kind, x, out, kernel, strides, dilations, head, count_bounds, threads):
    """``out`` (N, C, OH, OW) = the ``kind`` ("max" or "average") pool of ``x`` (N, C, H, W),
    both C-contiguous: windows of ``kernel`` taps at ``strides`` and ``dilations``, the first
    starting ``head`` = (top, left) before the image; an average divides by the taps inside
    ``count_bounds`` ((row_lo, row_hi), (col_lo, col_hi)), in the image's coordinates (None
    for "max")."""
    n, c, h, w = x.shape
    (row_lo, row_hi), (col_lo, col_hi) = count_bounds or ((0, 0), (0, 0))
    args = np.array([x.ctypes.data, out.ctypes.data, n * c, h, w, *out.shape[2:], strides[0],
                     dilations[0], *head, row_lo, row_hi, col_lo, col_hi, 0], np.int64)
    function = _compiled(_pool_part, kind, x.dtype, *kernel, strides[1], dilations[1])
    _run(function.address, args, n * c, threads)
    return out


def lrn(x, out, size, alpha, beta, bias, threads):
    """``out`` = ``x`` (N, C, ...) / (bias + alpha / size * the sum of squares over ``size``
    channels around each) ** beta, both C-contiguous."""
    n, c = x.shape[:2]
    pixels = x[0, 0].size
    constants = np.array([alpha / size, beta, bias], np.float64)
    args = np.array([x.ctypes.data, out.ctypes.data, n, c, pixels, constants.ctypes.data,
                     (size - 1) // 2, size // 2, 0], np.int64)
    _run(_compiled(_lrn_part, x.dtype).address, args, n * -(-pixels // LRN_BLOCK), threads)
    return out


def affine(x, out, scale, shift, relu, threads):
    """``out`` = ``x`` (N, C, ...) * ``scale`` + ``shift`` (C values each, in x's dtype), then
    Relu if ``relu``; ``out`` may be ``x``."""
    n, c = x.shape[:2]
    pixels = x[0, 0].size
    args = np.array([x.ctypes.data, out.ctypes.data, n * c, c, pixels, scale.ctypes.data,
                     shift.ctypes.data, 0], np.int64)
    _run(_compiled(_affine_part, bool(relu), x.dtype).address, args, n * c, threads)
    return out
