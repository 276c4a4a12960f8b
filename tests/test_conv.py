"""Operator conformance: cso.conv2d / Conv2d against the NumPy reference over every feature."""
import numpy as np
import pytest

import csa
import cso
import microkernels as mk

from .reference import assert_conv_close

F32, F64 = np.float32, np.float64

# (N, C, H, W, K, R, S, stride, padding (t, b, l, r), dilation, groups)
CASES = {
    "plain3x3": (1, 3, 8, 8, 4, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "pad1": (2, 5, 9, 11, 7, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "asym_pad": (1, 4, 7, 6, 5, 3, 2, (1, 1), (0, 2, 3, 1), (1, 1), 1),
    "stride2": (1, 6, 15, 14, 9, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "stride_hw": (2, 3, 13, 17, 4, 2, 3, (3, 2), (1, 0, 0, 2), (1, 1), 1),
    "stride_gathered": (1, 3, 16, 60, 5, 3, 3, (5, 6), (1, 1, 2, 2), (1, 1), 1),
    "dilated": (1, 4, 12, 12, 6, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1),
    "dilation_hw": (1, 3, 11, 9, 5, 3, 2, (1, 2), (1, 1, 0, 0), (3, 1), 1),
    "pointwise": (2, 33, 7, 9, 17, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "pointwise_s2": (1, 16, 9, 9, 30, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "stem7x7": (1, 3, 23, 23, 8, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),
    "grouped": (2, 8, 7, 7, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4),
    "depthwise": (1, 6, 9, 8, 6, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6),
    "depthwise_mult": (1, 4, 8, 9, 12, 3, 3, (2, 1), (1, 1, 1, 1), (1, 1), 4),
    "kernel_eq_input": (1, 3, 5, 4, 2, 5, 4, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "one_pixel": (3, 2, 1, 1, 3, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "kernel_in_padding": (1, 2, 2, 2, 3, 3, 3, (1, 1), (2, 2, 2, 2), (1, 1), 1),
    "many_tiles": (1, 40, 20, 19, 33, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
}


def make(rng, case, dtype, bias=True):
    n, c, h, w, k, r, s, stride, pads, dil, groups = case
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c // groups, r, s)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if bias else None
    geometry = dict(stride=stride, padding=pads, dilation=dil, groups=groups)
    return x, wt, b, geometry


def run(x, wt, b, geometry, **kwargs):
    t, bo, left, right = geometry["padding"]
    return cso.conv2d(x, wt, b, stride=geometry["stride"], padding=((t, bo), (left, right)),
                      dilation=geometry["dilation"], groups=geometry["groups"], **kwargs)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(rng, name, dtype):
    x, wt, b, geometry = make(rng, CASES[name], dtype, bias=len(name) % 2 == 0)
    assert_conv_close(run(x, wt, b, geometry), x, wt, b, **geometry)


@pytest.mark.parametrize("name", ["pad1", "stride_hw", "grouped", "many_tiles"])
def test_fused_relu(rng, name):
    x, wt, b, geometry = make(rng, CASES[name], F32)
    assert_conv_close(run(x, wt, b, geometry, activation="relu"), x, wt, b, relu=True, **geometry)


@pytest.mark.parametrize("isa", [isa.name for isa in mk.supported_isas()])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_every_supported_isa(rng, isa, dtype):
    x, wt, b, geometry = make(rng, CASES["many_tiles"], dtype)
    t, bo, left, right = geometry["padding"]
    conv = cso.Conv2d(wt, b, padding=((t, bo), (left, right)), isa=isa)
    assert conv.kernel_for(x.shape).isa == isa
    assert_conv_close(conv(x), x, wt, b, **geometry)


@pytest.mark.parametrize("overrides", [
    dict(nc=1), dict(nc=7), dict(nc=3, k2=1, k3=1), dict(k2=2, k3=3), dict(k2=1), dict(k3=2),
    dict(vectors_along="filters"), dict(vectors_along="filters", nc=5, k2=1, k3=2), dict(nc=3, band=1),
    dict(nc=2, band=2, k2=3, k3=2),
])
@pytest.mark.parametrize("name", ["many_tiles", "grouped", "stride_hw"])
def test_both_schedules_identical_over_tilings(rng, name, overrides):
    """Channel remainders (nc not dividing C), partial K2/K3 blocks: IS and WS agree bit for bit
    (same reduction order per output) and match the reference."""
    x, wt, b, geometry = make(rng, CASES[name], F32)
    t, bo, left, right = geometry["padding"]
    results = {}
    for schedule in ("IS", "WS"):
        conv = cso.Conv2d(wt, b, geometry["stride"], ((t, bo), (left, right)), geometry["dilation"],
                          geometry["groups"], plan_overrides=dict(overrides, schedule=schedule))
        plan = conv.plan_for(x.shape)
        assert plan.schedule == schedule
        results[schedule] = conv(x)
    np.testing.assert_array_equal(results["IS"], results["WS"])
    assert_conv_close(results["IS"], x, wt, b, **geometry)


# slab rows (Q + dilation*(S-1) // stride) at least a 32-window tile wide
SLAB_CASES = {
    "slab_stem_s2": (1, 3, 70, 70, 10, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),
    "slab_patch8": (1, 3, 24, 520, 5, 8, 8, (8, 8), (0, 0, 0, 0), (1, 1), 1),   # 64 phase planes
    "slab_s3x2_dilated": (2, 3, 20, 100, 5, 3, 4, (3, 2), (0, 1, 2, 1), (2, 3), 1),
    "slab_1x1_s2": (1, 5, 9, 70, 6, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "slab_pad1": (2, 5, 9, 37, 11, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "slab_narrowest": (1, 3, 5, 30, 9, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),     # rows of 32
    "slab_asym_dilated": (1, 4, 7, 40, 9, 3, 5, (1, 1), (0, 2, 3, 1), (1, 2), 1),
    "slab_grouped_valid": (1, 6, 6, 34, 8, 2, 3, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    "slab_1x1_padded": (1, 7, 4, 33, 10, 1, 1, (1, 1), (1, 0, 2, 0), (1, 1), 1),
}


@pytest.mark.parametrize("overrides", [
    {}, dict(nc=2), dict(nc=3, k2=1, k3=2), dict(microtile_shape=(16, 3)),
    dict(nc=2, band=1), dict(nc=3, band=2, k2=1, k3=1), dict(nc=1, band=3, k2=2, k3=2)])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(SLAB_CASES))
def test_slab_and_packed_tiles_identical(rng, name, dtype, overrides):
    """Reading the input in place from a padded slab (stride phases, windows on virtual rows,
    tiles straddling rows and starting in padding columns; output bands that refill the slab
    rows they read) gives bit for bit the packed tiles' result, in both schedules, with bias and
    ReLU, and matches the reference."""
    x, wt, b, geometry = make(rng, SLAB_CASES[name], dtype)
    t, bo, left, right = geometry["padding"]
    results = []
    for slab in (False, True):
        for schedule in ("IS", "WS"):
            conv = cso.Conv2d(wt, b, geometry["stride"], ((t, bo), (left, right)), geometry["dilation"],
                              geometry["groups"], activation="relu",
                              plan_overrides=dict(overrides, vectors_along="windows", slab=slab,
                                                  schedule=schedule))
            assert conv.plan_for(x.shape).slab == slab
            assert conv.kernel_for(x.shape).variant == ("slab" if slab else "packed")
            results.append(conv(x))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    assert_conv_close(results[0], x, wt, b, relu=True, **geometry)


# direct plans: rows narrower than a tile, Q not a multiple of the tile, single rows and columns
DIRECT_CASES = dict(SLAB_CASES, **{
    "direct_q_below_tile": (2, 5, 6, 4, 40, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "direct_one_row": (1, 4, 1, 23, 17, 1, 3, (1, 1), (0, 0, 1, 1), (1, 1), 1),
    "direct_one_column": (1, 3, 9, 1, 33, 3, 1, (1, 1), (1, 1, 0, 0), (1, 1), 1),
    "direct_s2_odd": (1, 6, 15, 31, 20, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "direct_grouped": (1, 8, 10, 19, 36, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
})


@pytest.mark.parametrize("overrides", [
    {}, dict(nc=2), dict(nc=3, k2=1, k3=2), dict(microtile_shape=(5, 16)),
    dict(microtile_shape=(3, 32), nc=1), dict(nc=2, band=1), dict(nc=3, band=2, k2=1, k3=1),
    dict(nc=1, band=3, k2=2, k3=2)])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(DIRECT_CASES))
def test_direct_and_packed_tiles_identical(rng, name, dtype, overrides):
    """Filters in vectors with the windows broadcast in place from the slab (direct: tiles
    that never span two output rows, edge tiles narrower than the tile, partial filter tiles,
    stride phases, bands that start mid-row and transpose their own output rows) gives bit for
    bit the packed tiles' result, in both schedules, with bias and ReLU, and matches the
    reference."""
    x, wt, b, geometry = make(rng, DIRECT_CASES[name], dtype)
    t, bo, left, right = geometry["padding"]
    results, nc = [], None
    for slab in (True, False):
        for schedule in ("IS", "WS"):
            forced = dict(overrides, vectors_along="filters", slab=slab, schedule=schedule)
            if nc:   # the same channel tiles: the same sums in the same order
                forced["nc"] = nc
            conv = cso.Conv2d(wt, b, geometry["stride"], ((t, bo), (left, right)), geometry["dilation"],
                              geometry["groups"], activation="relu", plan_overrides=forced)
            plan = conv.plan_for(x.shape)
            nc = plan.nc
            assert plan.direct == slab
            assert conv.kernel_for(x.shape).variant == ("direct" if slab else "packed")
            results.append(conv(x))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    assert_conv_close(results[0], x, wt, b, relu=True, **geometry)


@pytest.mark.parametrize("q, nwin, short", [(24, 6, 0), (28, 6, 2), (29, 6, 1), (56, 6, 4),
                                             (13, 5, 2), (7, 4, 1)])
def test_direct_rows_are_cut_into_even_tiles(rng, q, nwin, short):
    """A direct row that does not divide into tiles of 6 takes as many tiles, evened out: 56 =
    6 x 6 + 4 x 5, not 9 x 6 + 2 (whose 2-window tile keeps too few accumulators), 13 = 5 + 4 +
    4; its ``short`` tiles of nwin - 1 windows run a kernel of their own, a row that divides
    (24) has none; on 5 rows in 1-3 parts, matches the reference with bias and ReLU."""
    from cso.lowering import tail_kernel
    x = rng.standard_normal((1, 8, 5, q)).astype(np.float32)
    wt = rng.standard_normal((20, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    results = []
    for split in ((1, 1), (2, 1), (3, 2)):
        conv = cso.Conv2d(wt, b, padding=1, activation="relu", plan_overrides=dict(
            vectors_along="filters", slab=True, microtile_shape=(6, 16), split=split))
        plan = conv.plan_for(x.shape)
        assert plan.direct and (plan.nwin, plan.row_tiles) == (nwin, -(-q // 6))
        assert plan.row_tiles * nwin - q == short
        assert bool(tail_kernel(plan, conv.kernel_for(x.shape))) == bool(short)
        assert not short or f"{short} of them of {nwin - 1} windows" in plan.explain()
        results.append(conv(x))
    assert_conv_close(results[0], x, wt, b, padding=(1, 1, 1, 1), relu=True)
    assert all(np.array_equal(other, results[0]) for other in results[1:])


@pytest.mark.parametrize("vector", ["windows", "filters"])
def test_odd_window_and_filter_counts_cover_every_edge(rng, vector):
    """Output planes of 1..2*Nwin+1 positions and 1..2*Nf+1 filters: every edge tile shape, in
    both orientations (with bias and ReLU, which the filters-in-vectors path applies last)."""
    probe = cso.Conv2d(np.zeros((1, 2, 1, 1), F32), plan_overrides={"vectors_along": vector}).plan_for((1, 2, 8, 8))
    nwin, nf = probe.nwin, probe.nf
    for q in sorted({1, nwin - 1, nwin, nwin + 1, 2 * nwin + 1} - {0}):
        for k in sorted({1, nf - 1, nf, nf + 1, 2 * nf + 1}):
            x = rng.standard_normal((1, 3, 1, q + 2)).astype(F32)
            wt = rng.standard_normal((k, 3, 1, 3)).astype(F32)
            b = rng.standard_normal(k).astype(F32)
            conv = cso.Conv2d(wt, b, activation="relu", plan_overrides={"vectors_along": vector})
            assert conv.plan_for(x.shape).vectors_along == vector
            assert_conv_close(conv(x), x, wt, b, relu=True)


@pytest.mark.parametrize("isa", [isa.name for isa in mk.supported_isas()])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("c,k,size,kernel", [(40, 37, 1, 1), (96, 8, 1, 1), (60, 264, 1, 1),
                                             (7, 19, 3, 3), (5, 33, 7, 7)])
def test_one_pixel_planes(rng, isa, dtype, c, k, size, kernel):
    """A one-pixel output plane (squeeze-excitation 1x1s, a filter as large as its input):
    its transposing pass moves each block as one row. Filter counts on and off the vectors, a
    batch, bias and an activation, and ``accumulate`` (out += conv(x)), on every ISA."""
    x = rng.standard_normal((3, c, size, size)).astype(dtype)
    wt = rng.standard_normal((k, c, kernel, kernel)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    conv = cso.Conv2d(wt, b, activation="relu", isa=isa)
    assert_conv_close(conv(x), x, wt, b, relu=True)
    residual = rng.standard_normal((3, k, 1, 1)).astype(dtype)
    out = residual.copy()
    cso.Conv2d(wt, isa=isa, accumulate=True)(x, out=out)
    assert_conv_close(out - residual, x, wt)


@pytest.mark.parametrize("vector", ["windows", "filters"])
@pytest.mark.parametrize("stride", [1, 2])
def test_slab_parts_within_a_band_fill_the_rows_they_read(rng, vector, stride):
    """A slab plan whose parts split its bands (one band, many parts): each part fills only
    the slab rows its window tiles read, and gets the same bits as one part."""
    x = rng.standard_normal((2, 6, 23, 65)).astype(F32)
    wt = rng.standard_normal((7, 6, 3, 3)).astype(F32)
    b = rng.standard_normal(7).astype(F32)
    base = {"vectors_along": vector, "slab": True}
    one = cso.Conv2d(wt, b, stride, 1, plan_overrides={**base, "split": (1, 1)})(x)
    assert_conv_close(one, x, wt, b, stride=(stride, stride), padding=(1, 1, 1, 1))
    for parts in (2, 5, 13):
        conv = cso.Conv2d(wt, b, stride, 1, plan_overrides={**base, "split": (parts, 1)})
        plan = conv.plan_for(x.shape)
        assert plan.slab and plan.parts[0] == parts   # (one band: the image is small)
        np.testing.assert_array_equal(conv(x), one, err_msg=f"{parts} parts")


@pytest.mark.parametrize("isa", [isa.name for isa in mk.supported_isas()])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("slab", [False, True])
def test_a_groups_last_filter_tile_of_fewer_vectors(rng, restore_threads, isa, dtype, slab):
    """Filters in vectors, a group's filters ending a vector or more short of a tile: its
    last tile runs a kernel of the vectors its filters fill (packed window tiles, and direct
    rows of full and short tiles: 29 windows a row), on a part of the filter tiles alone too;
    against the reference, bias and activation on, every filter count into that last tile
    and past it, 1 and 2 threads bit-identical."""
    lanes = cso.Conv2d(np.ones((1, 1, 1, 1), dtype), isa=isa).kernel_for((1, 1, 3, 3)).lanes
    nf = 2 * lanes   # the filter tiles of these plans: two vectors
    for k in (1, lanes - 1, lanes, lanes + 1, nf + 1, nf + lanes, 2 * nf + lanes - 3):
        groups = 2
        x = rng.standard_normal((1, 6 * groups, 9, 29)).astype(dtype)
        wt = rng.standard_normal((k * groups, 6, 3, 3)).astype(dtype)
        b = rng.standard_normal(k * groups).astype(dtype)
        overrides = {"vectors_along": "filters", "slab": slab}
        conv = cso.Conv2d(wt, b, 1, 1, groups=groups, activation="relu", isa=isa,
                          plan_overrides=overrides)
        cso.set_num_threads(1)
        one = conv(x)
        plan = conv.plan_for(x.shape)
        assert plan.nf == nf and plan.direct == slab, plan
        assert not slab or 29 % plan.row_tiles, plan   # (short tiles in each row)
        assert_conv_close(one, x, wt, b, relu=True, padding=(1, 1, 1, 1), groups=groups)
        cso.set_num_threads(2)
        split = cso.Conv2d(wt, b, 1, 1, groups=groups, activation="relu", isa=isa,
                           plan_overrides={**overrides, "split": (1, 2)})
        np.testing.assert_array_equal(conv(x), one, err_msg=f"{k} filters")
        np.testing.assert_array_equal(split(x), one, err_msg=f"{k} filters, filter parts")


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("size,kernel,dilation", [(7, 3, 1), (8, 3, 1), (9, 4, 1), (10, 3, 2), (5, 1, 1)])
def test_same_padding(rng, size, kernel, dilation, stride):
    x = rng.standard_normal((1, 2, size, size + 1)).astype(F32)
    wt = rng.standard_normal((3, 2, kernel, kernel)).astype(F32)
    y = cso.conv2d(x, wt, stride=stride, dilation=dilation, padding="same")
    assert y.shape[2:] == (-(-size // stride), -(-(size + 1) // stride))
    pads = []
    for n in (size, size + 1):   # SAME_UPPER: total pad split with the odd one at the end
        total = max(0, (-(-n // stride) - 1) * stride + dilation * (kernel - 1) + 1 - n)
        pads += [total // 2, total - total // 2]
    assert_conv_close(y, x, wt, stride=(stride, stride), padding=tuple(pads), dilation=(dilation, dilation))


def test_valid_padding_is_zero_padding(rng):
    x, wt, b, geometry = make(rng, CASES["plain3x3"], F32)
    np.testing.assert_array_equal(cso.conv2d(x, wt, b, padding="valid"), cso.conv2d(x, wt, b))


def test_padding_forms_agree(rng):
    x = rng.standard_normal((1, 2, 6, 7)).astype(F32)
    wt = rng.standard_normal((3, 2, 3, 3)).astype(F32)
    a = cso.conv2d(x, wt, padding=1)
    np.testing.assert_array_equal(a, cso.conv2d(x, wt, padding=(1, 1)))
    np.testing.assert_array_equal(a, cso.conv2d(x, wt, padding=((1, 1), (1, 1))))
    b = cso.conv2d(x, wt, padding=(2, 0))
    assert_conv_close(b, x, wt, padding=(2, 2, 0, 0))


def test_non_contiguous_inputs(rng):
    x, wt, b, geometry = make(rng, CASES["pad1"], F32)
    expected = run(x, wt, b, geometry)
    big = rng.standard_normal((4, 10, 20, 25)).astype(F32)
    big[::2, ::2, 1:19:2, 2:24:2] = x
    sliced = big[::2, ::2, 1:19:2, 2:24:2]
    assert not sliced.flags.c_contiguous
    np.testing.assert_array_equal(run(sliced, wt, b, geometry), expected)
    fortran = np.asfortranarray(x)
    np.testing.assert_array_equal(run(fortran, np.asfortranarray(wt), b, geometry), expected)
    np.testing.assert_array_equal(run(x, wt[:, :, ::-1, ::-1].copy()[:, :, ::-1, ::-1], b, geometry), expected)
    readonly = x.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(run(readonly, wt, b, geometry), expected)


def test_out_argument(rng):
    x, wt, b, geometry = make(rng, CASES["stride2"], F64)
    expected = run(x, wt, b, geometry)
    out = np.full(expected.shape, np.nan)
    result = run(x, wt, b, geometry, out=out)
    assert result is out
    np.testing.assert_array_equal(out, expected)


def test_strided_out_across_channel_tiles(rng):
    """out= that is a channel slice of a larger buffer (a concatenation target) or
    Fortran-ordered, with several channel tiles accumulating."""
    x, wt, b, geometry = make(rng, CASES["many_tiles"], F32)
    t, bo, left, right = geometry["padding"]
    conv = cso.Conv2d(wt, b, padding=((t, bo), (left, right)), plan_overrides={"nc": 7})
    assert conv.plan_for(x.shape).channel_tiles > 1
    expected = conv(x)
    buffer = np.full((1, 50) + expected.shape[2:], np.nan, F32)
    view = buffer[:, 10:10 + expected.shape[1]]
    assert conv(x, out=view) is view
    np.testing.assert_array_equal(view, expected)
    assert np.isnan(buffer[:, :10]).all() and np.isnan(buffer[:, 10 + expected.shape[1]:]).all()
    fortran = np.asfortranarray(np.zeros_like(expected))
    np.testing.assert_array_equal(conv(x, out=fortran), expected)
    contiguous = np.zeros_like(expected)
    np.testing.assert_array_equal(conv(x, out=contiguous), expected)


def test_unbatched_input(rng):
    x, wt, b, geometry = make(rng, CASES["pad1"], F32)
    y = run(x[1], wt, b, geometry)
    assert y.ndim == 3
    np.testing.assert_array_equal(y, run(x, wt, b, geometry)[1])
    out = np.empty_like(y)
    assert run(x[1], wt, b, geometry, out=out) is out
    np.testing.assert_array_equal(out, y)


def test_empty_batch(rng):
    wt = rng.standard_normal((4, 3, 3, 3)).astype(F32)
    y = cso.conv2d(np.zeros((0, 3, 8, 8), F32), wt, padding=1)
    assert y.shape == (0, 4, 8, 8) and y.dtype == F32


def test_repeated_plain_calls_skip_the_checks_made_before(rng):
    """A call on a C-contiguous NCHW array of a shape called before (no ``out``, no layout)
    runs what the first call chose (``Conv2d._plain``): the same values in a new array each
    time. Other arrays of that shape take the checked call: strided ones run, a masked one or
    one of another dtype is refused."""
    x, wt, b, geometry = make(rng, CASES["pad1"], F32)
    conv = cso.Conv2d(wt, b, padding=1, activation="relu")
    first = conv(x)
    assert len(conv._plain) == 1
    second = conv(x)
    assert second is not first and np.array_equal(second, first)
    assert_conv_close(second, x, wt, b, relu=True, **geometry)
    np.testing.assert_array_equal(conv(np.asfortranarray(x)), first)
    with pytest.raises(TypeError, match="masked array"):
        conv(np.ma.masked_array(x, mask=np.zeros_like(x, bool)))
    with pytest.raises(TypeError, match="float64 differs"):
        conv(x.astype(F64))
    assert len(conv._plain) == 1


def test_prepared_conv_reuses_packed_filters_and_plans(rng):
    x, wt, b, geometry = make(rng, CASES["pad1"], F32)
    t, bo, left, right = geometry["padding"]
    conv = cso.Conv2d(wt, b, padding=((t, bo), (left, right)))
    wt_copy, b_copy = wt.copy(), b.copy()
    wt[...] = 0   # the prepared conv keeps its own copies
    b[...] = 100
    assert_conv_close(conv(x), x, wt_copy, b_copy, **geometry)
    other = rng.standard_normal((3, 5, 12, 4)).astype(F32)   # another shape, same conv
    assert_conv_close(conv(other), other, wt_copy, b_copy, **geometry)
    plan = conv.plan_for(other.shape)
    assert plan is conv.plan_for(other.shape)
    assert plan.spec.input_shape == other.shape and "SlicingPlan" in plan.explain()


def test_input_shape_at_load_packs_once_for_that_plan(rng):
    """A 7x7 plane plans filters in vectors: given the shape at load, the filters are packed
    for that orientation only; without it they are packed for windows in vectors at load and
    repacked once on first use, unless both tiles hold as many filters (NEON: 8 and 8)."""
    x = rng.standard_normal((1, 16, 7, 7)).astype(F32)
    wt = rng.standard_normal((64, 16, 3, 3)).astype(F32)
    known = cso.Conv2d(wt, padding=1, input_shape=x.shape)
    plan = known.plan_for(x.shape)
    assert plan.vectors_along == "filters" and list(known._packed) == [plan.nf]
    assert_conv_close(known(x), x, wt, padding=(1, 1, 1, 1))
    assert list(known._packed) == [plan.nf]
    later = cso.Conv2d(wt, padding=1)
    np.testing.assert_array_equal(later(x), known(x))
    at_load = csa.register_blocking.microtile(cso.host_machine(), 4)[1]
    assert sorted(later._packed) == sorted({at_load, plan.nf})
    with pytest.raises(ValueError, match="channels"):
        cso.Conv2d(wt, input_shape=(1, 3, 7, 7))


def test_one_loop_nest_serves_every_shape_and_micro_kernel(rng):
    """A loop nest is built per dtype, never per shape, micro-tile or orientation (the kernels
    are called through addresses): at most one new build here, if no earlier test built the
    float32 one, across three micro-kernels (a windows-in-vectors tile of 16 x 6 is the kernel
    of a filters-in-vectors 6 x 16 one: hence 16 x 5 here)."""
    from cso.prepared import part_entry
    wt = rng.standard_normal((5, 3, 3, 3)).astype(F32)
    built, kernels = part_entry.compiled(), set()
    for hw in (33, 34, 37, 40):   # wide enough for a slab at stride 2
        for dilation in (1, 2):
            x = rng.standard_normal((1 + hw % 2, 3, hw, hw + 1)).astype(F32)
            for overrides in ({"vectors_along": "windows", "slab": False, "microtile_shape": (16, 5)},
                              {"vectors_along": "filters"},
                              {"vectors_along": "windows", "slab": True, "microtile_shape": (16, 4)}):
                conv = cso.Conv2d(wt, padding=hw % 3, stride=1 + hw % 2, dilation=dilation,
                                  plan_overrides=overrides)
                kernels.add(conv.kernel_for(x.shape))
                assert_conv_close(conv(x), x, wt, padding=(hw % 3,) * 4, stride=(1 + hw % 2,) * 2,
                                  dilation=(dilation,) * 2)
    assert len(kernels) >= 3
    assert part_entry.compiled() - built <= 1


@pytest.mark.parametrize("overrides", [{"slab": True}, {"slab": False, "schedule": "WS"},
                                       {"vectors_along": "filters"}])
def test_phases_alone_run_the_same_tiles(rng, overrides):
    """The benchmark's time breakdown runs loop-nest phases alone: all of them is exactly a
    call; packing only or post-conv only run without touching anything else."""
    from cso.loop_nests import ALL_PHASES, KERNEL, PACK, POST
    x = rng.standard_normal((2, 12, 5, 37)).astype(np.float32)   # rows wide enough for a slab
    w = rng.standard_normal((20, 12, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, rng.standard_normal(20).astype(np.float32), padding=1, activation="relu",
                      plan_overrides=overrides)
    expected = conv(x)
    np.testing.assert_array_equal(conv.call_phases(x, ALL_PHASES), expected)
    for phases in (0, PACK, POST, PACK | POST, KERNEL | POST):
        assert conv.call_phases(x, phases).shape == expected.shape
    np.testing.assert_array_equal(conv(x), expected)   # nothing a phase run left behind leaks


@pytest.mark.parametrize("vector", ["windows", "filters"])
def test_unpadded_1x1_reads_its_input_in_place_with_windows_in_vectors(rng, vector):
    """Windows in vectors: full window tiles of an unpadded stride-1 1x1 are the input rows
    themselves (no packing; the plane's last partial tile is packed). With filters in vectors
    the broadcast windows are packed. Both match the reference, on several images."""
    from cso.loop_nests import GEOM
    x = rng.standard_normal((3, 20, 9, 11)).astype(np.float32)     # 99 windows: 3 full tiles + 3
    w = rng.standard_normal((24, 20, 1, 1)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    conv = cso.Conv2d(w, b, plan_overrides={"vectors_along": vector, "nc": 7})
    out = conv(x)
    assert_conv_close(out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    prepared = conv._prepared(x.shape, x.dtype, cso.get_num_threads())
    assert prepared.geom[GEOM.index("unpacked")] == (vector == "windows")


@pytest.mark.parametrize("name", ["pad1", "grouped", "depthwise", "pointwise"])
def test_bound_call_matches_the_checked_call_and_falls_back_to_it(rng, name):
    """``Conv2d.bound(shape)`` gives the checked call's result, bit for bit, on arrays of its
    shape; other arrays go through the checked call (and its errors)."""
    x, wt, b, geometry = make(rng, CASES[name], F32)
    t, bo, left, right = geometry["padding"]
    conv = cso.Conv2d(wt, b, geometry["stride"], ((t, bo), (left, right)), geometry["dilation"],
                      geometry["groups"], activation="relu")
    run = conv.bound(x.shape)
    expected = conv(x)
    assert run.out_shape == expected.shape
    out = np.empty(run.out_shape, F32)
    assert run(x, out) is out
    np.testing.assert_array_equal(out, expected)
    assert_conv_close(out, x, wt, b, relu=True, **geometry)
    # another batch size, a strided input and a strided out: the checked call's results
    x2 = rng.standard_normal((x.shape[0] + 1,) + x.shape[1:]).astype(F32)
    out2 = np.empty((x2.shape[0],) + run.out_shape[1:], F32)
    np.testing.assert_array_equal(run(x2, out2), conv(x2))
    strided = np.repeat(x, 2, axis=3)[..., ::2]
    np.testing.assert_array_equal(run(strided, np.empty_like(out)), expected)
    wide = np.empty(run.out_shape[:3] + (2 * run.out_shape[3],), F32)
    run(x, wide[..., ::2])
    np.testing.assert_array_equal(wide[..., ::2], expected)
    with pytest.raises(TypeError, match="dtype"):
        run(x, np.empty(run.out_shape, F64))
    with pytest.raises(TypeError, match="out must be a plain numpy.ndarray"):
        run(x, out.tolist())
    if x.shape == run.out_shape:   # an out that is the input: refused as the checked call does
        with pytest.raises(ValueError, match="overlaps"):
            run(x, x)
