"""cso.onnx.kernels, the compiled pooling (windowed and global, NCHW and blocked), LRN, layer
normalisation, per-channel affine, copy, transpose, permuted copy, sum and softmax kernels,
against plain NumPy references: geometries that leave edges on every side (windows over the
padding, rows shorter and longer than a vector, strides and dilations), float32, float64 and
int8, one and two threads with work that does not split evenly, and arrays flush against guard
pages."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import cso
from cso.onnx import kernels

from .children import CHILD_CWD
from .guarded import calls_stay_inside


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = cso.get_num_threads()
    cso.set_num_threads(request.param)
    yield request.param
    cso.set_num_threads(before)


def reference_pool(kind, x, out_shape, kernel, strides, dilations, head, count_bounds):
    """Each output window by hand, in float64; an average divides by its taps inside
    ``count_bounds``."""
    n, c, h, w = x.shape
    out = np.empty((n, c) + out_shape)
    for r, o in itertools.product(*map(range, out_shape)):
        rows = [r * strides[0] - head[0] + i * dilations[0] for i in range(kernel[0])]
        cols = [o * strides[1] - head[1] + j * dilations[1] for j in range(kernel[1])]
        taps = [x[:, :, y, z].astype(np.float64) for y in rows if 0 <= y < h
                for z in cols if 0 <= z < w]
        if kind == "max":
            out[:, :, r, o] = np.max(taps, axis=0) if taps else -np.inf
        else:
            (row_lo, row_hi), (col_lo, col_hi) = count_bounds
            count = ((min(rows[-1] + 1, row_hi) - max(rows[0], row_lo))
                     * (min(cols[-1] + 1, col_hi) - max(cols[0], col_lo)))
            out[:, :, r, o] = np.sum(taps, axis=0) / count
    return out


# (N, C, H, W), kernel, strides, dilations, head (top, left), extra rows/cols past the image
POOLS = [
    ((1, 3, 7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ((2, 5, 23, 37), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),       # rows of several vectors
    ((1, 4, 13, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),       # 13 = a vector and a tail
    ((1, 3, 12, 17), (2, 3), (1, 2), (1, 1), (0, 2), (1, 0)),       # asymmetric padding
    ((1, 3, 11, 19), (3, 2), (2, 3), (1, 1), (2, 0), (2, 2)),       # ceil_mode-like overhang
    ((1, 2, 9, 21), (2, 3), (2, 1), (3, 2), (1, 0), (1, 2)),        # dilated
    ((1, 2, 7, 9), (7, 9), (1, 1), (1, 1), (0, 0), (0, 0)),         # one window: the image
    ((3, 1, 5, 5), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    # rows of several int8 vectors (32 lanes) and a tail, at strides 1, 2 and 3
    ((1, 2, 4, 75), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 5, 75), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 4, 110), (2, 3), (1, 3), (1, 1), (0, 1), (0, 1)),
]


def _pool_case(case):
    shape, kernel, strides, dilations, head, tail = case
    out_shape = tuple((size + h + t - ((k - 1) * d + 1)) // s + 1 for size, k, s, d, h, t in
                      zip(shape[2:], kernel, strides, dilations, head, tail))
    return shape, kernel, strides, dilations, head, tail, out_shape


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_max_pool(case, dtype, threads, rng):
    shape, kernel, strides, dilations, head, _, out_shape = _pool_case(case)
    x = (rng.integers(-128, 127, shape) if dtype == np.int8
         else rng.standard_normal(shape)).astype(dtype)
    out = np.empty(shape[:2] + out_shape, dtype)
    kernels.pool("max", x, out, kernel, strides, dilations, head, None, threads)
    expected = reference_pool("max", x, out_shape, kernel, strides, dilations, head, None)
    np.testing.assert_array_equal(out, expected.astype(dtype))


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_propagates_nan(case, dtype, rng):
    """A NaN anywhere in a window (first, middle or last tap; rows wider and narrower than a
    vector) makes that window's output NaN, as np.max and PyTorch's max pools do, and leaves
    the other windows alone."""
    shape, kernel, strides, dilations, head, _, out_shape = _pool_case(case)
    x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) < 0.03] = np.nan
    x[0, 0, 0, 0] = np.nan   # the first tap of the first window inside the image
    out = np.empty(shape[:2] + out_shape, dtype)
    kernels.pool("max", x, out, kernel, strides, dilations, head, None, 1)
    expected = reference_pool("max", x, out_shape, kernel, strides, dilations, head, None)
    assert np.isnan(expected).any()
    assert np.prod(out_shape) == 1 or not np.isnan(expected).all()   # one window: the image
    np.testing.assert_array_equal(out, expected.astype(dtype))


@pytest.mark.parametrize("case", [c for c in POOLS if c[3] == (1, 1)])
@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_average_pool(case, include_pad, dtype, threads, rng):
    shape, kernel, strides, dilations, head, tail, out_shape = _pool_case(case)
    x = rng.standard_normal(shape).astype(dtype)
    bounds = tuple((-h, size + t) if include_pad else (0, size)
                   for h, t, size in zip(head, tail, shape[2:]))
    out = np.empty(shape[:2] + out_shape, dtype)
    kernels.pool("average", x, out, kernel, strides, dilations, head, bounds, threads)
    expected = reference_pool("average", x, out_shape, kernel, strides, dilations, head, bounds)
    # summed in the dtype: float32 sums of a few terms of order one are within 1e-6 absolute
    np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype == np.float32 else 1e-13,
                               atol=1e-6 if dtype == np.float32 else 1e-15)


@pytest.mark.parametrize("case,kind,include_pad", [
    (case, kind, include_pad) for case in POOLS[:8]
    for kind, include_pad in (("max", False), ("average", False), ("average", True))
    if kind == "max" or case[3] == (1, 1)])   # (AveragePool has no dilations)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_pool(case, kind, include_pad, dtype, threads, rng):
    """The pools of channel-blocked values (11 channels: a partial block at every block
    size), against the reference on the NCHW tensor; a NaN kept by the max."""
    shape, kernel, strides, dilations, head, tail, out_shape = _pool_case(case)
    shape = shape[:1] + (11,) + shape[2:]
    x = rng.standard_normal(shape).astype(dtype)
    x[0, 9, 0, 0] = np.nan
    bounds = tuple((-h, size + t) if include_pad else (0, size)
                   for h, t, size in zip(head, tail, shape[2:]))
    blocked = cso.Blocked.from_nchw(x).data
    out = np.full(blocked.shape[:2] + out_shape + blocked.shape[4:], 7, dtype)
    kernels.pool(kind, blocked, out, kernel, strides, dilations, head,
                         bounds if kind == "average" else None, threads)
    expected = reference_pool(kind, x, out_shape, kernel, strides, dilations, head, bounds)
    np.testing.assert_allclose(cso.Blocked(out, 11).to_nchw(), expected,
                               rtol=1e-6 if dtype == np.float32 else 1e-13,
                               atol=1e-6 if dtype == np.float32 else 1e-15)
    assert np.isfinite(out[:, -1, ..., 11 % blocked.shape[4]:]).all()   # padding lanes


def reference_lrn(x, size, alpha, beta, bias):
    x = x.astype(np.float64)
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        squares[:, c] = (x[:, max(0, c - (size - 1) // 2):c + size // 2 + 1] ** 2).sum(1)
    return x / (bias + alpha / size * squares) ** beta


@pytest.mark.parametrize("shape", [(1, 7, 4, 3), (2, 9, 23, 25), (1, 3, 1, 1)])
@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 0.6), (1, 0.75), (4, 1.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lrn(shape, size, beta, dtype, threads, rng):
    # 23 x 25 pixels: more than one block of LRN_BLOCK, the last one partial
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    out = kernels.lrn(x, np.empty_like(x), size, 2e-2, beta, 1.5, threads)
    np.testing.assert_allclose(out, reference_lrn(x, size, 2e-2, beta, 1.5),
                               rtol=2e-6 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("shape", [(2, 5, 3, 7), (1, 3, 40, 41), (3, 4)])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_affine(shape, relu, dtype, threads, rng):
    x = rng.standard_normal(shape).astype(dtype)
    scale, shift = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(2))
    expected = x * scale.reshape((-1,) + (1,) * (x.ndim - 2)) + \
        shift.reshape((-1,) + (1,) * (x.ndim - 2))
    if relu:
        expected = np.maximum(expected, 0)
    np.testing.assert_allclose(kernels.affine(x, np.empty_like(x), scale, shift, relu, threads),
                               expected, rtol=1e-6)
    kernels.affine(x, x, scale, shift, relu, threads)     # in place
    np.testing.assert_allclose(x, expected, rtol=1e-6)


@pytest.mark.parametrize("size", [1, 15, 16, 17, 100, 1000, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_copy(size, dtype, threads, rng):
    """Sizes of a line, lines and a tail, shares that do not divide evenly; bytes past the
    end untouched."""
    x = rng.integers(-100, 100, size).astype(dtype)
    out = np.full(size + 3, 7, dtype)
    assert kernels.copy(x, out[:size], threads) is not None
    np.testing.assert_array_equal(out[:size], x)
    assert (out[size:] == 7).all()
    # 3 images of 2 channels into channels 1-2 of 4: blocks at the output's stride
    x = rng.integers(-100, 100, (3, 2, size)).astype(dtype)
    out = np.full((3, 4, size), 7, dtype)
    kernels.copy(x, out[:, 1:3], threads)
    np.testing.assert_array_equal(out[:, 1:3], x)
    assert (out[:, [0, 3]] == 7).all()


@pytest.mark.parametrize("shape", [(1, 1), (1, 37), (37, 1), (16, 16), (8, 4096), (33, 17),
                                   (100, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_transpose(shape, dtype, threads, rng):
    """Squares whole and cut at both edges, one row or column, more parts than blocks; the
    elements past the output untouched."""
    x = rng.integers(-100, 100, shape).astype(dtype)
    out = np.full(x.size + 5, 7, dtype)
    assert kernels.transpose(x, out[:x.size].reshape(shape[::-1]), threads) is not None
    np.testing.assert_array_equal(out[:x.size].reshape(shape[::-1]), x.T)
    assert (out[x.size:] == 7).all()


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 6, 7, 7), (3, 1, 4, 1), (2, 3, 1, 4, 2, 3),
                                   (7,), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_permute_every_permutation_it_has_code_for(shape, dtype, threads, rng):
    """Every permutation ``permutable`` says it has code for, against NumPy's: rows copied
    whole (the last axis, with the ones of one element and the merged ones, staying last), or
    nothing moved; and it has code for every permutation that keeps the last axis last. The
    elements past the output untouched."""
    x = rng.integers(-100, 100, shape).astype(dtype)
    covered = 0
    for perm in itertools.permutations(range(len(shape))):
        out = np.full(x.size + 5, 7, dtype)
        moved = out[:x.size].reshape([shape[axis] for axis in perm])
        dims, order = kernels.merged_permutation(shape, perm)
        if order and order[-1] == len(order) - 1 and len(order) - 1 <= kernels.MAX_PERMUTED_AXES:
            assert kernels.permutable(shape, perm)
        if not kernels.permutable(shape, perm):
            assert order[-1] != len(order) - 1
            continue
        assert kernels.permute(x, moved, list(perm), threads) is moved
        np.testing.assert_array_equal(moved, np.transpose(x, perm))
        assert (out[x.size:] == 7).all()
        covered += 1
    assert covered


def test_merged_permutation():
    """Axes of one element dropped, axes adjacent in both orders merged: ShuffleNet's channel
    shuffle is a swap of two axes of rows of H * W elements."""
    assert kernels.merged_permutation((1, 2, 58, 28, 28), (0, 2, 1, 3, 4)) == ((2, 58, 784),
                                                                             (1, 0, 2))
    assert kernels.merged_permutation((2, 96, 56, 56), (0, 2, 3, 1)) == ((2, 96, 3136),
                                                                       (0, 2, 1))
    assert kernels.merged_permutation((1, 768, 1, 1), (0, 2, 3, 1)) == ((768,), (0,))
    assert kernels.merged_permutation((3, 4), (0, 1)) == ((12,), (0,))
    # rows indexed by more axes than the kernel takes: left to NumPy
    swapped_pairs = (1, 0, 3, 2, 5, 4, 6, 7, 9, 8, 10)
    assert len(kernels.merged_permutation((2,) * 11, swapped_pairs)[0]) - 1 > \
        kernels.MAX_PERMUTED_AXES
    assert not kernels.permutable((2,) * 11, swapped_pairs)


@pytest.mark.parametrize("size", [1, 15, 16, 17, 1000, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add(size, dtype, threads, rng):
    """Sums of one line, lines and a tail, shares that do not divide evenly, into a third
    array or into either input; NaN and the infinities as IEEE's; past the end untouched."""
    a, b = (rng.standard_normal(size).astype(dtype) for _ in range(2))
    a[:3] = [np.nan, np.inf, np.inf][:size]
    b[:3] = [1.0, -np.inf, 1.0][:size]
    expected = a + b
    out = np.full(size + 3, 7, dtype)
    assert kernels.add(a, b, out[:size], threads) is not None
    np.testing.assert_array_equal(out[:size], expected)
    assert (out[size:] == 7).all()
    kernels.add(a, b, a, threads)
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("shape", [(2, 5, 3, 7), (1, 9, 13, 13), (3, 2, 1, 1), (1, 3, 50)])
@pytest.mark.parametrize("kind, dtype", [("max", np.float32), ("max", np.float64),
                                         ("max", np.int8), ("average", np.float32),
                                         ("average", np.float64), ("sum", np.float32),
                                         ("sum", np.float64)])   # averages, sums: floats only
