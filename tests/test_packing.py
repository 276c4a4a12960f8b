"""Packing: filters pack/unpack exactly; input tiles equal a NumPy gather with zero padding."""
import tracemalloc

import numpy as np
import pytest

from llvmlite import ir

import cso
from microkernels import KernelSpec
from microkernels.aligned import LINE, data_address
from microkernels.jit import native_function
from microkernels.row_copy import TAP_FUNCTION_TYPE
import packing.filters
from packing import (pack_filters, pack_input_tile, packed_filters_shape, repack_filters,
                     tile_copiers, unpack_filters)


@pytest.mark.parametrize("k,c_g,r,s,nf,groups", [
    (7, 3, 3, 3, 14, 1), (14, 5, 1, 1, 14, 1), (29, 2, 3, 1, 14, 1), (12, 4, 3, 3, 6, 3),
    (8, 1, 3, 3, 6, 8), (16, 1, 5, 5, 14, 4),
])
def test_filters_round_trip_and_layout(rng, k, c_g, r, s, nf, groups):
    w = rng.standard_normal((k, c_g, r, s)).astype(np.float32)
    packed = pack_filters(w, nf, groups)
    assert packed.shape == packed_filters_shape(w.shape, nf, groups)
    assert packed.flags.c_contiguous and packed.dtype == w.dtype
    assert data_address(packed) % LINE == 0   # its filter vectors loaded whole, not split
    np.testing.assert_array_equal(unpack_filters(packed, k), w)
    k_g = k // groups
    g, t, f = groups - 1, (k_g - 1) // nf, (k_g - 1) % nf   # last filter of the last group
    np.testing.assert_array_equal(packed[g, t, :, :, :, f], w[g * k_g + k_g - 1])
    assert np.all(packed[g, t, ..., f + 1:] == 0)            # padding filters are zero



@pytest.mark.parametrize("k,nf", [(1000, 16), (1024, 16)])   # a padded last tile, and none
def test_packing_takes_no_copy_of_the_weights_beside_the_packed_array(k, nf):
    """Packing costs the packed array and no more (a padded copy of the weights first made a
    classifier's packing peak at twice its bytes)."""
    w = np.ones((k, 512, 1, 1), np.float32)
    tracemalloc.start()
    try:
        packed = pack_filters(w, nf)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert packed.nbytes <= peak <= packed.nbytes + (64 << 10)
    np.testing.assert_array_equal(unpack_filters(packed, k), w)


@pytest.mark.parametrize("k,c_g,r,s,groups", [(29, 2, 3, 1, 1), (12, 4, 3, 3, 3), (64, 16, 1, 1, 1),
                                              (8, 1, 3, 3, 8), (1000, 3, 1, 1, 1)])
@pytest.mark.parametrize("repack_bytes", [1, 4096, 1 << 20])   # chunks of 1 tile to all of them
def test_repacking_equals_packing_anew(rng, monkeypatch, k, c_g, r, s, groups, repack_bytes):
    """Filters packed in one tile size, repacked in another a chunk at a time, are exactly
    those packed anew, padding filters zero."""
    monkeypatch.setattr(packing.filters, "REPACK_BYTES", repack_bytes)
    w = rng.standard_normal((k, c_g, r, s)).astype(np.float32)
    for old, new in ((32, 16), (16, 32), (6, 16), (16, 6), (14, 14), (1, 5)):
        repacked = repack_filters(pack_filters(w, old, groups), k, new, groups)
        assert repacked.flags.c_contiguous and repacked.dtype == w.dtype
        assert data_address(repacked) % LINE == 0
        np.testing.assert_array_equal(repacked, pack_filters(w, new, groups))


@pytest.mark.parametrize("groups,layout", [(1, "nchw"), (4, "nchw"), (24, "blocked"),
                                           (24, "nchw")])
