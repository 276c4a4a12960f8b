"""Compiled kernels for the operators that cost the most around a model's convolutions:
MaxPool and AveragePool, their global forms (also ReduceMean, ReduceSum and ReduceMax over
the spatial axes), LRN, LayerNormalization, a per-channel affine map (+Relu), a copy, a matrix
transpose (a Gemm's rows to a convolution's columns), and Softmax (cheap, but as a kernel a
recorded program replays it: no Python after the last convolution).

Each is a numba ``cfunc`` ``void part(int64 *args, int64 part)`` that cso's own thread pool
runs (``cso.jobs.run_parts``), on ``cso.get_num_threads()`` threads like the convolutions:
NumPy would run them on one thread, in several passes over memory, and a second thread pool
would spin on the cores the convolutions use. ``args`` holds the arrays' addresses and the
geometry; each part takes a contiguous share of the work (channel planes, or for LRN, whose
window runs along the channels, blocks of pixels).

A kernel is compiled by numba for its key (a dtype, a window...) on its first use, and its
object code kept in cso's persistent cache like the convolutions' kernels
(``microkernels.cache``): a later process loads it with llvmlite (``microkernels.jit``), never
setting up numba's compiler, whose CPU target alone takes about 0.35 s to initialise on its
first compilation or disk-cache load in a process (``_compiled``). With cso's cache off, numba
compiles and caches the kernels itself (``cache=True``).
"""
import builtins
import hashlib
import math
from functools import lru_cache
from pathlib import Path

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import _dynfunc, _helperlib, cfunc, from_dtype, njit, types
from numba.core import cgutils, config, intrinsics
from numba.extending import intrinsic

from ..jobs import (LINE, PAGE, ForeignFunction, aligned_empty, compiled_once, data_address,
                    part_stride, run_parts)

PART_SIGNATURE = types.void(types.CPointer(types.int64), types.int64)
PARTS_PER_THREAD = 4   # shares smaller than a thread's so that an uneven part evens out
VECTOR_BYTES = 32      # a pool pass's vectors: AVX2's (twice NEON's, half AVX-512's)
LRN_BLOCK = 256        # pixels an LRN part sums over at a time: channels x block stay in L2
TRANSPOSE_BLOCK = 16   # a transpose goes in squares of this side: whole lines read and written


@intrinsic
def _pointer(typingctx, address, dtype):
    """``address`` (an int64) as a pointer to ``dtype``'s elements."""
    pointer = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(types.int64, dtype), codegen


@njit(inline="always")
def _larger(acc, value):
    """max(acc, value), a NaN in either giving NaN (as NumPy's max and PyTorch's max pools; so
    GlobalMaxPool and MaxPool agree); on a value in a register, not in memory, where LLVM
    would make the comparison a slow masked store."""
    return value if value > acc or value != value else acc


@njit(inline="always")
def _share(part, parts, total):
    """[start, stop) of part ``part`` of ``parts`` near-equal shares of ``total``."""
    return part * total // parts, (part + 1) * total // parts


@njit(inline="always")
def _taps_inside(y0, taps, dilation, size):
    """[first, end) of the ``taps`` taps ``dilation`` apart from ``y0`` that lie in [0,
    ``size``) (no divisions)."""
    first, end = 0, taps
    while first < taps and y0 + first * dilation < 0:
        first += 1
    while end > first and y0 + (end - 1) * dilation >= size:
        end -= 1
    return first, end


@njit(inline="always")
def _counted(start, taps, low, high):
    """How many of the ``taps`` consecutive positions from ``start`` lie in [low, high): an
    average pool window's divisor along an axis."""
    return min(start + taps, high) - max(start, low)