def test_global_pool(shape, kind, dtype, threads, rng):
    """Planes shorter than a vector, of vectors and a tail, of one element, 1-D."""
    x = (rng.integers(-128, 127, shape) if dtype == np.int8
         else rng.standard_normal(shape)).astype(dtype)
    out = np.empty(shape[:2] + (1,) * (len(shape) - 2), dtype)
    kernels.global_pool(kind, x, out, threads)
    planes = x.reshape(shape[:2] + (-1,)).astype(np.float64)
    expected = {"max": planes.max, "average": planes.mean, "sum": planes.sum}[kind](axis=2)
    # float32 sums of up to 169 terms of order one: within 1e-6 absolute of the mean (the
    # sum's 169 times that)
    scale = planes.shape[2] if kind == "sum" else 1
    np.testing.assert_allclose(out.reshape(shape[:2]), expected,
                               rtol=1e-6 if dtype == np.float32 else 1e-13,
                               atol=(1e-6 if dtype == np.float32 else 1e-15) * scale)


@pytest.mark.parametrize("kind, expected", [("max", -np.inf), ("sum", 0.0), ("average", np.nan)])
def test_global_pool_of_empty_planes_gives_the_identity(kind, expected):
    out = np.full((2, 3), 7, np.float32)
    kernels.global_pool(kind, np.empty((2, 3, 0), np.float32), out, 1)
    np.testing.assert_array_equal(out, np.full((2, 3), expected, np.float32))