def test_every_packing_a_layer_keeps_starts_on_a_cache_line(rng, groups, layout):
    """The filters a layer packs, for its NCHW plans and a depthwise layer's blocked one,
    start on a line whatever NumPy's allocator returned (16 bytes into one, for large
    blocks): a filter vector across two lines costs two loads, and two layers of one plan ran
    up to 5% apart by where their filters landed."""
    w = rng.standard_normal((24, 24 // groups, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, padding=1, groups=groups)
    x = rng.standard_normal((1, 24, 9, 10)).astype(np.float32)
    conv(cso.Blocked.from_nchw(x) if layout == "blocked" else x)
    assert conv._packed and all(data_address(a) % LINE == 0 for a in conv._packed.values())

def gather_tile(x, n, c_first, nc, p0, nwin_used, nwin, R, S, stride, dil, pt, pl, P, Q):
    """The packed tile by definition: A[(c, r, s)][j] = padded input under window p0 + j."""
    H, W = x.shape[2:]
    tile = np.zeros((nc, R, S, nwin), x.dtype)
    for j in range(nwin_used):
        oh, ow = divmod(p0 + j, Q)
        for c in range(nc):
            for r in range(R):
                for s in range(S):
                    ih, iw = oh * stride[0] - pt + r * dil[0], ow * stride[1] - pl + s * dil[1]
                    if 0 <= ih < H and 0 <= iw < W:
                        tile[c, r, s, j] = x[n, c_first + c, ih, iw]
    return tile.reshape(-1)


@pytest.mark.parametrize("H,W,R,S,stride,dil,pads", [
    (7, 9, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (6, 5, 3, 2, (2, 3), (1, 2), (0, 2, 3, 1)),
    (5, 11, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0)),
    (4, 4, 3, 3, (1, 1), (2, 2), (2, 2, 2, 2)),
    (12, 3, 5, 3, (3, 1), (1, 1), (4, 0, 0, 2)),
    (14, 40, 2, 3, (4, 4), (1, 2), (1, 0, 2, 1)),     # the largest shuffled stride
    (14, 45, 2, 3, (5, 7), (1, 1), (1, 0, 2, 1)),     # gathered strides
    (5, 40, 2, 3, (1, 1), (1, 9), (1, 1, 9, 7)),      # dilated: per tap
    (4, 30, 2, 9, (1, 1), (1, 1), (0, 1, 4, 4)),      # wider than max_taps: per tap
    (3, 70, 1, 7, (1, 1), (1, 1), (1, 1, 3, 3)),      # 7 taps from one read of each row
    (9, 41, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1)),      # stride 2: even and odd phases
    (11, 45, 7, 7, (2, 2), (1, 1), (3, 3, 3, 3)),     # the 7x7 stride-2 stem
    (6, 21, 2, 2, (1, 2), (1, 1), (0, 1, 0, 1)),
])
@pytest.mark.parametrize("kernel,nwin", [(KernelSpec(dt, 8, vec, isa), nwin) for dt, vec, isa, nwin in (
    ("f32", 32, "avx512", 32), ("f64", 16, "avx512", 16), ("f32", 16, "avx2", 16), ("f64", 8, "avx2", 8),
    ("f32", 8, "generic", 8), ("f64", 4, "generic", 4),
    # rows narrower than vectors, or ending inside one: AVX2's 5- and 6-window tiles
    ("f32", 32, "avx512", 7), ("f32", 32, "avx512", 14), ("f64", 16, "avx512", 7),
    ("f32", 16, "avx2", 21), ("f32", 16, "avx2", 6), ("f32", 16, "avx2", 5))],
    ids=str)
def test_input_tiles_match_the_gather(rng, H, W, R, S, stride, dil, pads, kernel, nwin):
    N, C, dtype = 2, 5, kernel.np_dtype
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    copiers = tile_copiers(kernel, nwin, S, stride[1], dil[1])
    pt, pb, pl, pr = pads
    P = (H + pt + pb - dil[0] * (R - 1) - 1) // stride[0] + 1
    Q = (W + pl + pr - dil[1] * (S - 1) - 1) // stride[1] + 1
    geom = np.array([R, S, stride[0], stride[1], dil[0], dil[1], pt, pl, Q], np.int64)
    for n, c_first, nc in ((0, 0, C), (1, 2, 3)):
        for p0 in range(0, P * Q, nwin):
            nwin_used = min(nwin, P * Q - p0)
            size = nc * R * S * nwin
            # NaN guards on both sides, a vector wide after: no store lands past the tile
            dst = np.full(3 + size + kernel.lanes, np.nan, dtype)
            pack_input_tile(x, n, c_first, nc, p0, nwin_used, geom,
                            dst.ctypes.data + 3 * dst.itemsize, nwin, *copiers)
            expected = gather_tile(x, n, c_first, nc, p0, nwin_used, nwin, R, S, stride, dil, pt, pl, P, Q)
            np.testing.assert_array_equal(dst[3:3 + size], expected)
            assert np.all(np.isnan(dst[:3])) and np.all(np.isnan(dst[3 + size:]))


@pytest.mark.parametrize("stride,dil,S,taps_path", [
    ((1, 1), (1, 1), 3, True), ((2, 2), (1, 1), 3, True), ((1, 1), (1, 2), 3, False),
    ((1, 3), (1, 1), 3, False), ((1, 1), (1, 1), 9, False)])
def test_undilated_rows_of_stride_1_and_2_come_from_one_read(rng, stride, dil, S, taps_path):
    """The gather test passes by either path; here copy_taps stores nothing, so its rows stay
    NaN: every row when the packer should use it (strides 1-2, no dilation, S <= max_taps),
    none otherwise."""
    no_taps = native_function(_define_no_taps)
    kernel = KernelSpec("f32", 8, 32, "avx512")
    copy_rows, copy_taps = tile_copiers(kernel, 32, S, stride[1], dil[1])
    assert bool(copy_taps) == taps_path
    x = rng.standard_normal((1, 4, 9, 40)).astype(np.float32)
    Q = (40 + 2 - dil[1] * (S - 1) - 1) // stride[1] + 1
    geom = np.array([3, S, stride[0], stride[1], dil[0], dil[1], 1, 1, Q], np.int64)
    dst = np.full(4 * 3 * S * 32, np.nan, np.float32)
    pack_input_tile(x, 0, 0, 4, 0, 32, geom, dst.ctypes.data, 32, copy_rows,
                    no_taps.address if copy_taps else 0)
    assert np.isnan(dst).all() if taps_path else not np.isnan(dst).any()


def _define_no_taps(module):
    """A ``copy_taps`` that stores nothing."""
    function = ir.Function(module, TAP_FUNCTION_TYPE, "no_taps")
    ir.IRBuilder(function.append_basic_block()).ret_void()
    return function