def _reduce_vectors(is_max, scaled=False):
    """An intrinsic ``reduce(dst, src, step, count, stride, width)``: the vector of ``width``
    elements (a constant) at ``dst`` (a pointer) set to the max (``is_max``) or the sum of
    ``count`` vectors read from the addresses ``src + t * step``, each of the elements
    ``stride`` (a constant) apart; the reduction's identity when ``count`` is 0. Stride 2
    reads two vectors and keeps their even elements, so it reads an element past the last
    one it uses. A ``scaled`` sum takes two more arguments, a pointer to a vector of
    ``scales`` and a ``factor``, and multiplies by both. (numba leaves the SLP vectoriser off
    and its loop vectoriser needs rows of 32 or more.)"""

    def typed(dst, stride, width):
        """The signature and code of a call with these types, or None (see ``stride``)."""
        if not isinstance(stride, types.IntegerLiteral) or not isinstance(width,
                                                                          types.IntegerLiteral):
            return None   # numba types a constant as a literal first
        element_type, stride_value, lanes = dst.dtype, stride.literal_value, width.literal_value

        def codegen(context, builder, signature, args):
            dst_address, src, step, count = args[:4]
            scalar = context.get_value_type(element_type)
            vector = ir.VectorType(scalar, lanes)
            floating = isinstance(element_type, types.Float)
            if is_max:
                lowest = -np.inf if floating else np.iinfo(str(element_type)).min
            identity = ir.Constant(vector, [lowest if is_max else 0] * lanes)
            acc = cgutils.alloca_once_value(builder, identity)
            with cgutils.for_range(builder, count) as loop:
                address = builder.add(src, builder.mul(loop.index, step))
                pointer = builder.inttoptr(address, vector.as_pointer())
                if stride_value == 1:
                    value = builder.load(pointer, align=1)
                elif stride_value == 2:
                    pair = (builder.load(pointer, align=1),
                            builder.load(builder.gep(pointer, [ir.Constant(ir.IntType(64), 1)]),
                                         align=1))
                    value = builder.shuffle_vector(*pair, ir.Constant(
                        ir.VectorType(ir.IntType(32), lanes), list(range(0, 2 * lanes, 2))))
                else:
                    first = builder.inttoptr(address, scalar.as_pointer())
                    value = ir.Constant(vector, ir.Undefined)
                    for lane in range(lanes):
                        element = builder.gep(first, [ir.Constant(ir.IntType(64),
                                                                  lane * stride_value)])
                        value = builder.insert_element(value, builder.load(element, align=1),
                                                       ir.Constant(ir.IntType(32), lane))
                old = builder.load(acc)
                if not is_max:
                    new = builder.fadd(old, value) if floating else builder.add(old, value)
                elif floating:   # as _larger: NaN stays
                    larger = builder.or_(builder.fcmp_ordered(">", value, old),
                                         builder.fcmp_unordered("uno", value, value))
                    new = builder.select(larger, value, old)
                else:
                    compare = builder.icmp_signed if element_type.signed else \
                        builder.icmp_unsigned
                    new = builder.select(compare(">", value, old), value, old)
                builder.store(new, acc)
            result = builder.load(acc)
            if scaled:
                scales = builder.load(builder.bitcast(args[6], vector.as_pointer()), align=1)
                factor = builder.insert_element(ir.Constant(vector, ir.Undefined), args[7],
                                                ir.Constant(ir.IntType(32), 0))
                factor = builder.shuffle_vector(factor, ir.Constant(vector, ir.Undefined),
                                                ir.Constant(ir.VectorType(ir.IntType(32), lanes),
                                                            [0] * lanes))
                result = builder.fmul(builder.fmul(result, scales), factor)
            builder.store(result, builder.bitcast(dst_address, vector.as_pointer()), align=1)
            return context.get_dummy_value()
        extra = (dst, element_type) if scaled else ()
        return types.void(dst, types.int64, types.int64, types.int64, stride, width,
                          *extra), codegen

    if scaled:
        @intrinsic
        def reduce(typingctx, dst, src, step, count, stride, width, scales, factor):
            return typed(dst, stride, width)
    else:
        @intrinsic
        def reduce(typingctx, dst, src, step, count, stride, width):
            return typed(dst, stride, width)
    return reduce


_vector_max, _vector_sum = _reduce_vectors(True), _reduce_vectors(False)
_vector_scaled_sum = _reduce_vectors(False, scaled=True)


def _reduction(kind, dtype):
    """(numba type, whether a max, the reduction's identity, item bytes, lanes of a vector) of
    a pool part of ``kind`` "max", "average" or "sum" over ``dtype``: constants for its
    closure."""
    typ = from_dtype(dtype)
    is_max = kind == "max"
    identity = typ(-np.inf if dtype.kind == "f" else np.iinfo(dtype).min) if is_max else typ(0)
    return typ, is_max, identity, dtype.itemsize, VECTOR_BYTES // dtype.itemsize


