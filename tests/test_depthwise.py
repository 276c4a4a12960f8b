"""The depthwise path: its micro-kernel's contract, every geometry and edge against the NumPy
reference, forced tilings and splits, ISAs, and CSA's choice of plan."""
import pickle

import numpy as np
import pytest

import csa
import cso
from microkernels import ACTIVATE, BIAS, DepthwiseSpec, compile, reference_kernel, supported_isas

from .machines import ZEN5
from .reference import assert_conv_close, conv2d_reference

F32, F64 = np.float32, np.float64
ISAS = [isa.name for isa in supported_isas()]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("vectors", [1, 3, 8])
def test_kernel_contract(rng, isa, dtype, vectors):
    """Random virtual rows (narrower and wider than a vector, any count), taps and flags: every
    real position holds its tap sum (+ bias, ReLU); nothing else of ``out`` is written."""
    spec = DepthwiseSpec(dtype, vectors, isa)
    kernel, lanes, dt = compile(spec), spec.lanes, spec.np_dtype
    for _ in range(60):
        width = int(rng.integers(1, 3 * lanes + 3))
        q = int(rng.integers(1, width + 1))
        rows = int(rng.integers(1, 9))
        positions = (rows - 1) * width + q
        taps = int(rng.integers(1, 12))
        offsets = rng.integers(0, 2 * width + 3, taps).astype(np.int64)
        # the kernel may read two vectors past the last position a tap reads
        slab = rng.standard_normal(positions + offsets.max() + 2 * lanes).astype(dt)
        weights, bias = rng.standard_normal(taps).astype(dt), rng.standard_normal(1).astype(dt)
        flags = int(rng.choice([0, BIAS, ACTIVATE, BIAS | ACTIVATE]))
        out = np.full(rows * q + 2 * lanes, 7.0, dt)
        expected = out.copy()
        kernel(slab, offsets, weights, out, positions, width, q, bias, flags)
        reference_kernel(spec)(slab, offsets, weights, expected, positions, width, q, bias, flags)
        np.testing.assert_allclose(out, expected, rtol=1e-5 if dt == F32 else 1e-12, atol=1e-5)