def reference_layer_norm(x, scale, bias, epsilon):
    """Each row (the last axis) normalised in float64, then scaled and shifted."""
    double = x.astype(np.float64)
    mean = double.mean(axis=-1, keepdims=True)
    centred = double - mean
    with np.errstate(invalid="ignore", divide="ignore"):
        return centred / np.sqrt(np.mean(centred ** 2, axis=-1, keepdims=True) + epsilon) \
            * scale + bias


@pytest.mark.parametrize("length", [1, 3, 17, 96, 768])
@pytest.mark.parametrize("epsilon", [1e-6, 1e-5, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm(length, epsilon, dtype, threads, rng):
    """Rows of every length (one element: its bias), with a large mean, a row of one constant
    (no variance: the bias again, as epsilon / sqrt(epsilon) * 0), against float64 NumPy: the
    statistics in float64 give float32 within an ulp or two of it."""
    x = (rng.standard_normal((11, length)) * 3 + 50).astype(dtype)
    x[4] = 2.5
    scale, bias = rng.standard_normal(length), rng.standard_normal(length)
    out = np.full_like(x, np.nan)
    assert kernels.layer_norm(x, out, scale, bias, epsilon, threads) is out
    expected = reference_layer_norm(x, scale, bias, epsilon)
    np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype == np.float32 else 1e-11,
                               atol=1e-6 if dtype == np.float32 else 1e-11)
    np.testing.assert_allclose(out[4], bias, rtol=1e-6)


def test_layer_norm_of_nan_inf_empty_and_strided_input(threads, rng):
    """A row with NaN or an infinity is NaN (inf - inf), as in NumPy, and leaves the others
    alone; a constant row with epsilon 0 is NaN (0 / 0); no rows, rows of nothing; an input
    that is not C-contiguous goes through a copy."""
    x = rng.standard_normal((5, 6)).astype(np.float32)
    x[1, 2], x[2, 0], x[3, 5] = np.nan, np.inf, -np.inf
    x[4] = 1
    out = np.empty_like(x)
    kernels.layer_norm(x, out, np.ones(6), np.zeros(6), 0.0, threads)
    assert np.isnan(out[1:]).all() and np.isfinite(out[0]).all()
    np.testing.assert_allclose(out[0], reference_layer_norm(x[0], 1, 0, 0.0), rtol=1e-6)
    for shape in ((0, 4), (3, 0)):
        kernels.layer_norm(np.empty(shape, np.float32), np.empty(shape, np.float32),
                           np.ones(shape[1]), np.zeros(shape[1]), 1e-5, threads)
    nchw = rng.standard_normal((2, 8, 3, 5))
    nhwc = nchw.transpose(0, 2, 3, 1)   # ConvNeXt's: channels last, as a view
    out = np.empty(nhwc.shape)
    scale, bias = rng.standard_normal(8), rng.standard_normal(8)
    kernels.layer_norm(nhwc, out, scale, bias, 1e-6, threads)
    np.testing.assert_allclose(out, reference_layer_norm(nhwc, scale, bias, 1e-6), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("parts, nbytes", [(1, 4), (8, 32), (8, 1132), (3, 64), (5, 65)])
def test_part_scratch_gives_each_part_pages_of_its_own(parts, nbytes):
    """A pool part's scratch starts on a page and ends before the next part's page: parts on
    two threads writing one line took turns at it, and so did lines of one page (their cores'
    prefetchers fetch ahead within it). A lone part's starts on a line."""
    scratch, stride = kernels._part_scratch(parts, nbytes)
    unit = 64 if parts == 1 else 4096
    assert stride >= nbytes and stride % unit == 0 and stride - nbytes < unit
    assert scratch.ctypes.data % unit == 0 and scratch.nbytes == parts * stride


@pytest.mark.parametrize("shape", [(1, 1000), (3, 7), (5, 1), (2, 3, 17), (0, 4), (4, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax(shape, dtype, threads, rng):
    """Rows along the last axis, against float64 NumPy: of one element, of none, none at all;
    large values (exp overflows without the max taken off), -inf (a zero)."""
    x = (rng.standard_normal(shape) * 30).astype(dtype)
    wide = shape[-1] > 1 and x.size
    if wide:
        x.flat[0], x.flat[-1] = 1e4, -np.inf
    out = np.full(shape, np.nan, dtype)
    kernels.softmax(x, out, threads)
    if not x.size:
        return
    double = x.astype(np.float64)
    expected = np.exp(double - double.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5 if dtype == np.float32 else 1e-13,
                               atol=1e-30)
    if wide:
        assert out.flat[-1] == 0 and out.flat[0] == 1


def test_softmax_propagates_nan():
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], np.float32)
    out = np.empty_like(x)
    kernels.softmax(x, out, 1)
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


def test_global_max_pool_propagates_nan(rng):
    x = rng.standard_normal((1, 4, 5, 7)).astype(np.float32)
    x[0, 1, 0, 0] = x[0, 2, 4, 6] = x[0, 3, 2, 3] = np.nan   # first, tail, in a vector
    out = np.empty((1, 4, 1, 1), np.float32)
    kernels.global_pool("max", x, out, 1)
    assert np.isnan(out[0, 1:, 0, 0]).all() and out[0, 0, 0, 0] == x[0, 0].max()


@pytest.mark.parametrize("at", ["end", "start"])
def test_no_access_outside_the_arrays(at, threads, rng):
    """Every kernel, on edge geometries, with its input and output each flush against an
    inaccessible page."""
    shape = (2, 5, 13, 11)
    x = rng.standard_normal(shape).astype(np.float32)
    scale, shift = rng.standard_normal(5).astype(np.float32), np.ones(5, np.float32)
    calls = []   # (out shape, run(x, out))
    for kind, case in itertools.product(("max", "average"), POOLS[:6]):
        _, kernel, strides, dilations, head, tail, out_shape = _pool_case((shape,) + case[1:])
        if kind == "average" and dilations != (1, 1):
            continue
        bounds = ((-head[0], 13 + tail[0]), (-head[1], 11 + tail[1]))
        calls.append((shape[:2] + out_shape,
                      lambda x, out, args=(kind, kernel, strides, dilations, head, bounds):
                      kernels.pool(args[0], x, out, *args[1:], threads)))
    calls.append((shape, lambda x, out: kernels.lrn(x, out, 5, 1e-4, 0.75, 1.0, threads)))
    calls.append((shape, lambda x, out: kernels.affine(x, out, scale, shift, True, threads)))
    calls.append((shape, lambda x, out: kernels.copy(x, out, threads)))
    calls.append((shape, lambda x, out: kernels.softmax(x, out, threads)))
    calls.append(((143, 10), lambda x, out: kernels.transpose(x.reshape(10, 143), out, threads)))
    calls.append(((2, 13, 5, 11), lambda x, out: kernels.permute(x, out, (0, 2, 1, 3), threads)))
    calls.append((shape, lambda x, out: kernels.add(x, x, out, threads)))
    for kind in ("max", "average", "sum"):
        calls.append((shape[:2] + (1, 1), lambda x, out, kind=kind:
                      kernels.global_pool(kind, x, out, threads)))
    rows = rng.standard_normal(11), rng.standard_normal(11)
    calls.append((shape, lambda x, out: kernels.layer_norm(x, out, *rows, 1e-5, threads)))
    failure = calls_stay_inside(calls, x, at)
    assert failure is None, f"arrays flush at their {at}: {failure}"


def test_with_cso_cache_off_numba_caches_the_kernels(tmp_path):
    """With cso's cache off, each kernel compiled once is loaded from numba's disk cache by the
    next process, not compiled again (a closure value numba cannot pickle the same way twice,
    such as a dispatcher, would give every process a cache key of its own: seconds per model
    load). (With it on, cso's cache keeps numba's object code: test_onnx_kernel_cache.)"""
    child = """if True:
        import numpy as np
        from cso.onnx import kernels
        x = np.ones((1, 3, 9, 20), np.float32)
        made = [kernels._compiled(kernels._pool_part, kind, x.dtype, 3, 3, 2, 1)
                for kind in ("max", "average")]
        made += [kernels._compiled(kernels._lrn_part, x.dtype),
                 kernels._compiled(kernels._affine_part, True, x.dtype),
                 kernels._compiled(kernels._global_pool_part, "average", x.dtype),
                 kernels._compiled(kernels._layer_norm_part, x.dtype)]
        kernels.pool("max", x, np.empty((1, 3, 4, 9), np.float32), (3, 3), (2, 2), (1, 1),
                     (0, 0), None, 1)
        print(sum(f.code.cache_hits for f in made))
    """
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), CSO_CACHE_DIR="")
    hits = [subprocess.run([sys.executable, "-c", child], cwd=CHILD_CWD, env=env, check=True,
                           capture_output=True, text=True).stdout.split()[-1] for _ in range(2)]
    assert hits == ["0", "6"]


def test_concurrent_first_calls_compile_each_kernel_once_and_agree(tmp_path):
    """Threads that call pools of the same and of different window shapes at once, then
    global pools, all get the reference's result: in a process whose caches (cso's and
    numba's) are empty, so the kernels compile under them, then in a second one, which loads
    them from cso's cache under them without setting up numba's compiler."""
    child = """if True:
        import sys
        import threading
        import numpy as np
        import cso
        from cso.onnx import kernels
        cso.set_num_threads(2)
        x = np.random.default_rng(0).standard_normal((2, 5, 23, 37)).astype(np.float32)
        cases = [("max", (3, 3), (2, 2)), ("average", (3, 3), (1, 1)),
                 ("max", (2, 2), (2, 2)), ("average", (5, 5), (2, 2))] * 2
        barrier, results, errors = threading.Barrier(len(cases)), {}, []

        def work(i, kind, kernel, strides):
            try:
                shape = tuple((n + 2 - k) // s + 1 for n, k, s in zip((23, 37), kernel, strides))
                out = np.empty((2, 5) + shape, np.float32)
                bounds = ((0, 23), (0, 37)) if kind == "average" else None
                barrier.wait()
                kernels.pool(kind, x, out, kernel, strides, (1, 1), (1, 1), bounds, 2)
                results[i] = out
            except Exception as err:
                errors.append(repr(err))
        threads = [threading.Thread(target=work, args=(i, *case)) for i, case in enumerate(cases)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, (kind, kernel, strides) in enumerate(cases[:4]):
            shape = results[i].shape[2:]
            expected = np.empty((2, 5) + shape, np.float32)
            bounds = ((0, 23), (0, 37)) if kind == "average" else None
            kernels.pool(kind, x, expected, kernel, strides, (1, 1), (1, 1), bounds, 1)
            assert np.array_equal(results[i], expected) and np.array_equal(results[i + 4], expected)

        def global_pool(i, kind):   # the global pools, compiling under 8 threads too
            try:
                out = np.empty((2, 5, 1, 1), np.float32)
                barrier.wait()
                kernels.global_pool(kind, x, out, 2)
                results[i] = out
            except Exception as err:
                errors.append(repr(err))
        threads = [threading.Thread(target=global_pool, args=(i, ("max", "average")[i % 2]))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(8):
            planes = x.reshape(2, 5, -1)
            want = planes.max(axis=2) if i % 2 == 0 else planes.mean(axis=2, dtype=np.float64)
            assert np.allclose(results[i][..., 0, 0], want, rtol=1e-6, atol=1e-6)
        print(errors, "numba.np.linalg" in sys.modules)
    """
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               CSO_CACHE_DIR=str(tmp_path / "cso"))
    for numba_compiler in ("True", "False"):
        done = subprocess.run([sys.executable, "-c", child], cwd=CHILD_CWD, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-2:] == ["[]", numba_compiler]