def _pool_part(kind, dtype, kh, kw, sw, dw):
    """The pool part function of ``kind`` "max" or "average" for windows of ``kh`` x ``kw``
    taps ``dw`` columns apart, ``sw`` columns from one output to the next. Args: x, out,
    planes, H, W, OH, OW, sh, dh, top, left, then for "average" the rows [row_lo, row_hi) and
    columns [col_lo, col_hi) a window's divisor counts, then a scratch array of ``2 * span +
    OW`` elements per part (``_part_scratch``), ``span``, the bytes from one part's scratch
    to the next and the parts.

    Separable, each output row in two passes: the rows of its windows that lie in the image
    reduced column by column into a scratch row, which holds the image's row after ``left``
    cells of padding and before the right padding's (the reduction's identity, written once),
    then each output reduced along that row. Both go a vector of columns at a time, the last
    one overlapping the one before (each writes what it computes from its inputs alone); rows
    narrower than a vector go element by element."""
    # closure values are plain constants: numba keys its disk cache on them, and a
    # dispatcher or an intrinsic here would make a new key in every process
    typ, is_max, identity, item, lanes = _reduction(kind, dtype)

    def part(args, index):
        h, w, oh, ow, sh, dh, top, left = (args[3], args[4], args[5], args[6], args[7],
                                           args[8], args[9], args[10])
        span = args[16]
        # the part's scratch: two rows (one reduced while the other is read) and the inverse
        # column counts of an average's windows
        rows_at = args[15] + index * args[17]
        inverse_at = rows_at + 2 * span * item
        scratch, inverse = _pointer(rows_at, typ), _pointer(inverse_at, typ)
        for column in range(2 * span):
            scratch[column] = identity
        if not is_max:
            for o in range(ow):
                x0 = o * sw - left
                inverse[o] = typ(1) / typ(_counted(x0, kw, args[13], args[14]))
        first, last = _share(index, args[18], args[2])
        for plane in range(first, last):
            # row r's first pass, then row r - 1's second (whose loads then do not wait for
            # the stores just made)
            for r in range(oh + 1):
                if r < oh:   # the rows of r's windows in the image reduced into a scratch row
                    row_at = rows_at + (r & 1) * span * item
                    y0 = r * sh - top
                    i_lo, i_hi = _taps_inside(y0, kh, dh, h)
                    source = args[0] + ((plane * h + y0 + i_lo * dh) * w) * item
                    if w >= lanes:
                        for b in range(0, w, lanes):
                            c = min(b, w - lanes)
                            if is_max:
                                _vector_max(_pointer(row_at + (left + c) * item, typ),
                                            source + c * item, dh * w * item, i_hi - i_lo, 1,
                                            lanes)
                            else:
                                _vector_sum(_pointer(row_at + (left + c) * item, typ),
                                            source + c * item, dh * w * item, i_hi - i_lo, 1,
                                            lanes)
                    else:
                        row = _pointer(row_at, typ)
                        for c in range(w):
                            acc = identity
                            for i in range(i_lo, i_hi):
                                value = _pointer(source, typ)[(i - i_lo) * dh * w + c]
                                acc = _larger(acc, value) if is_max else acc + value
                            row[left + c] = acc
                if r:   # row r - 1's outputs reduced along its scratch row; an average's
                    # divided by its taps inside [row_lo, row_hi) x [col_lo, col_hi)
                    q = r - 1
                    row_at = rows_at + (q & 1) * span * item
                    y0 = q * sh - top
                    rows = typ(1) if is_max else \
                        typ(1) / typ(_counted(y0, kh, args[11], args[12]))
                    out_at = args[1] + (plane * oh + q) * ow * item
                    if ow >= lanes:
                        for b in range(0, ow, lanes):
                            o = min(b, ow - lanes)
                            if is_max:
                                _vector_max(_pointer(out_at + o * item, typ),
                                            row_at + o * sw * item, dw * item, kw, sw, lanes)
                            else:
                                _vector_scaled_sum(
                                    _pointer(out_at + o * item, typ), row_at + o * sw * item,
                                    dw * item, kw, sw, lanes, _pointer(inverse_at + o * item, typ),
                                    rows)
                    else:
                        out, row = _pointer(out_at, typ), _pointer(row_at, typ)
                        for o in range(ow):
                            acc = row[o * sw]
                            for j in range(1, kw):
                                value = row[o * sw + j * dw]
                                acc = _larger(acc, value) if is_max else acc + value
                            out[o] = acc if is_max else acc * inverse[o] * rows
    return part


def _global_pool_part(kind, dtype):
    """The global pool part function of ``kind`` "max", "average" or "sum": each of ``planes``
    rows of ``pixels`` contiguous elements reduced to one (the identity, or NaN for an average,
    when ``pixels`` is 0). Args: x, out, planes, pixels, a scratch array of a vector per part
    (``_part_scratch``), the bytes from one part's vector to the next, the parts. A vector of
    columns at a time into the part's scratch vector, then its lanes and the row's tail one by
    one."""
    typ, is_max, identity, item, lanes = _reduction(kind, dtype)
    divides = kind == "average"

    def part(args, index):
        out, pixels = _pointer(args[1], typ), args[3]
        lanes_at = args[4] + index * args[5]
        partial = _pointer(lanes_at, typ)
        whole = pixels // lanes
        first, last = _share(index, args[6], args[2])
        for plane in range(first, last):
            at = args[0] + plane * pixels * item
            if is_max:
                _vector_max(partial, at, VECTOR_BYTES, whole, 1, lanes)
            else:
                _vector_sum(partial, at, VECTOR_BYTES, whole, 1, lanes)
            acc, row = identity, _pointer(at, typ)
            for lane in range(lanes):
                acc = _larger(acc, partial[lane]) if is_max else acc + partial[lane]
            for p in range(whole * lanes, pixels):
                acc = _larger(acc, row[p]) if is_max else acc + row[p]
            out[plane] = acc / typ(pixels) if divides else acc
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


def _blocked_affine_part(relu, dtype, lanes):
    """``_affine_part`` on channel-blocked values (N, blocks, H, W, ``lanes``): each unit one
    block of one image, its scale and shift a vector of ``lanes`` (padded to whole blocks);
    args: x, out, units, blocks an image, pixels, scale and shift addresses, the parts."""
    typ = from_dtype(dtype)
    zero, vector = dtype.type(0), lanes * dtype.itemsize   # (bytes)

    def part(args, index):
        x, out = _pointer(args[0], typ), _pointer(args[1], typ)
        blocks, pixels = args[3], args[4]
        first, last = _share(index, args[7], args[2])
        for unit in range(first, last):
            scale = _pointer(args[5] + unit % blocks * vector, typ)
            shift = _pointer(args[6] + unit % blocks * vector, typ)
            at = unit * pixels * lanes
            for p in range(pixels):
                for lane in range(lanes):
                    value = x[at + p * lanes + lane] * scale[lane] + shift[lane]
                    out[at + p * lanes + lane] = (value if value > zero else zero) if relu \
                        else value
    return part


