"""Micro-kernels over their edges, against the NumPy contract, with guard values around C."""
from dataclasses import replace

import numpy as np
import pytest

import csa
import microkernels as mk
import packing
from microkernels.reference import other_group_lanes, stored_windows
from microkernels.outer_product import UNROLL

from .machines import NEON

SENTINEL = 12345.0


def host_specs():
    """The kernels plans choose on each ISA of this CPU: windows in vectors (filters
    broadcast; with and without the prefetch of later tiles' output rows its record asks
    for), filters in vectors (windows broadcast, the next filter tile prefetched) on a 2x2, a
    7x7 and a 14x14 plane."""
    specs = set()
    for isa in mk.supported_isas():
        for dtype, itemsize in (("f32", 4), ("f64", 8)):
            tuning = csa.tuning.record(isa.name)
            machine = csa.Machine(vector_bytes=isa.vector_bytes,
                                  vector_registers=isa.vector_registers, tuning=tuning)
            nwin, nf = csa.register_blocking.microtile(machine, itemsize)
            specs.add(mk.KernelSpec(dtype, nf, nwin, isa.name))
            specs.add(mk.KernelSpec(dtype, nf, nwin, isa.name, prefetch=tuning.output_prefetch))
            for positions in (4, 49, 196):
                windows, filters = csa.register_blocking.filter_vector_tile(machine, itemsize, positions)
                specs.add(mk.KernelSpec(dtype, windows, filters, isa.name, prefetch_next=True))
            # more vectors than broadcasts (a 3 x 32 tile on AVX2): its rows stream the other way
            specs.add(mk.KernelSpec(dtype, 3, 4 * isa.vector_bytes // itemsize, isa.name))
    return sorted(specs, key=str)


SPECS = host_specs()
DEPTHS = sorted({1, UNROLL - 1, UNROLL, UNROLL + 1, 2 * UNROLL, 2 * UNROLL + 1, 3 * UNROLL + 2})
FLAG_SETS = (0, mk.ACCUMULATE, mk.BIAS, mk.ACTIVATE, mk.ACCUMULATE | mk.BIAS | mk.ACTIVATE)


def run_both(spec, rng, k, width_used, rows_used, flags, ldc, lda=None, ldb=None):
    dt = spec.np_dtype
    lda = spec.width if lda is None else lda
    ldb = spec.broadcasts if ldb is None else ldb
    a = rng.standard_normal((k - 1) * lda + spec.width).astype(dt)   # exactly what k rows span
    b = rng.standard_normal((k - 1) * ldb + spec.broadcasts).astype(dt)
    bias = rng.standard_normal(rows_used).astype(dt)   # exactly rows_used values: no slack to read
    guard = 7
    c = np.full(guard + (rows_used - 1) * ldc + width_used + guard, SENTINEL, dtype=dt)
    inside = np.zeros(c.shape, bool)
    for f in range(rows_used):
        start = guard + f * ldc
        c[start:start + width_used] = rng.standard_normal(width_used)
        inside[start:start + width_used] = True
    expected = c.copy()
    mk.reference_kernel(spec)(k, a, b, expected[guard:], ldc, width_used, rows_used, bias, flags, lda, ldb)
    actual = c.copy()
    mk.compile(spec)(k, a, b, actual[guard:], ldc, width_used, rows_used, bias, flags, lda, ldb)
    return actual, expected, inside


def check(spec, actual, expected, inside, k):
    assert np.all(actual[~inside] == SENTINEL), "kernel wrote outside its output rows"
    tol = (1e-5 if spec.dtype == "f32" else 1e-13) * np.sqrt(k) * (np.sqrt(k) + 2)
    np.testing.assert_allclose(actual[inside], expected[inside], rtol=0, atol=tol)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_every_window_count(spec, rng):
    for k in DEPTHS:
        for width_used in range(1, spec.width + 1):
            flags = FLAG_SETS[width_used % len(FLAG_SETS)]
            ldc = spec.width + 2 * k + 1  # odd row stride
            check(spec, *run_both(spec, rng, k, width_used, spec.broadcasts, flags, ldc), k)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_every_filter_count(spec, rng):
    for k in DEPTHS:
        for rows_used in range(1, spec.broadcasts + 1):
            for width_used in (1, spec.lanes - 1 or 1, spec.width):
                flags = FLAG_SETS[(rows_used + k) % len(FLAG_SETS)]
                check(spec, *run_both(spec, rng, k, width_used, rows_used, flags, width_used), k)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_every_flag_combination(spec, rng):
    for flags in range(8):
        check(spec, *run_both(spec, rng, 2 * UNROLL + 1, spec.width - 1, spec.broadcasts, flags, spec.width + 3),
              2 * UNROLL + 1)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_operand_row_strides(spec, rng):
    """Unpacked operands (lda or ldb = H*W, odd): rows read at their stride."""
    for k in DEPTHS:
        lda, ldb = spec.width + 2 * k + 3, spec.broadcasts + k + 2
        check(spec, *run_both(spec, rng, k, spec.width, spec.broadcasts, mk.ACCUMULATE, spec.width + 1, lda), k)
        check(spec, *run_both(spec, rng, k, spec.width - 1, spec.broadcasts, 0, spec.width, None, ldb), k)


def run_slab(spec, rng, k, width_used, rows_used, flags, col0, width, gap):
    """A slab kernel on A rows at scattered offsets, C rows of width - gap real columns (plus
    slack) between sentinels."""
    dt = spec.np_dtype
    slab_rows = np.sort(rng.choice(3 * k + spec.width, size=k, replace=False)).astype(np.int64)
    rng.shuffle(slab_rows)
    a = rng.standard_normal(int(slab_rows.max()) + spec.width).astype(dt)   # no slack after the last row
    b = rng.standard_normal(k * spec.broadcasts).astype(dt)
    bias = rng.standard_normal(rows_used).astype(dt)
    _, offsets = stored_windows(width_used, col0, width, gap)
    return run_on_rows(spec, rng, (k, a, b), 2 * width + 5, offsets, width_used, rows_used, bias,
                       flags, slab_rows=slab_rows, col0=col0, row_width=width, gap=gap)


def run_on_rows(spec, rng, operands, ldc, offsets, width_used, rows_used, bias, flags, **call):
    """Kernel and reference on ``operands`` (k, a, b) into C rows ``ldc`` apart, each storing
    at ``offsets`` (random values there, sentinels around them): (actual, expected, the
    stored elements' mask)."""
    guard = 7
    end = (rows_used - 1) * ldc + max(ldc, offsets.max(initial=0) + 1)
    c = np.full(2 * guard + end, SENTINEL, spec.np_dtype)
    inside = np.zeros(c.shape, bool)
    for f in range(rows_used):
        inside[guard + f * ldc + offsets] = True
    c[inside] = rng.standard_normal(inside.sum())
    expected, actual = c.copy(), c.copy()
    args = (ldc, width_used, rows_used, bias, flags)
    mk.reference_kernel(spec)(*operands, expected[guard:], *args, **call)
    mk.compile(spec)(*operands, actual[guard:], *args, **call)
    return actual, expected, inside


@pytest.mark.parametrize("spec", sorted({mk.KernelSpec(s.dtype, s.broadcasts, s.width, s.isa, "slab",
                                                        s.prefetch) for s in SPECS}, key=str), ids=str)
def test_slab_kernel_virtual_rows(spec, rng):
    """Every first column of a tile on virtual rows as narrow as the tile, with no padding, one
    column or all but one: windows in padding columns are never stored, the second row's land
    right after the first row's real columns."""
    for width in (spec.width, spec.width + 3):
        for gap in sorted({0, 1, 2, width - 1}):
            for col0 in range(width):
                k = DEPTHS[col0 % len(DEPTHS)]
                width_used = max(1, spec.width - (col0 % 3) * (col0 % 5))
                rows_used = spec.broadcasts - col0 % spec.broadcasts
                flags = FLAG_SETS[(col0 + gap) % len(FLAG_SETS)]
                check(spec, *run_slab(spec, rng, k, width_used, rows_used, flags, col0, width, gap), k)


@pytest.mark.parametrize("spec", sorted({mk.KernelSpec(s.dtype, b, s.width, s.isa, "direct",
                                                        prefetch_next=True)
                                         for s in SPECS for b in (s.broadcasts, 14)}, key=str), ids=str)
def test_direct_kernel(spec, rng):
    """B rows read in place at scattered, overlapping offsets (windows along a slab row), no
    slack after the last one; C stored like a packed kernel's, every edge count."""
    dt = spec.np_dtype
    for k in DEPTHS:
        for rows_used in range(1, spec.broadcasts + 1):
            width_used = spec.width - (rows_used * 3) % spec.width
            flags = FLAG_SETS[(rows_used + k) % len(FLAG_SETS)]
            slab_rows = rng.integers(0, 2 * k + spec.broadcasts, size=k).astype(np.int64)
            a = rng.standard_normal(k * spec.width).astype(dt)
            b = rng.standard_normal(int(slab_rows.max()) + spec.broadcasts).astype(dt)
            bias = rng.standard_normal(rows_used).astype(dt)
            ldc, guard = spec.width + 3, 7
            c = np.full(guard + (rows_used - 1) * ldc + width_used + guard, SENTINEL, dtype=dt)
            inside = np.zeros(c.shape, bool)
            for f in range(rows_used):
                inside[guard + f * ldc: guard + f * ldc + width_used] = True
            c[inside] = rng.standard_normal(inside.sum())
            expected, actual = c.copy(), c.copy()
            args = (k, a, b, None, ldc, width_used, rows_used, bias, flags)
            mk.reference_kernel(spec)(*args[:3], expected[guard:], *args[4:], slab_rows=slab_rows)
            mk.compile(spec)(*args[:3], actual[guard:], *args[4:], slab_rows=slab_rows)
            check(spec, actual, expected, inside, k)


@pytest.mark.parametrize("spec", sorted({mk.KernelSpec(s.dtype, s.broadcasts, s.width, s.isa,
                                                        prefetch_next=True) for s in SPECS},
                                        key=str), ids=str)
def test_prefetch_next_stores_what_the_plain_kernel_does(spec, rng):
    """A kernel that prefetches the next filter tile stores bit for bit what the kernel
    without it stores, whatever ``next`` (a hint: the next tile's share, a step past each
    row's line, a null address) and every depth (the remainder rows after the trips)."""
    plain = mk.compile(replace(spec, prefetch_next=False))
    dt = spec.np_dtype
    for k in DEPTHS:
        a = rng.standard_normal(k * spec.width).astype(dt)
        b = rng.standard_normal(k * spec.broadcasts).astype(dt)
        following = rng.standard_normal(2 * k * spec.width).astype(dt)   # "the next tile"
        bias = rng.standard_normal(spec.broadcasts).astype(dt)
        c0 = rng.standard_normal(spec.broadcasts * spec.width).astype(dt)
        expected = c0.copy()
        plain(k, a, b, expected, spec.width, spec.width, spec.broadcasts, bias,
              mk.ACCUMULATE | mk.BIAS)
        for address, step in ((following.ctypes.data, 7), (following.ctypes.data, 128), (0, 0)):
            actual = c0.copy()
            mk.compile(spec)(k, a, b, actual, spec.width, spec.width, spec.broadcasts, bias,
                             mk.ACCUMULATE | mk.BIAS, next_address=address, next_step=step)
            np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("spec", sorted({mk.KernelSpec(s.dtype, b, s.width, s.isa, "blocked",
                                                        prefetch_next=b == s.broadcasts)
                                         for s in SPECS for b in (s.broadcasts, 5)}, key=str), ids=str)
def test_blocked_kernel(spec, rng):
    """Windows broadcast every ``ldb`` elements from rows at scattered offsets (no slack after
    the last window), C stored as channel blocks (rows ``ldc`` = the lanes apart, vectors a
    block plane apart) or channels last (vectors adjacent, rows a pixel of K apart); the bias
    along the vectors; every edge count, and nothing written outside the used lanes."""
    dt, lanes = spec.np_dtype, spec.lanes
    for k in DEPTHS:
        for rows_used in range(1, spec.broadcasts + 1):
            width_used = spec.width - (rows_used * 3 + k) % spec.width
            flags = FLAG_SETS[(rows_used + k) % len(FLAG_SETS)]
            ldb = (1, 2 * lanes, lanes + 3)[(rows_used + k) % 3]
            slab_rows = rng.integers(0, 2 * k + lanes, size=k).astype(np.int64)
            a = rng.standard_normal(k * spec.width).astype(dt)
            b = rng.standard_normal(int(slab_rows.max()) + (spec.broadcasts - 1) * ldb + 1).astype(dt)
            bias = rng.standard_normal(width_used).astype(dt)   # no slack past the used lanes
            for ldc, ldv in ((lanes, lanes * spec.broadcasts + 5), (spec.width + 2, lanes)):
                offsets = np.arange(width_used) // lanes * ldv + np.arange(width_used) % lanes
                check(spec, *run_on_rows(spec, rng, (k, a, b), ldc, offsets, width_used,
                                         rows_used, bias, flags, ldb=ldb, slab_rows=slab_rows,
                                         ldv=ldv), k)


@pytest.mark.parametrize("spec", sorted({mk.KernelSpec(s.dtype, b, s.width, s.isa, "blocked",
                                                        prefetch_next=b == 5, merged=True)
                                         for s in SPECS for b in (s.broadcasts, 5)}, key=str), ids=str)
def test_merged_kernel_masks_the_other_groups_lanes(spec, rng):
    """Filters of groups merged onto blocks (``packing.merge_groups``): a lane whose filter
    row holds ``packing.other_group`` takes nothing from that row, so NaNs and infinities in
    the windows reach only the lanes of their own rows' groups; a group's own NaN filters
    (positive) and -inf count. Every depth and edge count, as the blocked kernel's test."""
    dt, lanes = spec.np_dtype, spec.lanes
    poisoned = 0
    for k in DEPTHS:
        for rows_used in range(1, spec.broadcasts + 1, 2):
            width_used = spec.width - (rows_used * 3 + k) % spec.width
            flags = FLAG_SETS[(rows_used + k) % len(FLAG_SETS)]
            ldb = (1, 2 * lanes, lanes + 3)[(rows_used + k) % 3]
            slab_rows = rng.integers(0, 2 * k + lanes, size=k).astype(np.int64)
            a = rng.standard_normal((k, spec.width)).astype(dt)
            group = np.arange(spec.width) % lanes * 2 // lanes   # two groups a vector
            a[group != np.arange(k)[:, None] % 2] = packing.other_group(dt)
            own = ~other_group_lanes(a)
            a[0, np.flatnonzero(own[0])[:1]] = (np.nan, -np.inf)[k % 2]
            b = rng.standard_normal(int(slab_rows.max()) + (spec.broadcasts - 1) * ldb + 1).astype(dt)
            b[slab_rows[-1]] = (np.nan, np.inf, -np.inf)[k % 3]   # the last row's first window
            bias = rng.standard_normal(width_used).astype(dt)
            actual, expected, inside = run_on_rows(
                spec, rng, (k, a.ravel(), b), spec.width + 2, np.arange(width_used),
                width_used, rows_used, bias, flags, ldb=ldb, slab_rows=slab_rows, ldv=lanes)
            assert np.all(actual[~inside] == SENTINEL), "kernel wrote outside its output rows"
            np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
            check(spec, np.nan_to_num(actual, nan=0), np.nan_to_num(expected, nan=0), inside, k)
            poisoned += np.isfinite(expected[inside]).sum() > 0 and np.isnan(expected).any()
    assert poisoned   # (some outputs NaN beside finite ones: the masks were tested)


@pytest.mark.parametrize("spec", sorted({mk.BlockedDepthwiseSpec(s.dtype, w, s.isa, act)
                                         for s in SPECS for w in (1, 7, 8)
                                         for act in ("relu", "silu")}, key=str), ids=str)
def test_blocked_depthwise_kernel(spec, rng):
    """Every tap count, windows ``step`` apart (stride 1 and 2 blocks, and adjacent), each flag
    set: the windows' lanes written, nothing around them, and the input read no further than
    the last window's last tap (it ends there)."""
    dt, lanes = spec.np_dtype, spec.lanes
    for taps in (1, 2, 9, 25):
        for step, flags in ((lanes, FLAG_SETS[taps % 5]), (2 * lanes, mk.BIAS | mk.ACTIVATE),
                            (lanes + 1, 0)):
            offsets = (rng.permutation(taps + 3)[:taps] * lanes).astype(np.int64)
            x = rng.standard_normal(int(offsets.max()) + (spec.windows - 1) * step + lanes).astype(dt)
            weights = rng.standard_normal(taps * lanes).astype(dt)
            bias = rng.standard_normal(lanes).astype(dt)
            guard = 5
            out = np.full(spec.windows * lanes + 2 * guard, SENTINEL, dt)
            expected = out.copy()
            args = (x, offsets, step, weights)
            mk.compile(spec)(*args, out[guard:-guard], bias, flags)
            mk.reference_kernel(spec)(*args, expected[guard:-guard], bias, flags)
            inside = np.zeros(out.shape, bool)
            inside[guard:-guard] = True
            check(spec, out, expected, inside, taps)


@pytest.mark.parametrize("spec", sorted({mk.TransposeSpec(s.dtype, s.isa) for s in SPECS}, key=str),
                         ids=str)
def test_transpose_block_every_size(spec, rng):
    """The filters-in-vectors epilogue: every rows x cols block up to lanes x lanes (whole
    blocks take the unmasked path) is written transposed, added to what is there (a residual)
    or not, with bias and ReLU, and nothing around it is touched or read (the source past the
    block is NaN: a read would show). One row written to consecutive elements (a one-pixel
    plane's, ``ldd`` 1) takes a path of its own."""
    lanes, dt = spec.lanes, spec.np_dtype
    lds, guard = lanes + 3, 7
    for rows, ldd in [(rows, lanes + 5) for rows in range(1, lanes + 1)] + [(1, 1)]:
        for cols in range(1, lanes + 1):
            for flags in (0, mk.BIAS, mk.ACTIVATE, mk.BIAS | mk.ACTIVATE, mk.ACCUMULATE,
                          mk.ACCUMULATE | mk.BIAS | mk.ACTIVATE):
                src = np.full((rows - 1) * lds + cols, np.nan, dt)
                for i in range(rows):
                    src[i * lds:i * lds + cols] = rng.standard_normal(cols)
                bias = rng.standard_normal(cols).astype(dt)
                dst = np.full(2 * guard + (cols - 1) * ldd + rows, SENTINEL, dt)
                for j in range(cols):   # what ACCUMULATE adds to (a residual)
                    dst[guard + j * ldd:guard + j * ldd + rows] = rng.standard_normal(rows)
                expected = dst.copy()
                mk.compile(spec)(src, lds, dst[guard:-guard], ldd, rows, cols, bias, flags)
                mk.reference_kernel(spec)(src, lds, expected[guard:-guard], ldd, rows, cols, bias,
                                          flags)
                np.testing.assert_array_equal(dst, expected, err_msg=f"{rows} x {cols}")


def test_relu_keeps_nan_and_clamps_negatives():
    spec = SPECS[0]
    k = 1
    a = np.zeros(spec.width, spec.np_dtype)
    a[:3] = [np.nan, -1.0, 2.0]
    b = np.ones(spec.broadcasts, spec.np_dtype)
    c = np.empty(spec.broadcasts * spec.width, spec.np_dtype)
    mk.compile(spec)(k, a, b, c, spec.width, spec.width, spec.broadcasts, None, mk.ACTIVATE)
    assert np.isnan(c[0]) and c[1] == 0.0 and c[2] == 2.0


def test_python_wrapper_refuses_what_would_touch_foreign_memory():
    spec = SPECS[0]
    kernel = mk.compile(spec)
    a = np.zeros(4 * spec.width, spec.np_dtype)
    b = np.zeros(4 * spec.broadcasts, spec.np_dtype)
    c = np.zeros(spec.broadcasts * spec.width, spec.np_dtype)
    for args, kwargs in [((4, a, b, c, spec.width, spec.width, spec.broadcasts, None, mk.BIAS), {}),
                         ((-1, a, b, c, spec.width, spec.width, spec.broadcasts), {}),
                         ((4, a, b, c, -10 ** 6, spec.width, spec.broadcasts), {}),
                         ((4, a, b, c[::-1], spec.width, spec.width, spec.broadcasts), {}),
                         ((5, a, b, c, spec.width, spec.width, spec.broadcasts), {}),
                         ((4, a, b, c, spec.width, spec.width, spec.broadcasts), {"lda": spec.width - 1}),
                         ((4, a, b, c, spec.width, spec.width, spec.broadcasts), {"ldb": spec.broadcasts + 1}),
                         ((4, a.astype(np.float16), b, c, spec.width, spec.width, spec.broadcasts), {})]:
        with pytest.raises(ValueError):
            kernel(*args, **kwargs)
    readonly = c.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        kernel(4, a, b, readonly, spec.width, spec.width, spec.broadcasts)


FAMILY_SPECS = [mk.KernelSpec("f64", 3, 8, "avx512"), mk.KernelSpec("f32", 8, 32, "avx2", "slab"),
                mk.KernelSpec("f32", 6, 16, "avx2", "slab", 2), mk.KernelSpec("f64", 8, 8, "neon", prefetch=12),
                mk.KernelSpec("f32", 14, 32, "avx512", "direct"), mk.DepthwiseSpec("f64", 3, "avx2"),
                mk.KernelSpec("f64", 7, 16, "avx512", "direct", prefetch_next=True),
                mk.KernelSpec("f32", 14, 16, "avx512", "blocked", prefetch_next=True, merged=True),
                mk.KernelSpec("f32", 5, 8, "avx2", "blocked", activation="silu", merged=True),
                mk.TransposeSpec("f32", "avx2"), mk.TransposeSpec("f64", "neon"),
                mk.RowCopySpec("f32", 21, "avx2"), mk.TapCopySpec("f64", 8, "generic")]


@pytest.mark.parametrize("spec", SPECS + FAMILY_SPECS, ids=str)
def test_spec_names_round_trip(spec):
    assert type(spec).parse(spec.name) == spec == mk.parse_name(spec.name)
    assert str(spec) == spec.name


def test_kernel_spec_names():
    assert mk.KernelSpec.parse("f32_conv_ukernel_14x32__avx512") == mk.KernelSpec("f32", 14, 32, "avx512")
    assert mk.KernelSpec("f32", 6, 16, "avx2", "direct").name == "f32_conv_ukernel_6x16_direct__avx2"
    assert mk.KernelSpec("f32", 6, 16, "avx2").vectors == 2
    assert mk.KernelSpec("f32", 6, 16, "avx2", "slab", 2).name == "f32_conv_ukernel_6x16_slab_pf2__avx2"
    assert mk.KernelSpec("f32", 14, 32, "avx512", "direct", activation="silu",
                         prefetch_next=True).name == "f32_conv_ukernel_14x32_direct_next_silu__avx512"
    assert mk.KernelSpec("f32", 14, 16, "avx512", "blocked", activation="silu",
                         prefetch_next=True, merged=True).name == \
        "f32_conv_ukernel_14x16_blocked_next_merged_silu__avx512"
    with pytest.raises(ValueError, match="prefetch >= 0"):
        mk.KernelSpec("f32", 6, 16, "avx2", prefetch=-1)
    with pytest.raises(ValueError, match="merged needs the blocked variant"):
        mk.KernelSpec("f32", 6, 16, "avx2", "direct", merged=True)


@pytest.mark.parametrize("name", ["f16_conv_ukernel_4x16__avx512", "f32_conv_ukernel_4x16",
                                  "f32_conv_ukernel_4x17__avx512", "f32_conv_ukernel_0x16__avx512",
                                  "f32_conv_ukernel_4x16__sse9", "f32_conv_ukernel_4x16_bslab__avx2",
                                  "f32_transpose_16x16__avx2", "f32_dw_ukernel_0v__avx2",
                                  "f32_row_copy_0__avx2", "f32_pack_rows_8__avx2", "",
                                  "f32_conv_ukernel_4x16_pf0__avx2", "f32_conv_ukernel_4x16_pf02__avx2",
                                  "f32_conv_ukernel_4x16_pf2_slab__avx2", "f32_conv_ukernel_4x16_pf__avx2",
                                  "f32_conv_ukernel_4x16_next_next__avx2",
                                  "f32_conv_ukernel_4x16_next_slab__avx2",
                                  "f32_conv_ukernel_4x16_merged__avx2",
                                  "f32_conv_ukernel_4x16_blocked_merged_merged__avx2",
                                  "f32_conv_ukernel_4x16_blocked_merged_next__avx2"])
def test_spec_names_refused(name):
    with pytest.raises(ValueError):
        mk.parse_name(name)


def test_default_isa_from_the_environment(monkeypatch):
    """CSO_ISA forces the ISA of calls that name none (an AVX2 machine's kernels on an
    AVX-512 host); one this CPU cannot run, or no ISA at all, is a ValueError naming it."""
    monkeypatch.setenv("CSO_ISA", "generic")
    assert mk.default_isa().name == "generic"
    import cso
    w = np.ones((8, 4, 3, 3), np.float32)
    assert cso.Conv2d(w).kernel_for((1, 4, 9, 9)).isa == "generic"
    monkeypatch.setenv("CSO_ISA", "avx9")
    with pytest.raises(ValueError, match="avx9"):
        mk.default_isa()
    unsupported = [name for name in mk.ISAS if mk.ISAS[name] not in mk.supported_isas()]
    for name in unsupported:
        monkeypatch.setenv("CSO_ISA", name)
        with pytest.raises(ValueError, match=f"CSO_ISA='{name}' is not supported"):
            mk.default_isa()
    monkeypatch.delenv("CSO_ISA")
    assert mk.default_isa() == mk.host_isa()


def test_isa_selection_from_features():
    assert mk.select_isa({"avx512f", "avx512vl", "fma", "avx2"}).name == "avx512"
    assert mk.select_isa({"avx2", "fma"}).name == "avx2"
    assert mk.select_isa({"avx2"}).name == "generic"   # AVX2 without FMA: no fused kernels
    assert mk.select_isa(set()).name == "generic"
    assert mk.select_isa({"neon", "fp-armv8"}).name == "neon"
    assert mk.host_isa() in mk.supported_isas()


@pytest.mark.parametrize("dtype, itemsize, suffix", [("f32", 4, "4s"), ("f64", 8, "2d")])
def test_neon_kernels_compile_for_aarch64(dtype, itemsize, suffix):
    """Each orientation's NEON tile (from the neon record's 32 registers), compiled for aarch64
    on any host: its main loop (the block with the most FMAs) is vector FMAs on v registers
    (fmla), one per accumulator and unrolled step, and spills no vector register to the
    stack."""
    import re
    nwin, nf = csa.register_blocking.microtile(NEON, itemsize)
    windows, filters = csa.register_blocking.filter_vector_tile(NEON, itemsize, 49)
    direct = csa.register_blocking.direct_windows(csa.ConvSpec(1, 64, 56, 56, 64, 3, 3), NEON)
    prefetch = NEON.tuning.output_prefetch
    specs = [mk.KernelSpec(dtype, nf, nwin, "neon", prefetch=prefetch),
             mk.KernelSpec(dtype, nf, nwin, "neon", "slab", prefetch),
             mk.KernelSpec(dtype, windows, filters, "neon"),
             mk.KernelSpec(dtype, direct, filters, "neon", "direct")]
    assert (nwin // (16 // itemsize), nf) == (2, 8)   # 16 accumulators + 2 rows + 1 broadcast
    for spec in specs:
        asm, loop = aarch64_main_loop(spec)
        assert len(re.findall(rf"\bfmla\s+v\d+\.{suffix}", loop)) == spec.broadcasts * spec.vectors * UNROLL
        assert not spills(loop), spec
        # a row of 8 values is 32 or 64 bytes: one line, one prefetch (prfm) per row
        assert prefetches(asm) == (spec.broadcasts if spec.prefetch else 0)


@pytest.mark.parametrize("dtype, itemsize", [("f32", 4), ("f64", 8)])
def test_neon_model_tiles_spill_no_register(dtype, itemsize):
    """The widest tile of one, two and three filter vectors the neon record's model lets a
    plan take (its ``spare_registers`` beyond the tile), packed and direct, compiles for
    aarch64 with no vector register spilled in its main loop; two vectors by one broadcast
    more spill (2 x 13 and 2 x 14: the model once allowed them, and 14x14 planes took them)."""
    lanes = 16 // itemsize
    for vectors in (1, 2, 3):
        widest = max(NEON.tuning.broadcast_counts(NEON.vector_registers, vectors))
        for variant in ("packed", "direct"):
            spec = mk.KernelSpec(dtype, widest, vectors * lanes, "neon", variant)
            assert not spills(aarch64_main_loop(spec)[1]), spec
    assert max(NEON.tuning.broadcast_counts(NEON.vector_registers, 2)) == 12
    assert spills(aarch64_main_loop(mk.KernelSpec(dtype, 13, 2 * lanes, "neon"))[1])


def aarch64_main_loop(spec):
    """(assembly, its main loop: the block with the most FMAs) of ``spec`` compiled for
    aarch64."""
    import re
    from microkernels.jit import cross_assembly
    from microkernels.wrappers import generator
    asm = cross_assembly(generator(spec), spec)
    blocks = re.split(r"^\.LBB\w+:", asm, flags=re.M)
    return asm, max(blocks, key=lambda b: len(re.findall(r"\bfmla\b", b)))


def spills(loop):
    """Whether aarch64 assembly ``loop`` stores or loads a vector (q) register on the stack."""
    import re
    return bool(re.search(r"\bq\d+.*\[sp", loop))


def prefetches(asm):
    """The prefetch instructions in assembly ``asm`` (x86 or aarch64)."""
    import re
    return len(re.findall(r"^\s*(?:prefetch\w*|prfm)\s", asm, flags=re.M))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.prefetch], ids=str)
def test_prefetching_kernel_asks_for_each_line_of_a_later_tile(spec):
    """A kernel with ``prefetch`` has one prefetch per cache line of each C row's later tile
    (a row of ``width`` elements: 64 bytes on AVX2 is one line); without, none."""
    from dataclasses import replace
    lines = -(-spec.width * spec.np_dtype.itemsize // 64)
    assert prefetches(mk.compile(spec).asm) == spec.broadcasts * lines
    assert prefetches(mk.compile(replace(spec, prefetch=0)).asm) == 0


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_compiled_kernel_exposes_ir_and_assembly(spec):
    kernel = mk.compile(spec)
    assert f"define void @{spec.name}" in kernel.ir
    assert "fma" in kernel.ir
    assert spec.name + ":" in kernel.asm
    if spec.isa != "generic":
        assert ("fmla" if spec.isa == "neon" else "vfmadd") in kernel.asm


@pytest.mark.parametrize("spec", [SPECS[0]] + FAMILY_SPECS[3:], ids=str)
def test_dump_command_prints_ir_and_asm(capsys, spec):
    from microkernels.dump import main
    main([spec.name])
    text = capsys.readouterr().out
    assert f"define void @{spec.name}" in text and spec.name + ":" in text
    with pytest.raises(SystemExit):
        main(["not_a_kernel"])