# (C, H, W, multiplier, R, S, stride, padding (t, b, l, r), dilation)
GEOMETRIES = {
    "3x3": (6, 9, 8, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "stride2": (5, 13, 11, 1, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    "multiplier2": (4, 10, 12, 2, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "multiplier3_s2": (3, 11, 9, 3, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1)),
    "asym_pad": (3, 7, 7, 1, 5, 3, (2, 1), (2, 0, 1, 2), (2, 1)),
    "dilated": (4, 20, 20, 1, 3, 3, (3, 3), (1, 1, 1, 1), (2, 3)),
    "wide_rows": (3, 40, 37, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "big_plane_bands": (2, 130, 120, 1, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    "one_pixel": (7, 1, 1, 1, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    "kernel_in_padding": (2, 2, 2, 2, 3, 3, (1, 1), (2, 2, 2, 2), (1, 1)),
    "row_filter": (3, 5, 30, 2, 1, 11, (1, 1), (0, 0, 5, 5), (1, 1)),
    "column_filter": (3, 30, 5, 1, 11, 1, (1, 1), (5, 5, 0, 0), (1, 1)),
    "stride_gathered": (2, 16, 60, 1, 3, 3, (5, 6), (1, 1, 2, 2), (1, 1)),
    "tiny_many": (70, 7, 7, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "one_input_channel": (1, 12, 12, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
}


def operands(rng, geometry, dtype, batch=1):
    c, h, w, m, r, s = geometry[:6]
    x = rng.standard_normal((batch, c, h, w)).astype(dtype)
    wt = rng.standard_normal((c * m, 1, r, s)).astype(dtype)
    return x, wt, rng.standard_normal(c * m).astype(dtype)


def depthwise_conv(wt, b, geometry, **kwargs):
    c, stride, (t, bo, left, right), dilation = geometry[0], *geometry[6:]
    return cso.Conv2d(wt, b, stride, ((t, bo), (left, right)), dilation, groups=c, **kwargs)


def check(out, x, wt, b, geometry, relu=False):
    stride, padding, dilation = geometry[6:]
    assert_conv_close(out, x, wt, b, stride=stride, padding=padding, dilation=dilation,
                      groups=geometry[0], relu=relu)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_geometries_match_reference(rng, name, dtype):
    geometry = GEOMETRIES[name]
    x, wt, b = operands(rng, geometry, dtype, batch=2)
    for relu in (False, True):
        conv = depthwise_conv(wt, b, geometry, activation="relu" if relu else None)
        assert isinstance(conv.plan_for(x.shape), csa.DepthwisePlan)
        check(conv(x), x, wt, b, geometry, relu)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_row_widths_around_the_vector(rng, isa, dtype):
    """Output rows of 1 .. 2 vectors + 1 and planes of 1 .. 3 rows: where a kernel vector
    holds the end of one row and the start of the next, or runs past the last position."""
    lanes = cso.Conv2d(np.zeros((1, 1, 1, 1), dtype), isa=isa).kernel_for((1, 1, 4, 4)).lanes
    for q in sorted({1, 2, lanes - 1, lanes, lanes + 1, 2 * lanes - 2, 2 * lanes + 1}):
        for p in (1, 2, 3):
            x = rng.standard_normal((1, 2, p, q)).astype(dtype)
            wt = rng.standard_normal((2, 1, 3, 3)).astype(dtype)
            conv = cso.Conv2d(wt, None, padding=1, groups=2, isa=isa)
            assert_conv_close(conv(x), x, wt, None, padding=(1, 1, 1, 1), groups=2)


@pytest.mark.parametrize("overrides", [{"band": 1}, {"band": 3, "block_vectors": 1}, {"nc": 1},
                                       {"nc": 4, "block_vectors": 2}, {"block_vectors": 5}])
def test_forced_tilings(rng, overrides):
    for name in ("stride2", "multiplier3_s2", "tiny_many", "big_plane_bands"):
        geometry = GEOMETRIES[name]
        x, wt, b = operands(rng, geometry, F32)
        conv = depthwise_conv(wt, b, geometry, plan_overrides=overrides)
        plan = conv.plan_for(x.shape)
        assert all(name in plan.forced for name in overrides)
        check(conv(x), x, wt, b, geometry)


@pytest.mark.parametrize("split", [2, 3, 7])
def test_splits_are_bit_identical(rng, split):
    """Parts of (image, channel, band) units on 1-3 threads: the same bits as one part."""
    for name in ("multiplier2", "big_plane_bands", "tiny_many"):
        geometry = GEOMETRIES[name]
        x, wt, b = operands(rng, geometry, F32, batch=2)
        one = depthwise_conv(wt, b, geometry, plan_overrides={"split": (1, 1)})(x)
        check(one, x, wt, b, geometry)
        conv = depthwise_conv(wt, b, geometry, plan_overrides={"split": (split, 1)})
        before = cso.get_num_threads()
        try:
            for threads in (1, 2, 3):
                cso.set_num_threads(threads)
                np.testing.assert_array_equal(conv(x), one)
        finally:
            cso.set_num_threads(before)


def test_out_argument_and_strided_input(rng):
    geometry = GEOMETRIES["multiplier2"]
    x, wt, b = operands(rng, geometry, F64, batch=2)
    conv = depthwise_conv(wt, b, geometry)
    out = np.empty((2, 8, 10, 12), F64)
    assert conv(x, out=out) is out
    check(out, x, wt, b, geometry)
    wide = np.zeros((2, 4, 10, 24), F64)
    wide[..., ::2] = x
    check(conv(wide[..., ::2]), x, wt, b, geometry)


def test_filters_packed_once_for_the_depthwise_plan(rng):
    x, wt, b = operands(rng, GEOMETRIES["3x3"], F32)
    conv = cso.Conv2d(wt, b, padding=1, groups=6)   # no input shape: packed for one filter a row
    check(conv(x), x, wt, b, GEOMETRIES["3x3"])
    # and, where the call runs the blocked plan on the planes, as its vectors of weights
    lanes = cso.layouts.block_size(F32, conv.isa)
    assert list(conv._packed) == [1] + ([("blocked", lanes)] if conv.plan_for(x.shape).blocked
                                        else [])
    check(conv(x), x, wt, b, GEOMETRIES["3x3"])   # (none again)
    assert len(conv._packed) == 1 + conv.plan_for(x.shape).blocked


def test_grouped_plan_on_request_matches(rng):
    geometry = GEOMETRIES["multiplier2"]
    x, wt, b = operands(rng, geometry, F32)
    conv = depthwise_conv(wt, b, geometry, plan_overrides={"depthwise": False})
    assert isinstance(conv.plan_for(x.shape), csa.SlicingPlan)
    np.testing.assert_allclose(conv(x), depthwise_conv(wt, b, geometry)(x), rtol=1e-5, atol=1e-5)


def test_plan_rules():
    small = csa.ConvSpec.parse("n1c1560h7w7k1560r3s3p1u1g1560")
    plan = csa.analyze(small, ZEN5)
    assert isinstance(plan, csa.DepthwisePlan) and plan.band == small.p and plan.nc > 1
    assert plan.nc * plan.channel_elements * 4 <= csa.depthwise.SLAB_FILL * ZEN5.l1d
    big = csa.ConvSpec.parse("n1c256h256w256k256r3s3p0_1_0_1u2g256")
    plan = csa.analyze(big, ZEN5)
    assert plan.nc == 1 and plan.bands > 1
    assert plan.channel_elements * 4 <= csa.depthwise.SLAB_FILL * ZEN5.l1d
    assert plan.units == 256 * plan.bands
    assert csa.analyze(big, ZEN5, threads=2).threads == 2
    tiny = csa.ConvSpec.parse("n1c72h7w7k72r3s3p1u1g72")   # 64 KFLOP: not worth a thread
    assert csa.analyze(tiny, ZEN5, threads=2).threads == 1
    assert "DepthwisePlan" in plan.explain() and "band(s)" in plan.explain()
    multiplier = csa.ConvSpec(1, 1, 12, 12, 8, 3, 3, padding=(1,) * 4)   # one channel, 8 filters
    assert csa.is_depthwise(multiplier) and isinstance(csa.analyze(multiplier, ZEN5),
                                                       csa.DepthwisePlan)


def test_override_errors():
    depthwise = csa.ConvSpec.parse("n1c64h56w56k64r3s3p1u1g64")
    grouped = csa.ConvSpec.parse("n1c64h56w56k64r3s3p1u1g32")
    with pytest.raises(ValueError, match=r"\['schedule'\] do not apply to a depthwise plan"):
        csa.analyze(depthwise, ZEN5, schedule="IS")
    with pytest.raises(ValueError, match="2 channels per group, a depthwise plan needs 1"):
        csa.analyze(grouped, ZEN5, depthwise=True)
    with pytest.raises(ValueError, match=r"\['block_vectors'\] do not apply to a slicing plan"):
        csa.analyze(grouped, ZEN5, block_vectors=4)
    with pytest.raises(TypeError, match="depthwise override must be True or False"):
        csa.analyze(depthwise, ZEN5, depthwise=1)
    with pytest.raises(ValueError, match="plan_overrides:.*depthwise plan"):
        cso.Conv2d(np.zeros((64, 1, 3, 3), F32), groups=64, plan_overrides={"k2": 2})


def test_reference_helper_agrees_on_depthwise(rng):
    """The test reference itself, against a direct loop on one depthwise case."""
    x = rng.standard_normal((1, 2, 5, 6))
    wt = rng.standard_normal((4, 1, 3, 2))
    ref = conv2d_reference(x, wt, None, (2, 1), (1, 0, 1, 1), (1, 2), groups=2)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 0), (1, 1)))
    for k in range(4):
        for i in range(ref.shape[2]):
            for j in range(ref.shape[3]):
                window = xp[0, k // 2, 2 * i: 2 * i + 3: 1, j: j + 3: 2]
                assert np.isclose(ref[0, k, i, j], np.sum(window * wt[k, 0]))


def shuffled(x, groups):
    """ShuffleNet's channel shuffle of ``groups`` groups, as its ONNX graph writes it."""
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("name", ["multiplier2", "stride2", "tiny_many", "big_plane_bands"])
def test_channel_shuffle_reads_the_shuffled_channels(rng, name, groups):
    """``channel_shuffle=g`` gives the convolution of the shuffled input, bit for bit, on whole
    planes filled several channels at a time (a fill stops at the end of a run of g), on
    bands, with a channel multiplier, on 1 and 2 threads."""
    geometry = GEOMETRIES[name]
    c = 2 * groups * max(1, geometry[0] // (2 * groups))   # the groups of 2 or more channels
    geometry = (c,) + geometry[1:]
    x, wt, b = operands(rng, geometry, F32, batch=2)
    # on the NCHW plan, as a shuffle runs (a plan override keeps a large filter's there)
    expected = depthwise_conv(wt, b, geometry, plan_overrides={"depthwise": True})(
        np.ascontiguousarray(shuffled(x, groups)))
    check(expected, shuffled(x, groups), wt, b, geometry)
    before = cso.get_num_threads()
    try:
        for threads, overrides in ((1, None), (2, None), (1, {"nc": 3}), (2, {"split": (3, 1)})):
            cso.set_num_threads(threads)
            conv = depthwise_conv(wt, b, geometry, channel_shuffle=groups,
                                  plan_overrides=overrides)
            np.testing.assert_array_equal(conv(x), expected)
    finally:
        cso.set_num_threads(before)


def test_channel_shuffle_errors_and_copies(rng):
    wt = rng.standard_normal((12, 1, 3, 3)).astype(F32)
    for bad, error in [(0, ValueError), (5, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="channel_shuffle"):
            cso.Conv2d(wt, groups=12, channel_shuffle=bad)
    with pytest.raises(ValueError, match="channel_shuffle=2 needs a depthwise weight"):
        cso.Conv2d(rng.standard_normal((12, 2, 3, 3)).astype(F32), groups=6, channel_shuffle=2)
    forced = cso.Conv2d(wt, groups=12, channel_shuffle=3, plan_overrides={"depthwise": False})
    with pytest.raises(ValueError, match="channel_shuffle=3 needs a depthwise plan"):
        forced(rng.standard_normal((1, 12, 5, 5)).astype(F32))
    conv = cso.Conv2d(wt, padding=1, groups=12, channel_shuffle=4)
    x = rng.standard_normal((1, 12, 6, 7)).astype(F32)
    copy = pickle.loads(pickle.dumps(conv))
    assert "channel_shuffle=4" in repr(copy)
    np.testing.assert_array_equal(copy(x), conv(x))


@pytest.mark.parametrize("isa", ISAS)
def test_large_filters_run_their_blocked_plan_on_nchw_planes(rng, isa):
    """An NCHW depthwise convolution runs the blocked plan where the ISA's record measured it
    faster, for filters of at least ``depthwise_blocked_min_taps`` taps (its planes
    transposed into blocks and back: partial blocks, stride 2, bias and activation), else
    the NCHW plan (a 1x1 on every ISA, a 3x3 on AVX2); both match the reference, and the
    NCHW plan's result (which overrides keep)."""
    least = csa.tuning.record(isa).depthwise_blocked_min_taps
    for r, stride, c in ((7, 1, 19), (7, 2, 13), (3, 1, 19), (3, 2, 21), (1, 1, 19)):
        geometry = (c, 17, 15, 1, r, r, (stride, stride), (r // 2,) * 4, (1, 1))
        x, wt, b = operands(rng, geometry, F32, batch=2)
        conv = depthwise_conv(wt, b, geometry, activation="relu", isa=isa)
        out = conv(x)
        assert conv.plan_for(x.shape).blocked == (0 < least <= r * r)
        check(out, x, wt, b, geometry, relu=True)
        nchw = depthwise_conv(wt, b, geometry, activation="relu", isa=isa,
                              plan_overrides={"depthwise": True})
        assert not nchw.plan_for(x.shape).blocked
        np.testing.assert_allclose(out, nchw(x), rtol=1e-5, atol=1e-5)


def test_channels_last_is_read_and_written_in_place(rng):
    """A depthwise convolution on channels-last arrays moves each pixel's vectors into its
    blocked slab and out of its output rows: no re-blocking of the input, no reorder of the
    output (a partial last block included)."""
    geometry = (21, 12, 11, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1))
    x, wt, b = operands(rng, geometry, F32, batch=2)
    conv = depthwise_conv(wt, b, geometry, activation="relu")
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    out = conv(nhwc, layout="nhwc")
    (route,) = conv._routes.values()
    assert not route.reblock and route.out_block == 21   # read and written as they are
    np.testing.assert_allclose(out.transpose(0, 3, 1, 2), conv(x), rtol=1e-5, atol=1e-5)
    check(np.ascontiguousarray(out.transpose(0, 3, 1, 2)), x, wt, b, geometry, relu=True)


@pytest.mark.parametrize("stride", [1, 2])
def test_channels_last_large_images_run_in_bands_of_whole_pixels(rng, stride):
    """A channels-last image larger than ``tuning.pixel_band_image`` times this host's L2
    runs the plan csa makes for channels last: on AVX2, bands whose input pixels fit L2, so
    more of them than the blocked plan's, a partial last one included; the reference's result
    on every ISA."""
    machine = cso.host_machine()
    h = w = 66
    channels = int(max(4, machine.tuning.pixel_band_image) * machine.l2 // (h * w * 4)) + 13
    geometry = (channels, h, w, 1, 3, 3, (stride, stride), (1, 1, 1, 1), (1, 1))
    x, wt, b = operands(rng, geometry, F32)
    conv = depthwise_conv(wt, b, geometry, activation="relu")
    out = conv(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), layout="nhwc")
    (route,) = conv._routes.values()
    plan, spec = route.prepared.plan, conv.spec_for(x.shape)
    threads = cso.get_num_threads()
    assert plan == csa.analyze(spec, machine, threads=threads, layout="nhwc")
    if machine.tuning.pixel_band_image:
        assert plan.band < csa.analyze(spec, machine, threads=threads, layout="blocked").band
        assert spec.p % plan.band   # a partial last band
    check(np.ascontiguousarray(out.transpose(0, 3, 1, 2)), x, wt, b, geometry, relu=True)