def _add_part(dtype):
    """The part function adding two arrays elementwise; args: the two inputs, the output,
    the elements, the parts (each a share of whole 64-byte lines)."""
    typ = from_dtype(dtype)
    per_line = LINE // dtype.itemsize

    def part(args, index):
        a, b, out = _pointer(args[0], typ), _pointer(args[1], typ), _pointer(args[2], typ)
        lines = -(-args[3] // per_line)
        first, last = _share(index, args[4], lines)
        for i in range(first * per_line, min(last * per_line, args[3])):
            out[i] = a[i] + b[i]
    return part


def _softmax_part(dtype):
    """The Softmax part function: each of ``rows`` contiguous rows of ``length`` elements
    mapped to exp(x - max) / sum, the sum in float64 (a max that is NaN makes the row NaN, as
    NumPy's). Args: x, out, rows, length, the parts."""
    typ = from_dtype(dtype)

    def part(args, index):
        x, out, length = _pointer(args[0], typ), _pointer(args[1], typ), args[3]
        first, last = _share(index, args[4], args[2])
        for row in range(first, last):
            at = row * length
            top = x[at]
            for i in range(1, length):
                top = _larger(top, x[at + i])
            total = 0.0
            for i in range(length):
                value = math.exp(x[at + i] - top)
                out[at + i] = value
                total += value
            scale = typ(1.0 / total)
            for i in range(length):
                out[at + i] *= scale
    return part


# a row's sums in float64, which LLVM may reassociate into vectors of partial sums ("reassoc"
# alone: NaN and the infinities still behave as IEEE's); not inlined by numba, which would
# compile them with its caller's flags (the normalisation itself is not reassociated: x * a -
# mean * a would lose what x - mean keeps of a row with a large mean)
@njit(fastmath={"reassoc"})
def _row_sum(row, length):
    total = 0.0
    for i in range(length):
        total += row[i]
    return total


@njit(fastmath={"reassoc"})
def _row_squares(row, length, centre):
    total = 0.0
    for i in range(length):
        difference = row[i] - centre
        total += difference * difference
    return total


def _layer_norm_part(dtype):
    """The LayerNormalization part function: each of ``rows`` contiguous rows of ``length``
    elements mapped to (x - mean) / sqrt(variance + epsilon) * scale + bias, the statistics in
    two passes (the mean, then the squares about it) and the map in float64, rounded to the
    dtype once. Args: x, out, rows, length, the addresses of the float64 scale and bias (a
    row's length each) and of [epsilon], the parts."""
    typ = from_dtype(dtype)
    item = dtype.itemsize

    def part(args, index):
        out, length = _pointer(args[1], typ), args[3]
        scale, bias = _pointer(args[4], types.float64), _pointer(args[5], types.float64)
        epsilon = _pointer(args[6], types.float64)[0]
        first, last = _share(index, args[7], args[2])
        for row in range(first, last):
            x = _pointer(args[0] + row * length * item, typ)
            mean = _row_sum(x, length) / length
            inverse = 1.0 / math.sqrt(_row_squares(x, length, mean) / length + epsilon)
            at = row * length
            for i in range(length):
                out[at + i] = typ((x[i] - mean) * inverse * scale[i] + bias[i])
    return part


def _blocked_global_pool_part(kind, dtype, lanes):
    """The global pool part function of channel-blocked values (``lanes`` channels a block):
    each unit one block of one image, its H x W pixels' lanes reduced to ``lanes`` values,
    written at ``out + n * channels + block * lanes`` (an NCHW (N, C, 1, 1) output: the lanes
    below ``channels`` only; a blocked one's ``channels`` are its padded count). Args: x, out,
    units, blocks a image, channels, H, W, a scratch array of a vector and ``lanes`` float64
    values per part (``_part_scratch``), the bytes from one part's to the next, the parts. A
    vector a pixel: the max over the plane's pixels at once; a sum row by row in the dtype,
    the rows' sums added in float64 (summed in the dtype, a 56 x 56 plane's lane took 3136
    rounded steps: EfficientNet's squeeze-excitation gates, and its output, 7 times further
    from float64's than the NCHW pool's)."""
    typ, is_max, _, item, _ = _reduction(kind, dtype)
    divides = kind == "average"
    wide = types.float64
    pixel = lanes * item   # bytes

    def part(args, index):
        out = _pointer(args[1], typ)
        blocks, c, h, w = args[3], args[4], args[5], args[6]
        first, last = _share(index, args[9], args[2])
        scratch_at = args[7] + index * args[8]
        partial, sums = _pointer(scratch_at, typ), _pointer(scratch_at + pixel, wide)
        for unit in range(first, last):
            n, block = unit // blocks, unit % blocks
            source, at = args[0] + unit * h * w * pixel, n * c + block * lanes
            used = min(lanes, c - block * lanes)
            if is_max:
                _vector_max(partial, source, pixel, h * w, 1, lanes)
                for lane in range(used):
                    out[at + lane] = partial[lane]
                continue
            for lane in range(lanes):
                sums[lane] = 0.0
            for y in range(h):
                _vector_sum(partial, source + y * w * pixel, pixel, w, 1, lanes)
                for lane in range(lanes):
                    sums[lane] += wide(partial[lane])
            for lane in range(used):
                out[at + lane] = typ(sums[lane] / (h * w) if divides else sums[lane])
    return part


def _blocked_pool_part(kind, dtype, kh, kw, sw, dw, lanes):
    """The pool part function of ``_pool_part`` on channel-blocked values (N, blocks, H, W,
    ``lanes``; ``pool``): each unit one block of one image, its pixels vectors of ``lanes``
    channels.
    The same args and two passes as ``_pool_part``, a pixel's vector where that takes an
    element: the rows of a window reduced pixel by pixel into a scratch row of pixels, then
    each output pixel's taps along it (the divisors of an average a vector a pixel)."""
    typ, is_max, identity, item, _ = _reduction(kind, dtype)
    pixel = lanes * item   # bytes

    def part(args, index):
        h, w, oh, ow, sh, dh, top, left = (args[3], args[4], args[5], args[6], args[7],
                                           args[8], args[9], args[10])
        span = args[16]   # pixels of a scratch row
        rows_at = args[15] + index * args[17]
        inverse_at = rows_at + 2 * span * pixel
        scratch, inverse = _pointer(rows_at, typ), _pointer(inverse_at, typ)
        for element in range(2 * span * lanes):
            scratch[element] = identity
        if not is_max:
            for o in range(ow):
                x0 = o * sw - left
                value = typ(1) / typ(_counted(x0, kw, args[13], args[14]))
                for lane in range(lanes):
                    inverse[o * lanes + lane] = value
        first, last = _share(index, args[18], args[2])
        for unit in range(first, last):
            for r in range(oh + 1):   # as _pool_part: row r's first pass, row r - 1's second
                if r < oh:
                    row_at = rows_at + (r & 1) * span * pixel
                    y0 = r * sh - top
                    i_lo, i_hi = _taps_inside(y0, kh, dh, h)
                    source = args[0] + ((unit * h + y0 + i_lo * dh) * w) * pixel
                    for c in range(w):
                        if is_max:
                            _vector_max(_pointer(row_at + (left + c) * pixel, typ),
                                        source + c * pixel, dh * w * pixel, i_hi - i_lo, 1, lanes)
                        else:
                            _vector_sum(_pointer(row_at + (left + c) * pixel, typ),
                                        source + c * pixel, dh * w * pixel, i_hi - i_lo, 1, lanes)
                if r:
                    q = r - 1
                    row_at = rows_at + (q & 1) * span * pixel
                    y0 = q * sh - top
                    rows = typ(1) if is_max else \
                        typ(1) / typ(_counted(y0, kh, args[11], args[12]))
                    out_at = args[1] + (unit * oh + q) * ow * pixel
                    for o in range(ow):
                        if is_max:
                            _vector_max(_pointer(out_at + o * pixel, typ),
                                        row_at + o * sw * pixel, dw * pixel, kw, 1, lanes)
                        else:
                            _vector_scaled_sum(_pointer(out_at + o * pixel, typ),
                                               row_at + o * sw * pixel, dw * pixel, kw, 1, lanes,
                                               _pointer(inverse_at + o * pixel, typ), rows)
    return part


def _blocked_gate_part(dtype):
    """The part function scaling channel-blocked values by a gate of one value per channel
    and image (squeeze-excitation): each unit one block of one image. Args: x, gate, out,
    units, H*W, L, the parts. (L a constant of the function instead ran 1.2x slower.)"""
    typ = from_dtype(dtype)

    def part(args, index):
        x, gate, out = _pointer(args[0], typ), _pointer(args[1], typ), _pointer(args[2], typ)
        pixels, lanes = args[4], args[5]
        first, last = _share(index, args[6], args[3])
        for unit in range(first, last):
            at, scale = unit * pixels * lanes, unit * lanes
            for p in range(pixels):
                for lane in range(lanes):
                    out[at + p * lanes + lane] = x[at + p * lanes + lane] * gate[scale + lane]
    return part


def _copy_part():
    """The part function copying a share of ``blocks`` blocks of ``size`` bytes, block b from
    ``source + b * source_step`` to ``destination + b * destination_step``; args: source and
    destination addresses, blocks, size, the two steps, 64-byte lines per block, the parts."""
    def part(args, index):
        blocks, size, lines = args[2], args[3], args[6]
        first, last = _share(index, args[7], blocks * lines)
        unit = first
        while unit < last:   # the part's lines of one block at a time
            block = unit // lines
            line = unit - block * lines
            stop = min(lines, line + last - unit)
            source = _pointer(args[0] + block * args[4], types.uint8)
            destination = _pointer(args[1] + block * args[5], types.uint8)
            for at in range(line * 64, min(stop * 64, size)):
                destination[at] = source[at]
            unit += stop - line
    return part


def _transpose_part(dtype):
    """The part function writing a share of the columns of the ``rows`` x ``cols`` matrix at
    ``source`` as the rows of the ``cols`` x ``rows`` one at ``destination``; args: source and
    destination addresses, rows, cols, the parts. Each part takes whole blocks of
    ``TRANSPOSE_BLOCK`` columns, a square of rows of them at a time."""
    typ = from_dtype(dtype)

    def part(args, index):
        rows, cols = args[2], args[3]
        source, destination = _pointer(args[0], typ), _pointer(args[1], typ)
        first, last = _share(index, args[4], -(-cols // TRANSPOSE_BLOCK))
        for block in range(first, last):
            c0 = block * TRANSPOSE_BLOCK
            c1 = min(cols, c0 + TRANSPOSE_BLOCK)
            for r0 in range(0, rows, TRANSPOSE_BLOCK):
                r1 = min(rows, r0 + TRANSPOSE_BLOCK)
                for c in range(c0, c1):
                    for r in range(r0, r1):
                        destination[c * rows + r] = source[r * cols + c]
    return part


MAX_PERMUTED_AXES = 6   # the axes a permuted copy's rows are indexed by, at most


def _permuted_rows_part():
    """The part function copying a share of ``rows`` rows of ``row_bytes`` bytes: output row
    r (its index over the output's leading axes, ``dims``, in C order) from the input at the
    sum of those indices times ``steps`` (the input's byte strides of the same axes); args:
    source and destination addresses, rows, row_bytes, the axes' count, ``MAX_PERMUTED_AXES``
    dims, as many steps, the parts."""
    def part(args, index):
        rows, size, axes = args[2], args[3], args[4]
        first, last = _share(index, args[5 + 2 * MAX_PERMUTED_AXES], rows)
        for row in range(first, last):
            offset, rest = 0, row
            for axis in range(axes - 1, -1, -1):
                dim = args[5 + axis]
                offset += (rest % dim) * args[5 + MAX_PERMUTED_AXES + axis]
                rest //= dim
            source = _pointer(args[0] + offset, types.uint8)
            destination = _pointer(args[1] + row * size, types.uint8)
            for at in range(size):
                destination[at] = source[at]
    return part


@lru_cache(maxsize=256)
def merged_permutation(shape, perm):
    """(dims, perm), tuples, of the same permuted copy of an array of ``shape`` with its axes
    of one element dropped and the axes adjacent both in the input and in the output merged
    (remembered: ``permutable`` and ``permute`` both ask, on every plain run)."""
    kept = [axis for axis in perm if shape[axis] != 1]
    groups = []   # runs of input axes that stay adjacent and in order in the output
    for axis in kept:
        if groups and axis == groups[-1][-1] + 1:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])   # the groups' input order
    dims = tuple(int(np.prod([shape[a] for a in groups[g]])) for g in order)
    return dims, tuple(order.index(g) for g in range(len(groups)))


def permutable(shape, perm):
    """Whether ``permute`` has code for ``perm`` of an array of ``shape``: nothing moves, or
    the last axis stays last (ShuffleNet's channel shuffle). (Not a matrix transpose, NCHW to
    NHWC: ``transpose``, element by element, ran ConvNeXt's 13 times slower than the NumPy
    views its next operators read.)"""
    dims, order = merged_permutation(tuple(shape), tuple(perm))
    return len(dims) <= 1 or (order[-1] == len(dims) - 1 and len(dims) - 1 <= MAX_PERMUTED_AXES)


def permute(x, out, perm, threads):
    """``out`` = ``np.transpose(x, perm)`` for a ``permutable`` one, both C-contiguous of one
    dtype, not overlapping: rows copied whole."""
    dims, order = merged_permutation(x.shape, tuple(perm))
    if len(dims) <= 1:   # nothing moves
        if x.size:
            copy(x.reshape(-1), out.reshape(-1), threads)
        return out
    row_bytes = dims[-1] * x.itemsize
    in_steps = [int(np.prod(dims[a + 1:])) * x.itemsize for a in range(len(dims))]
    outer = order[:-1]
    fill = [0] * (MAX_PERMUTED_AXES - len(outer))
    rows = int(np.prod([dims[a] for a in outer]))
    args = np.array([data_address(x), data_address(out), rows, row_bytes, len(outer),
                     *[dims[a] for a in outer], *fill, *[in_steps[a] for a in outer], *fill, 0],
                    np.int64)
    _run(_compiled(_permuted_rows_part).address, args, rows, threads)
    return out


def compiles(dtype):
    """Whether the kernels have code for ``dtype`` (numba has none for float16 or bool)."""
    return dtype in (np.float32, np.float64) or dtype.kind in "iu"


@compiled_once
def _compiled(maker, *key):
    """``maker(*key)``'s part function compiled, once per process (and kept: the pool calls
    its address): ``.address``, and ``.code``, what owns the code (a ``JitModule`` or numba's
    ``CFunc``). Numba's object code for it is loaded from cso's persistent cache, taking no
    part of numba's compiler (only the addresses of its C helpers, ``_numba_symbols``), or
    numba compiles it and the object code is saved there; with the cache off, or where that
    object code cannot be loaded, numba compiles it through its own disk cache."""
    _numba_symbols()
    return ForeignFunction((__name__, maker.__qualname__, *key, *_code_key()),
                           lambda keep: _numba_part(maker, key, keep))


def _numba_part(maker, key, keep):
    """(symbol name, address, ``CFunc``, object code or None) of ``maker(*key)``'s part
    function compiled by numba: through its disk cache unless its object code is kept
    (``keep``; loaded from numba's cache, a kernel has none left to take)."""
    function = cfunc(PART_SIGNATURE, cache=not keep, error_model="numpy")(maker(*key))
    object_code = getattr(function._library, "_compiled_object", None) if keep else None
    return function.native_name, function.address, function, object_code


_key = []


def _code_key():
    """What numba's code for the kernels depends on besides the entry directory's sources and
    versions: this module's source, numba's version and its code generation settings."""
    if not _key:
        source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
        _key.extend((source, numba.__version__, str(config.OPT), config.CPU_NAME,
                     config.CPU_FEATURES, config.BOUNDSCHECK))
    return tuple(_key)


_registered = []


def _numba_symbols():
    """Give LLVM the symbols numba's code takes from outside it, as numba's CPU target does
    when it initialises (``numba.core.base._load_global_helpers`` and
    ``numba.core.externals.c_math_functions``): its C helpers as ``numba_<name>`` (e.g.
    ``numba_gil_ensure``), the built-in exceptions as ``PyExc_<name>`` and ``_Py_NoneStruct``
    (at the objects themselves, not at the C variables pointing to them), and the C math
    functions bound to CPython's runtime. The same addresses numba gives them, once."""
    if _registered:
        return
    llvm.add_symbol("_Py_NoneStruct", id(None))
    for helpers in (_helperlib.c_helpers, _dynfunc.c_helpers):
        for name, address in helpers.items():
            llvm.add_symbol("numba_" + name, address)
    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            llvm.add_symbol(f"PyExc_{value.__name__}", id(value))
    for name in intrinsics.INTR_MATH:   # (numba binds more on 32-bit hosts: not loaded there)
        llvm.add_symbol(name, _helperlib.c_helpers[name])
    _registered.append(True)


def _parts(work, threads):
    """How many parts ``work`` units are run in on up to ``threads`` threads."""
    return max(1, min(work, threads * PARTS_PER_THREAD if threads > 1 else 1))


def _part_scratch(parts, nbytes):
    """(array, bytes from one part's share to the next): scratch of at least ``nbytes`` for
    each of ``parts`` parts, every share on pages of its own (``part_stride``; parts that
    shared a line on two threads took turns at it: a 3x3 average pool ran slower on two
    threads than on one)."""
    stride, align = ((-(-nbytes // LINE) * LINE, LINE) if parts == 1
                     else (part_stride(nbytes), PAGE))
    return aligned_empty(parts * stride, np.uint8, align), stride


def _run(function, args, work, threads, *arrays):
    """Run ``function`` over ``work`` units in parts on up to ``threads`` threads; ``args``
    (int64) ends with the part count, which is set here; ``arrays``: those it points to
    besides its input and output (scratch, constants), which a recording keeps."""
    parts = _parts(work, threads)
    args[-1] = parts
    run_parts(function, data_address(args), parts, threads, keep=(args,) + arrays)


def pool(kind, x, out, kernel, strides, dilations, head, count_bounds, threads):
    """``out`` (N, C, OH, OW) = the ``kind`` ("max" or "average") pool of ``x`` (N, C, H, W),
    or of channel-blocked ``x`` (N, blocks, H, W, L) into ``out`` (N, blocks, OH, OW, L),
    both C-contiguous: windows of ``kernel`` taps at ``strides`` and ``dilations``, the first
    starting ``head`` = (top, left) before the image; an average divides by the taps inside
    ``count_bounds`` ((row_lo, row_hi), (col_lo, col_hi)), in the image's coordinates (None
    for "max")."""
    n, c, h, w = x.shape[:4]
    oh, ow = out.shape[2:4]
    blocked = x.ndim == 5
    lanes = x.shape[4] if blocked else 1   # elements a pixel
    (row_lo, row_hi), (col_lo, col_hi) = count_bounds or ((0, 0), (0, 0))
    # the scratch row: the left padding, the image's row, what the last window reaches past
    # it, and (NCHW) the element a stride-2 vector reads past that
    span = (max(head[1] + w, (ow - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1)
            + (not blocked))
    rows, stride = _part_scratch(_parts(n * c, threads), (2 * span + ow) * lanes * x.itemsize)
    args = np.array([data_address(x), data_address(out), n * c, h, w, oh, ow, strides[0],
                     dilations[0], *head, row_lo, row_hi, col_lo, col_hi, data_address(rows),
                     span, stride, 0], np.int64)
    function = (_compiled(_blocked_pool_part, kind, x.dtype, *kernel, strides[1], dilations[1],
                          lanes) if blocked
                else _compiled(_pool_part, kind, x.dtype, *kernel, strides[1], dilations[1]))
    _run(function.address, args, n * c, threads, rows)
    return out


def global_pool(kind, x, out, threads):
    """``out`` (N, C) = the ``kind`` ("max", "average" or "sum") of each (image, channel)'s spatial
    elements of ``x`` (N, C, ...), both C-contiguous. (A BLAS matrix-vector product would be
    as fast on one thread, but OpenBLAS's threads spin for a while after each call, on the
    cores the next convolutions use.)"""
    planes = x.shape[0] * x.shape[1]
    partials, stride = _part_scratch(_parts(planes, threads), VECTOR_BYTES)
    args = np.array([data_address(x), data_address(out), planes, x[0, 0].size,
                     data_address(partials), stride, 0], np.int64)
    _run(_compiled(_global_pool_part, kind, x.dtype).address, args, planes, threads, partials)
    return out


def layer_norm(x, out, scale, bias, epsilon, threads):
    """``out`` = each row of ``x`` (its trailing ``scale.size`` elements) less its mean, over
    sqrt(its variance + ``epsilon``), times ``scale`` plus ``bias`` (float64 vectors of a row's
    length); ``x`` and ``out`` of one shape and a float dtype, ``out`` C-contiguous, ``x`` taken
    through a copy (which a recording keeps) if it is not."""
    source = np.ascontiguousarray(x)
    length = scale.size
    rows = x.size // length if length else 0
    constants = np.array([epsilon], np.float64)
    args = np.array([data_address(source), data_address(out), rows, length,
                     data_address(scale), data_address(bias), data_address(constants), 0],
                    np.int64)
    _run(_compiled(_layer_norm_part, x.dtype).address, args, rows, threads, scale, bias,
         constants, *(() if source is x else (source,)))
    return out


def lrn(x, out, size, alpha, beta, bias, threads):
    """``out`` = ``x`` (N, C, ...) / (bias + alpha / size * the sum of squares over ``size``
    channels around each) ** beta, both C-contiguous."""
    n, c = x.shape[:2]
    pixels = x[0, 0].size
    constants = np.array([alpha / size, beta, bias], np.float64)
    args = np.array([data_address(x), data_address(out), n, c, pixels, data_address(constants),
                     (size - 1) // 2, size // 2, 0], np.int64)
    _run(_compiled(_lrn_part, x.dtype).address, args, n * -(-pixels // LRN_BLOCK), threads,
         constants)
    return out


def copy(x, out, threads):
    """``out`` = ``x``, of one shape and dtype, not overlapping: ``x`` C-contiguous, ``out``
    C-contiguous from its second dimension on (a batch's channels of a larger array)."""
    blocks = x.shape[0] if x.ndim > 1 else 1   # each a block, at out's stride
    size = x.nbytes // blocks if blocks else 0
    lines = -(-size // 64)
    args = np.array([data_address(x), data_address(out), blocks, size, size,
                     out.strides[0] if x.ndim > 1 else 0, lines, 0], np.int64)
    _run(_compiled(_copy_part).address, args, blocks * lines, threads)
    return out


def transpose(x, out, threads):
    """``out`` (C, R) = the transpose of ``x`` (R, C), both 2-D C-contiguous of one dtype, not
    overlapping."""
    rows, cols = x.shape
    args = np.array([data_address(x), data_address(out), rows, cols, 0], np.int64)
    _run(_compiled(_transpose_part, x.dtype).address, args, -(-cols // TRANSPOSE_BLOCK), threads)
    return out


def add(a, b, out, threads):
    """``out`` = ``a`` + ``b``, all C-contiguous of one shape and float dtype; ``out`` may be
    either input."""
    args = np.array([data_address(a), data_address(b), data_address(out), a.size, 0], np.int64)
    _run(_compiled(_add_part, a.dtype).address, args, -(-a.nbytes // LINE), threads)
    return out


def softmax(x, out, threads):
    """``out`` = the softmax of each row (the last dimension) of ``x``, both C-contiguous, of
    one shape and a float dtype."""
    length = x.shape[-1] if x.ndim else 1
    rows = x.size // length if length else 0
    args = np.array([data_address(x), data_address(out), rows, length, 0], np.int64)
    _run(_compiled(_softmax_part, x.dtype).address, args, rows, threads)
    return out


def affine(x, out, scale, shift, relu, threads):
    """``out`` = ``x`` (N, C, ...) * ``scale`` + ``shift`` (C values each, in x's dtype), then
    Relu if ``relu``; ``out`` may be ``x``."""
    n, c = x.shape[:2]
    pixels = x[0, 0].size
    args = np.array([data_address(x), data_address(out), n * c, c, pixels, data_address(scale),
                     data_address(shift), 0], np.int64)
    _run(_compiled(_affine_part, bool(relu), x.dtype).address, args, n * c, threads, scale,
         shift)
    return out


def blocked_affine(x, out, scale, shift, relu, threads):
    """``affine`` on channel-blocked values: ``out`` = ``x`` (N, blocks, H, W, L) * ``scale``
    + ``shift`` (blocks * L values each, in x's dtype), then Relu if ``relu``; ``out`` may be
    ``x``."""
    n, blocks, h, w, lanes = x.shape
    args = np.array([data_address(x), data_address(out), n * blocks, blocks, h * w,
                     data_address(scale), data_address(shift), 0], np.int64)
    function = _compiled(_blocked_affine_part, bool(relu), x.dtype, lanes)
    _run(function.address, args, n * blocks, threads, scale, shift)
    return out


def blocked_global_pool(kind, x, out, threads):
    """``out`` = the ``kind`` ("max" or "average") of each channel's pixels of the
    channel-blocked ``x`` (N, blocks, H, W, L): NCHW (N, C, 1, 1), or blocked (N, blocks, 1,
    1, L); both C-contiguous of one dtype."""
    n, blocks, h, w, lanes = x.shape
    channels = out.size // n if n else 0
    scratch, stride = _part_scratch(_parts(n * blocks, threads), lanes * (x.itemsize + 8))
    args = np.array([data_address(x), data_address(out), n * blocks, blocks, channels, h, w,
                     data_address(scratch), stride, 0], np.int64)
    function = _compiled(_blocked_global_pool_part, kind, x.dtype, lanes)
    _run(function.address, args, n * blocks, threads, scratch)
    return out


def blocked_gate(x, gate, out, threads):
    """``out`` = the channel-blocked ``x`` (N, blocks, H, W, L) times ``gate`` (N, blocks, 1,
    1, L), each channel's plane by its value; all C-contiguous of one dtype, ``out`` may be
    ``x``."""
    n, blocks, h, w, lanes = x.shape
    args = np.array([data_address(x), data_address(gate), data_address(out), n * blocks,
                     h * w, lanes, 0], np.int64)
    _run(_compiled(_blocked_gate_part, x.dtype).address, args, n * blocks, threads)
    return out
