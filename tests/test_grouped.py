"""Grouped convolutions (2 or more groups of more than one channel): every plan family on the
shapes real networks and edge cases give, in every layout, against the NumPy reference; the
same bits on any thread count; the plan the rules give a group of a few channels."""
import dataclasses

import numpy as np
import pytest

import csa
import cso
import microkernels as mk
import packing
from microkernels.reference import other_group_lanes
from csa import ConvSpec

from .machines import ZEN3, ZEN5
from .reference import assert_conv_close, conv2d_reference

# name: (N, C, H, W, K, R, S, stride, padding (t, b, l, r), dilation, groups)
CASES = {
    "cg2": (1, 8, 9, 11, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4),
    "cg3_odd": (2, 9, 7, 13, 15, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "cg4_resnext": (1, 32, 14, 14, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),
    "cg4_stride2": (1, 16, 15, 17, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 4),
    "cg5_multiplier2": (1, 15, 8, 9, 30, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "cg7_asymmetric": (1, 14, 10, 9, 14, 3, 3, (1, 1), (0, 1, 2, 0), (1, 1), 2),
    "cg8_regnet": (1, 48, 14, 14, 48, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6),
    "cg8_filters12": (1, 16, 9, 10, 24, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg8_dilated": (1, 24, 13, 12, 24, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 3),
    "cg8_5x5": (1, 16, 7, 7, 16, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 2),
    "cg8_stride2": (2, 24, 12, 12, 24, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 3),
    "cg12_partial_blocks": (1, 36, 9, 9, 36, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "cg16_1x1": (1, 32, 6, 7, 64, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    "cg16_filters40": (1, 48, 9, 10, 120, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "cg24": (1, 48, 11, 11, 48, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg32_large_plane": (1, 64, 40, 36, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg48_whole_tiles": (1, 96, 17, 19, 96, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg64": (1, 128, 7, 9, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg33_odd": (1, 66, 8, 8, 22, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
}
# plan families: the rules' own, direct (windows broadcast from a slab, filters in vectors),
# packed tiles with filters in vectors, packed tiles with windows in vectors
PLANS = {"rules": {}, "direct": {"vectors_along": "filters", "slab": True},
         "packed_filters": {"vectors_along": "filters", "slab": False},
         "packed_windows": {"vectors_along": "windows", "slab": False}}
ACTIVATIONS = [None, "relu", "silu"]


def operands(rng, case, dtype, bias=True):
    n, c, h, w, k, r, s, stride, pads, dilation, groups = case
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = (rng.standard_normal((k, c // groups, r, s)) / np.sqrt(c // groups * r * s)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if bias else None
    geometry = dict(stride=stride, padding=pads, dilation=dilation, groups=groups)
    return x, wt, b, geometry


def conv_of(wt, b, geometry, activation=None, **kwargs):
    t, bt, l, r = geometry["padding"]
    return cso.Conv2d(wt, b, geometry["stride"], ((t, bt), (l, r)), geometry["dilation"],
                      geometry["groups"], activation, **kwargs)


def silu(v):
    return v / (1 + np.exp(-v))


def check(out, x, wt, b, geometry, activation):
    if activation == "silu":   # the reference's pre-activation, then SiLU in float64
        expected = silu(conv2d_reference(x, wt, b, **geometry))
        tol = 2e-5 if x.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    else:
        assert_conv_close(out, x, wt, b, relu=activation == "relu", **geometry)


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("name", list(CASES))
def test_every_plan_family_matches_the_reference(rng, name, plan):
    x, wt, b, geometry = operands(rng, CASES[name], np.float32)
    try:
        conv = conv_of(wt, b, geometry, "relu", plan_overrides=PLANS[plan])
        out = conv(x)
    except ValueError as err:   # a family this shape cannot take says so, naming it
        assert plan != "rules" and "slab override" in str(err), err
        return
    check(out, x, wt, b, geometry, "relu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["cg4_resnext", "cg8_regnet", "cg8_filters12", "cg33_odd"])
def test_bias_activation_and_dtypes(rng, name, dtype, activation):
    for bias in (True, False):
        x, wt, b, geometry = operands(rng, CASES[name], dtype, bias)
        check(conv_of(wt, b, geometry, activation)(x), x, wt, b, geometry, activation)


@pytest.mark.parametrize("name", list(CASES))
def test_every_layout_matches_the_reference(rng, name):
    """NCHW, channel-blocked and channels-last inputs and outputs, in every pairing."""
    x, wt, b, geometry = operands(rng, CASES[name], np.float32)
    conv = conv_of(wt, b, geometry, "relu")
    expected = conv(x)
    check(expected, x, wt, b, geometry, "relu")
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    inputs = {"nchw": (x, {}), "blocked": (cso.Blocked.from_nchw(x), {}),
              "nhwc": (nhwc, {"layout": "nhwc"})}
    for in_layout, (value, kwargs) in inputs.items():
        for out_layout in ("nchw", "blocked", "nhwc"):
            y = conv(value, out_layout=out_layout, **kwargs)
            y = (y.to_nchw() if out_layout == "blocked" else
                 y.transpose(0, 3, 1, 2) if out_layout == "nhwc" else y)
            # the blocked plan sums in its own order: within rounding of the NCHW plan's
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{in_layout} -> {out_layout}")


@pytest.mark.parametrize("name", ["cg4_resnext", "cg8_regnet", "cg8_filters12", "cg24",
                                  "cg32_large_plane", "cg48_whole_tiles", "cg8_stride2"])
def test_the_same_bits_on_any_thread_count(rng, name):
    x, wt, b, geometry = operands(rng, CASES[name], np.float32)
    before = cso.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2, 3):
            cso.set_num_threads(threads)
            conv = conv_of(wt, b, geometry, "relu")
            outputs.append((conv(x), conv(cso.Blocked.from_nchw(x)).to_nchw()))
    finally:
        cso.set_num_threads(before)
    for nchw, blocked in outputs[1:]:
        np.testing.assert_array_equal(nchw, outputs[0][0])
        np.testing.assert_array_equal(blocked, outputs[0][1])


@pytest.mark.parametrize("family", ["direct", "packed_filters"])
@pytest.mark.parametrize("name", ["cg16_filters40", "cg32_large_plane", "cg64", "cg8_stride2"])
def test_filter_parts_of_grouped_filters_in_vectors_plans(rng, restore_threads, family, name):
    """Filter parts over the groups' filter tiles in order, each transposing its own filters
    out of the band: the reference's values, the same bits as one thread's, for parts of
    whole groups (as many parts as groups or fewer), parts that end inside a group and parts
    that cross from one group into the next (more parts than groups; 40 filters a group on
    tiles of a vector)."""
    x, wt, b, geometry = operands(rng, CASES[name], np.float32)
    lanes = cso.layouts.block_size(np.dtype(np.float32))
    family = {**PLANS[family], "microtile_shape": (4, lanes)}
    cso.set_num_threads(1)
    whole = conv_of(wt, b, geometry, "silu", plan_overrides=family)(x)
    check(whole, x, wt, b, geometry, "silu")
    groups = geometry["groups"]
    tiles = groups * -(-wt.shape[0] // groups // lanes)
    for parts in (2, 3, 5):
        cso.set_num_threads(parts)
        conv = conv_of(wt, b, geometry, "silu", plan_overrides={**family, "split": (1, parts)})
        plan = conv.plan_for(x.shape)
        assert plan.vectors_along == "filters" and plan.split == (1, min(parts, tiles))
        np.testing.assert_array_equal(conv(x), whole)
        added = np.ones_like(whole)
        conv_of(wt, b, geometry, plan_overrides={**family, "split": (1, parts)},
                accumulate=True)(x, out=added)
        np.testing.assert_allclose(added, 1 + conv2d_reference(x, wt, b, **geometry),
                                   rtol=2e-5, atol=2e-5)


def test_grouped_plans_split_over_whole_groups():
    """A grouped plan gives its threads whole groups where there are enough: a one-pixel
    grouped 1x1 (ResNeSt's attention) has one window to share (2.7x at 2 threads on 640 ->
    2560 in 2 groups, Xeon), and 6 groups at 14 x 14 go 3 a thread, on NCHW activations and
    on blocks (whose NCHW output's rows two window parts would share cache lines of), and on
    blocks 9 groups go 5 and 4 (``GROUPED_WINDOW_SPLIT_COST``)."""
    machine = ZEN5
    pixel = csa.analyze(ConvSpec.parse("n1c640h1w1k2560r1s1p0u1g2"), machine, threads=2)
    assert pixel.vectors_along == "filters" and pixel.split == (1, 2)
    plane = ConvSpec.parse("n1c768h14w14k768r3s3p1u1g6")
    nchw = csa.analyze(plane, machine, threads=2)
    tiles = nchw.filter_tiles
    assert nchw.vectors_along == "filters" and nchw.split == (1, 2)
    assert [csa.thread_split.filter_part(6, tiles, 2, j) for j in (0, 1)] == [
        (0, 3 * tiles), (3 * tiles, 6 * tiles)]
    assert csa.analyze(plane, machine, threads=2, layout="blocked").split == (1, 2)
    # on blocks, groups that split unevenly too (9: 5 and 4), which window parts would halve:
    # a window part fills its rows' halo again and shares the NCHW rows' lines at its ends
    odd = ConvSpec.parse("n1c432h14w14k432r3s3p1u1g9")
    assert csa.analyze(odd, machine, threads=2, layout="blocked").split == (1, 2)
    no_cost = csa.thread_split.thread_split(odd, odd.p, 1, 2, machine)
    assert no_cost == (2, 1)   # counted at its FMAs alone: 7 rows of 14 against 5 groups of 9
    # more parts than groups: runs of the tiles, in group order
    assert [csa.thread_split.filter_part(2, 3, 4, j) for j in range(4)] == [
        (0, 1), (1, 3), (3, 4), (4, 6)]


@pytest.mark.parametrize("groups, units, threads", [(9, 14, 2), (9, 14, 4), (3, 14, 4),
                                                     (8, 14, 3), (23, 7, 2), (5, 3, 4)])
def test_group_runs_cover_every_group_window_once(groups, units, threads):
    """Each thread's run of the groups' windows in group order: every (group, window unit) in
    exactly one rectangle, as many rectangles a thread (the pool's lanes are near-equal runs
    of the parts), each thread's units within one of an equal share."""
    runs = csa.thread_split.group_runs(groups, units, threads)
    assert len(runs) == threads and len({len(run) for run in runs}) == 1
    seen = np.zeros((groups, units), int)
    for run in runs:
        for u0, u1, g0, g1 in run:
            assert 0 <= u0 < u1 <= units and 0 <= g0 < g1 <= groups
            seen[g0:g1, u0:u1] += 1
        work = sum((u1 - u0) * (g1 - g0) for u0, u1, g0, g1 in run)
        assert abs(work - groups * units / threads) < 1
    np.testing.assert_array_equal(seen, 1)


def test_odd_groups_take_runs_of_the_groups():
    """9 groups on 2 threads: runs of 4.5 groups (4 whole and half of one's rows each), where
    whole groups would go 5 and 4 and window parts each fill the filter's halo rows again,
    on blocks and on NCHW; 8 groups split evenly, and one thread takes them all."""
    odd = ConvSpec.parse("n1c432h14w14k432r3s3p1u1g9")
    plan = csa.analyze(odd, ZEN5, threads=2, layout="blocked")
    assert plan.group_runs and plan.split == (1, 2)
    from cso.lowering import output_parts
    rows, tiles = plan.row_tiles, plan.filter_tiles
    np.testing.assert_array_equal(output_parts(plan), [
        (0, 14 * rows, 0, 4 * tiles), (0, 7 * rows, 4 * tiles, 5 * tiles),
        (7 * rows, 14 * rows, 4 * tiles, 5 * tiles), (0, 14 * rows, 5 * tiles, 9 * tiles)])
    assert "in group order" in plan.explain()
    for machine in (ZEN5, ZEN3):
        assert csa.analyze(odd, machine, threads=2).group_runs
    even = ConvSpec.parse("n1c384h14w14k384r3s3p1u1g8")
    assert not csa.analyze(even, ZEN5, threads=2, layout="blocked").group_runs
    assert not csa.analyze(even, ZEN5, threads=2).group_runs
    assert not csa.analyze(odd, ZEN5, threads=1, layout="blocked").group_runs


@pytest.mark.parametrize("family", ["blocked"] + list(PLANS))
def test_group_runs_match_the_reference_on_any_thread_count(rng, restore_threads, family):
    """Odd groups at 1-4 threads, whose runs cut groups' rows (on 4 threads a thread's
    rectangles too, to as many as the others'; 3 threads take 3 groups each), on blocks
    (blocked calls) and in every NCHW plan family: the reference's values, the same bits on
    every thread count."""
    case = (1, 144, 11, 13, 144, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 9)   # 16 channels a group
    x, wt, b, geometry = operands(rng, case, np.float32)
    value = cso.Blocked.from_nchw(x) if family == "blocked" else x
    overrides = PLANS.get(family)
    outputs = []
    for threads in (1, 2, 3, 4):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, "relu", plan_overrides=overrides or None)
        assert conv.plan_for(x.shape).group_runs == (threads in (2, 4)), threads
        out = conv(value)
        outputs.append(out.to_nchw() if family == "blocked" else out)
    check(outputs[0], x, wt, b, geometry, "relu")
    for out in outputs[1:]:
        np.testing.assert_array_equal(out, outputs[0])


def test_a_few_channels_per_group_run_direct_where_measured():
    """The AVX2 record (measured on Zen 3) plans stride-1 groups of 8 or more channels on
    planes of up to 32 x 32 direct, with filter tiles of the lanes a group's filters use; not
    groups of 4, stride 2, larger planes. The AVX-512 record (measured on a Xeon) does up to
    15 x 15, where a packed window tile of 32 straddles three rows or more, and any plane
    where a group's filters fill whole tiles of two vectors or more."""
    avx2, avx512 = ZEN3, ZEN5
    regnet = ConvSpec.parse("n1c512h14w14k1024r3s3p1u1g64")   # 8 channels, 16 filters a group
    plan = csa.analyze(regnet, avx2)
    assert (plan.vectors_along, plan.slab, plan.nf, plan.nc) == ("filters", True, 16, 8)
    assert csa.analyze(ConvSpec.parse("n1c48h14w14k48r3s3p1u1g6"), avx2).nf == 8
    for other in ("n1c416h14w14k416r3s3p1u1g104",   # 4 channels a group
                  "n1c360h12w12k360r3s3p1u2g45",    # stride 2
                  "n1c88h72w72k88r3s3p1u1g11"):     # a 72 x 72 plane
        assert not csa.variants.grouped_direct(ConvSpec.parse(other), avx2), other
    plan = csa.analyze(regnet, avx512)
    assert (plan.vectors_along, plan.slab, plan.nwin, plan.nf) == ("filters", True, 14, 16)
    assert csa.variants.grouped_direct(ConvSpec.parse("n1c1360h7w7k1360r3s3p1u1g34"), avx512)
    assert not csa.variants.grouped_direct(ConvSpec.parse("n1c240h16w16k240r3s3p1u1g10"), avx512)
    whole = csa.analyze(ConvSpec.parse("n1c96h56w56k96r3s3p1u1g2"), avx512)   # 48 filters
    assert (whole.vectors_along, whole.slab, whole.nf) == ("filters", True, 48)
    for other in ("n1c80h56w56k80r3s3p1u1g2",      # 40 filters: a sixth of the lanes idle
                  "n1c144h56w56k144r3s3p1u1g9"):   # 16 filters: whole tiles of one vector
        assert not csa.variants.grouped_direct(ConvSpec.parse(other), avx512), other
    assert not csa.variants.grouped_direct(ConvSpec.parse("n1c96h56w56k96r3s3p1u1g2"), avx2)


def test_small_planes_of_whole_blocks_a_group_run_on_blocks_where_measured():
    """An NCHW call runs the blocked plan (reading the planes, writing them from each band)
    for groups of as many filters as channels, 1 to the record's
    ``grouped_blocked_max_blocks`` blocks of them (3), a filter larger than 1x1 and an output
    plane of at most its ``grouped_blocked_max_plane`` pixels (256 in the AVX-512 record and
    196 in the AVX2 one, measured on a Xeon; 0, never, where not measured) or, groups not
    merged, an input plane of at most its ``grouped_blocked_max_input`` (1024 on AVX-512)."""
    conv = cso.Conv2d(np.ones((4, 2, 3, 3), np.float32), groups=2)   # (its dtype and ISA)
    lanes = cso.layouts.block_size(np.dtype(np.float32), conv.isa)
    machine = cso.host_machine()
    measured = machine.with_(tuning=dataclasses.replace(
        machine.tuning, grouped_blocked_max_plane=196, grouped_blocked_max_blocks=3,
        grouped_blocked_max_input=0))

    def on_blocks(name, machine=measured, conv=conv, merged=False):
        spec = ConvSpec.parse(name.format(c=20 * lanes, g=20, k=20 * lanes))
        return conv._grouped_on_blocks(csa.analyze(spec, machine), merged)
    assert on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}")
    assert on_blocks("n1c{c}h28w28k{k}r3s3p1u2g{g}")        # 14 x 14 out
    assert on_blocks("n1c{c}h7w7k{k}r5s5p2u1g{g}")
    assert not on_blocks("n1c{c}h16w16k{k}r3s3p1u1g{g}")    # 256 pixels
    # larger planes by their input, where the record measured it, for groups of their own
    inputs = measured.with_(tuning=dataclasses.replace(measured.tuning,
                                                       grouped_blocked_max_input=1024))
    assert on_blocks("n1c{c}h32w32k{k}r3s3p1u1g{g}", inputs)
    assert on_blocks("n1c{c}h28w28k{k}r3s3p1u1g{g}", inputs)
    assert not on_blocks("n1c{c}h28w28k{k}r3s3p1u1g{g}", inputs, merged=True)
    assert on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}", inputs, merged=True)
    assert not on_blocks("n1c{c}h34w34k{k}r3s3p1u1g{g}", inputs)
    assert not on_blocks("n1c{c}h56w56k{k}r3s3p1u2g{g}", inputs)   # 28 x 28 out of 56 x 56
    assert not on_blocks("n1c{c}h14w14k{k}r1s1p0u1g{g}")    # 1x1
    assert on_blocks("n1c{c}h14w14k{k}r3s3p1u1g10")         # two blocks a group
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g5")      # four
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u2g8")      # two and a half
    assert not on_blocks(f"n1c{20 * lanes}h14w14k{40 * lanes}r3s3p1u1g10")   # 2x filters
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g1")
    for field in ("grouped_blocked_max_plane", "grouped_blocked_max_blocks"):
        assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}", machine.with_(
            tuning=dataclasses.replace(measured.tuning, **{field: 0})))
    forced = cso.Conv2d(np.ones((4, 2, 3, 3), np.float32), groups=2,
                        plan_overrides={"vectors_along": "windows"})
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}", conv=forced)
    for record, plane, pixels in ((csa.tuning.AVX512, 256, 1024), (csa.tuning.AVX2, 196, 0)):
        assert (record.grouped_blocked_max_plane, record.grouped_blocked_max_blocks,
                record.grouped_blocked_max_input) == (plane, 3, pixels)
    assert csa.tuning.NEON.grouped_blocked_max_plane == csa.tuning.NEON.grouped_blocked_max_input == 0


@pytest.mark.parametrize("case", [
    # (N, groups, blocks a group, H, W, R, stride, padding (t, b, l, r), dilation)
    (1, 3, 1, 14, 14, 3, 1, (1, 1, 1, 1), 1),
    (2, 2, 1, 13, 11, 3, 2, (1, 0, 2, 1), 1),
    (1, 2, 1, 7, 7, 5, 1, (2, 2, 2, 2), 1),
    (1, 3, 1, 12, 12, 3, 1, (2, 2, 2, 2), 2),
    (1, 2, 2, 9, 17, 3, 1, (1, 1, 1, 1), 1),
    (2, 3, 3, 15, 10, 3, 2, (0, 1, 1, 0), 1),
])
def test_an_nchw_call_on_blocks_matches_the_reference(rng, monkeypatch, case):
    """The route through blocks (the NCHW planes transposed into the slab's blocks), forced
    on whatever the host's record says: groups of 1 to 3 blocks, bias and activation,
    stride, asymmetric padding, dilation, batches, rows longer and shorter than the lanes;
    ``out=`` contiguous or strided, accumulation; the second call (its plain path) as the
    first; the same bits on 1 and 2 threads."""
    n, groups, blocks, h, w, r, stride, pads, dilation = case
    conv0 = cso.Conv2d(np.ones((1, 1, 1, 1), np.float32))
    lanes = cso.layouts.block_size(np.dtype(np.float32), conv0.isa)
    monkeypatch.setattr(cso.Conv2d, "_grouped_on_blocks", lambda self, plan: (
        plan.spec.groups > 1 and plan.spec.c_per_group == plan.spec.k_per_group
        and plan.spec.c_per_group % lanes == 0 and self.channel_shuffle == 1
        and not self.overrides))
    c_g = blocks * lanes
    c = groups * c_g
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((c, c_g, r, r)) / np.sqrt(c_g * r * r)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    geometry = dict(stride=(stride, stride), padding=pads, dilation=(dilation, dilation),
                    groups=groups)
    before = cso.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2):
            cso.set_num_threads(threads)
            conv = conv_of(wt, b, geometry, "silu")
            first, second = conv(x), conv(x)
            check(first, x, wt, b, geometry, "silu")
            np.testing.assert_array_equal(second, first)
            outputs.append(first)
        np.testing.assert_array_equal(outputs[1], outputs[0])
        conv = conv_of(wt, b, geometry)
        expected = conv2d_reference(x, wt, b, **geometry)
        out = np.full((2,) + expected.shape, np.nan, np.float32)[0]   # contiguous
        assert conv(x, out=out) is out
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        strided = np.full(expected.shape[:3] + (2 * expected.shape[3],), np.nan,
                          np.float32)[..., ::2]
        assert conv(x, out=strided) is strided
        np.testing.assert_allclose(strided, expected, rtol=1e-5, atol=1e-5)
        adding = conv_of(wt, None, geometry, accumulate=True)
        total = np.ones(expected.shape, np.float32)
        adding(x, out=total)
        np.testing.assert_allclose(total, 1 + conv2d_reference(x, wt, None, **geometry),
                                   rtol=1e-5, atol=1e-5)
    finally:
        cso.set_num_threads(before)


def test_groups_of_part_of_a_block_merge_into_whole_blocks():
    """``csa.layout.merged_groups``: the fewest consecutive groups whose channels and
    filters fill whole blocks, at most MERGED_GROUPS_MAX, the groups coming in whole merges
    or, as many filters as channels a group, the last merge padded with zero groups."""
    def merged(name, lanes=16):
        return csa.layout.merged_groups(ConvSpec.parse(name), lanes)
    assert merged("n1c368h7w7k368r3s3p1u1g46") == 2            # 8 channels a group
    assert merged("n1c416h14w14k416r3s3p1u1g104") == 4         # 4
    assert merged("n1c512h14w14k1024r3s3p1u1g64") == 2         # 8 in, 16 out
    assert merged("n1c256h28w28k512r3s3p1u1g64") == 4          # 4 in, 8 out
    assert merged("n1c1024h14w14k512r3s3p1u1g64") == 2         # 16 in, 8 out
    assert merged("n1c416h14w14k416r3s3p1u1g104", lanes=8) == 2
    assert merged("n1c96h14w14k96r3s3p1u1g12", lanes=8) == 1   # whole blocks: no merge
    assert merged("n1c360h7w7k360r3s3p1u1g45") == 2            # the last pair padded
    assert merged("n1c360h7w7k720r3s3p1u1g45") == 1            # 16 filters: not padded
    assert merged("n1c512h16w16k512r3s3p1u1g256") == 1         # 2 a group: 8 a block
    assert merged("n1c368h7w7k368r1s1p0u1g46") == 1            # a 1x1
    assert merged("n1c480h14w14k480r3s3p1u1g20") == 1          # 24 a group: not in a block
    assert merged("n1c256h14w14k512r3s3p1u1g256") == 1         # 1 in, 2 out
    assert merged("n1c64h14w14k64r3s3p1u1g64") == 1            # depthwise
    assert merged("n1c64h14w14k64r3s3p1u1g1") == 1


@pytest.mark.parametrize("m", [2, 4])
def test_merged_filters_are_the_same_convolution(rng, m):
    """``packing.merge_groups``: G groups' filters as G/m groups', ``packing.other_group``
    (a NaN of the sign bit) off each filter's own group's channels; read as zeros, the
    convolution (float64) and the order of its outputs unchanged; a group's own NaN made
    positive, so that the merged kernels do not take it for another group's lane."""
    x = rng.standard_normal((1, 24, 5, 6))
    w = rng.standard_normal((36, 2, 3, 3))   # 12 groups: 2 channels, 3 filters a group
    w[4, 1, 2, 0] = -np.nan
    merged = packing.merge_groups(w, 12, m)
    assert merged.shape == (36, 2 * m, 3, 3)
    other = other_group_lanes(merged)
    assert other.sum() == (m - 1) * w.size
    assert np.all(merged[other].view(np.uint64) == np.uint64(2 ** 64 - 1))
    own = np.where(other, 0, merged)
    assert np.isnan(own).sum() == 1 and not other_group_lanes(own).any()
    w[4, 1, 2, 0] = 0.5
    own[np.isnan(own)] = 0.5
    np.testing.assert_allclose(conv2d_reference(x, own, padding=(1, 1, 1, 1), groups=12 // m),
                               conv2d_reference(x, w, padding=(1, 1, 1, 1), groups=12),
                               rtol=1e-12, atol=1e-12)


def lifted_plans(monkeypatch, **fields):
    """The host's machine (``cso.layouts``' rules, ``cso.host.plan``'s plans) with ``fields``
    in its record: rules the host's record leaves off (0), forced on, the rest as it is."""
    def machine(isa_name=None):
        found = cso.host_machine(isa_name)
        return found.with_(tuning=dataclasses.replace(found.tuning, **fields))

    def plan(spec, isa_name, overrides, threads, layout="nchw"):
        return csa.analyze(spec, machine(isa_name), threads=threads, layout=layout,
                           **dict(overrides))
    monkeypatch.setattr(cso.host, "plan", plan)
    monkeypatch.setattr(cso.layouts, "host_machine", machine)


def as_nchw(y, layout):
    """A call's output in ``layout`` as an NCHW array."""
    return (y.to_nchw() if layout == "blocked" else
            y.transpose(0, 3, 1, 2) if layout == "nhwc" else y)


def outputs_in_every_layout(conv, inputs, expected):
    """{(input name, out_layout): the output as NCHW} of ``conv`` on each of ``inputs``
    ({name: (value, kwargs: its layout)}) for each output layout: the second (plain) call the
    same bits as the first, both matching ``expected``."""
    got = {}
    for name, (value, kwargs) in inputs.items():
        for out_layout in ("nchw", "blocked", "nhwc"):
            first = conv(value, out_layout=out_layout, **kwargs)
            second = conv(value, out_layout=out_layout, **kwargs)
            got[name, out_layout] = as_nchw(first, out_layout)
            np.testing.assert_array_equal(as_nchw(second, out_layout), got[name, out_layout])
            np.testing.assert_allclose(got[name, out_layout], expected, rtol=2e-5, atol=2e-5,
                                       err_msg=f"{name} -> {out_layout}")
    return got


@pytest.mark.parametrize("case", [
    # (N, C/groups as a fraction of the lanes, groups, H, W, R, stride, padding, dilation, K/C)
    (1, 2, 6, 7, 7, 3, 1, (1, 1, 1, 1), 1, 1),
    (2, 4, 8, 13, 11, 3, 2, (1, 0, 2, 1), 1, 1),
    (1, 2, 4, 9, 9, 5, 1, (2, 2, 2, 2), 1, 2),
    (1, 4, 4, 12, 12, 3, 1, (2, 2, 2, 2), 2, 1),
])
def test_groups_merged_onto_blocks_match_the_reference(rng, monkeypatch, restore_threads,
                                                    case):
    """Groups of half or a quarter of a block, merged onto whole blocks (forced on whatever
    the host's record says), in every pairing of layouts: bias and SiLU, stride, asymmetric
    padding, dilation, batches, more filters than channels a group; ``out=`` and
    accumulation; the second (plain) call as the first; the same bits on 1 and 2 threads."""
    n, fraction, groups, h, w, r, stride, pads, dilation, k_scale = case
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1)
    lanes = cso.layouts.block_size(np.dtype(np.float32))
    c_g = max(lanes // fraction, 2)
    c, k = groups * c_g, groups * c_g * k_scale
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c_g, r, r)) / np.sqrt(c_g * r * r)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    geometry = dict(stride=(stride, stride), padding=pads, dilation=(dilation, dilation),
                    groups=groups)
    expected = silu(conv2d_reference(x, wt, b, **geometry))
    values = {"nchw": (x, {}), "blocked": (cso.Blocked.from_nchw(x), {}),
              "nhwc": (np.ascontiguousarray(x.transpose(0, 2, 3, 1)), {"layout": "nhwc"})}

    outputs = []
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, "silu")
        got = outputs_in_every_layout(conv, values, expected)
        assert conv._merged_twin is not None
        # an NCHW call runs merged for groups of as many filters as channels, merged into
        # several groups of a block
        spec = conv.plan_for(x.shape).spec
        nchw_merged = k_scale == 1 and groups * c_g > lanes
        assert spec.groups == (groups * c_g // lanes if nchw_merged else groups)
        outputs.append(got)
    assert all(np.array_equal(outputs[1][key], outputs[0][key]) for key in outputs[0])
    conv = conv_of(wt, None, geometry, accumulate=True)
    plain = conv2d_reference(x, wt, None, **geometry)
    residual = rng.standard_normal(plain.shape).astype(np.float32)
    out = cso.Blocked.from_nchw(residual)
    assert conv(values["blocked"][0], out=out) is out
    np.testing.assert_allclose(out.to_nchw(), residual + plain, rtol=2e-5, atol=2e-5)
    total = residual.copy()
    assert conv(x, out=total) is total
    np.testing.assert_allclose(total, residual + plain, rtol=2e-5, atol=2e-5)
    bound = conv_of(wt, b, geometry, "silu").bound_blocked(x.shape, 1)
    data = np.full(bound.out_shape, np.nan, np.float32)
    bound(x, data)
    np.testing.assert_allclose(cso.Blocked(data, k).to_nchw(), expected, rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize("isa", [isa.name for isa in mk.supported_isas()
                                 if isa.name in ("avx512", "avx2")] or [None])
@pytest.mark.parametrize("case", [
    # (dtype, C/groups as a fraction of the lanes, groups, K/C, padding)
    (np.float32, 2, 4, 1, (1, 1, 1, 1)),
    (np.float32, 4, 8, 2, (0, 2, 1, 0)),
    (np.float64, 2, 4, 1, (1, 0, 1, 2)),
    (np.float32, 2, 3, 1, (1, 1, 1, 1)),   # the last merge padded with a zero group
])
def test_merged_groups_keep_nan_and_infinity_in_their_own_group(rng, monkeypatch,
                                                                restore_threads, isa, case):
    """Groups merged onto blocks, a NaN, +inf and -inf in three groups' input channels (of
    the first merge): only their own groups' outputs are NaN or infinite, as in PyTorch
    (each group its own convolution); a group's own NaN filter too. Every layout in and
    out, 1 and 2 threads bit-identical, the kernels of each ISA."""
    dtype, fraction, groups, k_scale, pads = case
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1, padded_merge_max_plane=10 ** 6)
    lanes = cso.layouts.block_size(np.dtype(dtype), isa)
    c_g = max(lanes // fraction, 2)
    c, k = groups * c_g, groups * c_g * k_scale
    x = rng.standard_normal((2, c, 9, 10)).astype(dtype)
    x[0, 1, 4, 5] = np.nan                          # group 0
    x[0, c_g + 1, 2, 3] = np.inf                    # group 1
    x[1, 2 * c_g, 6, 6] = -np.inf                   # group 2
    wt = rng.standard_normal((k, c_g, 3, 3)).astype(dtype)
    wt[-1, 0, 1, 1] = np.nan                        # the last group's last filter
    b = rng.standard_normal(k).astype(dtype)
    geometry = dict(stride=(1, 1), padding=pads, dilation=(1, 1), groups=groups)
    expected = conv2d_reference(x, wt, b, **geometry)
    assert np.isnan(expected).any() and np.isinf(expected).any() and \
        np.isfinite(expected).mean() > 0.5
    values = {"nchw": (x, {}), "blocked": (cso.Blocked.from_nchw(x, lanes), {}),
              "nhwc": (np.ascontiguousarray(x.transpose(0, 2, 3, 1)), {"layout": "nhwc"})}
    outputs = []
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, isa=isa)
        got = {}
        for name, (value, kwargs) in values.items():
            for out_layout in ("nchw", "blocked", "nhwc"):
                y = as_nchw(conv(value, out_layout=out_layout, **kwargs), out_layout)
                where = f"{name} -> {out_layout}, {threads} threads"
                np.testing.assert_array_equal(np.isnan(y), np.isnan(expected), err_msg=where)
                np.testing.assert_array_equal(np.isposinf(y), np.isposinf(expected),
                                              err_msg=where)
                np.testing.assert_array_equal(np.isneginf(y), np.isneginf(expected),
                                              err_msg=where)
                finite = np.isfinite(expected)
                tol = 2e-4 if dtype == np.float32 else 1e-12
                np.testing.assert_allclose(y[finite], expected[finite], rtol=tol, atol=tol,
                                           err_msg=where)
                got[name, out_layout] = y
        # (float64 on NEON's 2 lanes: groups of 2 channels are whole blocks, not merged)
        assert (conv._merged_twin is not None) == (c_g < lanes)
        outputs.append(got)
    for key, y in outputs[0].items():
        np.testing.assert_array_equal(outputs[1][key], y)


@pytest.mark.parametrize("groups", [2, 4])
def test_one_pixel_calls_of_merged_groups_run_the_merged_kernels(rng, monkeypatch, groups):
    """One-pixel calls (a squeeze and excitation's shape) of groups of a quarter of a block,
    merged (with two zero groups where there are 2): never the NCHW plan's shortcut, whose
    kernels do not mask the merged filters' markers; a NaN stays in its own group."""
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1, padded_merge_max_plane=10 ** 6)
    lanes = cso.layouts.block_size(np.dtype(np.float32))
    c_g = max(lanes // 4, 2)
    c = groups * c_g
    x = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    x[0, 0] = np.nan
    wt = rng.standard_normal((c, c_g, 2, 1)).astype(np.float32)
    geometry = dict(stride=(1, 2), padding=(0, 1, 0, 0), dilation=(1, 1), groups=groups)
    expected = conv2d_reference(x, wt, None, **geometry)
    assert expected.shape == (1, c, 1, 1) and np.isnan(expected[0, :c_g]).all()
    conv = conv_of(wt, None, geometry)
    for value, kwargs in ((cso.Blocked.from_nchw(x), {}),
                          (np.ascontiguousarray(x.transpose(0, 2, 3, 1)), {"layout": "nhwc"})):
        for out_layout in ("blocked", "nhwc", "nchw"):
            for _ in range(2):   # (the second a plain call)
                y = as_nchw(conv(value, out_layout=out_layout, **kwargs), out_layout)
                np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
                np.testing.assert_allclose(y[0, c_g:], expected[0, c_g:], rtol=2e-5,
                                           atol=2e-5)
    assert conv._merged_twin is not None


def test_groups_merge_onto_blocks_where_measured(monkeypatch):
    """Blocked and channels-last calls run the merged groups' plan on planes of at most the
    record's ``merged_groups_max_plane`` outputs (1024 in the AVX-512 and AVX2 records, 0,
    never, in others); an NCHW call where that plan's groups are one block each on a plane
    of at most ``grouped_blocked_max_plane``."""
    lanes = cso.layouts.block_size(np.dtype(np.float32))

    def merges(c_g, h, layout, **fields):
        lifted_plans(monkeypatch, **fields)
        groups = 2 * (lanes // c_g)
        conv = cso.Conv2d(np.ones((groups * c_g, c_g, 3, 3), np.float32), padding=1,
                          groups=groups)
        x = np.ones((1, groups * c_g, h, h), np.float32)
        if layout == "nchw":   # (the plan that runs it)
            return conv.plan_for(x.shape).spec.groups != groups
        conv(cso.Blocked.from_nchw(x))
        return conv._merged_twin is not None
    on = dict(merged_groups_max_plane=1024, grouped_blocked_max_plane=196,
              grouped_blocked_max_blocks=1)
    assert merges(lanes // 2, 32, "blocked", **on)
    assert not merges(lanes // 2, 33, "blocked", **on)           # 1089 outputs
    assert not merges(lanes // 2, 8, "blocked", merged_groups_max_plane=0)
    few = max(lanes // 4, 2)
    assert merges(few, 14, "nchw", **on)
    assert not merges(few, 15, "nchw", **on)                    # 225 outputs
    assert merges(lanes // 2, 14, "nchw", **on)
    assert not merges(lanes // 2, 14, "nchw", merged_groups_max_plane=1024,
                      grouped_blocked_max_plane=0)
    assert csa.tuning.AVX512.merged_groups_max_plane == 1024
    assert csa.tuning.AVX2.merged_groups_max_plane == 1024
    assert csa.tuning.NEON.merged_groups_max_plane == 0


def test_groups_merge_only_where_fmas_take_masks(monkeypatch):
    """A host whose FMAs take no lane mask at no cost (``microkernels.isa.masked_fma``: no
    AVX-512), whose merged kernels blend each FMA's result, merges groups on planes up to
    the record's ``blended_merge_max_plane`` alone (49 outputs with the AVX2 kernels, none
    with the AVX-512 ones, which such a host does not run); one that has them keeps the
    record's ``merged_groups_max_plane``."""
    limits = {(False, "avx512"): 0, (False, "avx2"): 49, (True, "avx512"): 1024,
              (True, "avx2"): 1024}
    try:
        for masked in (False, True):
            monkeypatch.setattr(cso.calibration, "masked_fma", lambda: masked)
            cso.host.host_machine.cache_clear()
            for isa in (i.name for i in mk.supported_isas() if i.name in ("avx512", "avx2")):
                limit = limits[masked, isa]
                assert cso.calibration.model_machine(isa).tuning.merged_groups_max_plane == limit
                m = 4 if isa == "avx512" else 2   # (4 channels a group)
                for size in (7, 8, 14):
                    spec = ConvSpec.parse(f"n1c64h{size}w{size}k64r3s3p1u1g16")
                    assert cso.layouts.merged_on_blocks(spec, isa) == (
                        m if size * size <= limit else 1)
    finally:   # (the host's machine as it is, for the tests after)
        monkeypatch.undo()
        cso.host.host_machine.cache_clear()
    assert mk.isa.masked_fma() == ({"avx512f", "avx512vl"} <= mk.isa.host_features())


def odd_groups_case(rng, groups, c_g, size, padding):
    """(input of 2 images of ``size``, weights, bias, geometry, the reference output with
    SiLU) of a 3x3 convolution of ``groups`` groups of ``c_g`` channels and filters."""
    c = groups * c_g
    x = rng.standard_normal((2, c) + size).astype(np.float32)
    wt = (rng.standard_normal((c, c_g, 3, 3)) / np.sqrt(c_g * 9)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    geometry = dict(stride=(1, 1), padding=padding, dilation=(1, 1), groups=groups)
    return x, wt, b, geometry, silu(conv2d_reference(x, wt, b, **geometry))


@pytest.mark.parametrize("groups", [3, 5])
def test_odd_groups_merge_with_zero_groups_on_blocks(rng, monkeypatch, restore_threads,
                                                   groups):
    """Groups of half a block that do not come in pairs: a blocked call merges them, the last
    merge padded with a zero group whose channels and filters are the padding lanes of the
    last blocks (``csa.layout.padded_groups``); any padding lanes in the input (finite, as
    a convolution leaves them) change no result. The plain call, ``out=`` with
    accumulation, ``bound_blocked`` on blocks, 1 and 2 threads bit-identical; NCHW calls,
    whose planes have no such channels, run the merge too (its slab filled with theirs alone,
    its planes written for their filters alone), channels-last ones as in the test below."""
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1, padded_merge_max_plane=10 ** 6)
    lanes = cso.layouts.block_size(np.dtype(np.float32))
    c_g = lanes // 2
    c = groups * c_g
    x, wt, b, geometry, expected = odd_groups_case(rng, groups, c_g, (9, 8), (1, 0, 1, 2))
    xb = cso.Blocked.from_nchw(x)
    xb.data.reshape(2, -1, lanes)[:, :, c % lanes:][:, -1] = 3.0   # padding lanes: finite
    assert csa.layout.padded_groups(conv_of(wt, b, geometry).spec_for(x.shape), 2) == 1
    outputs = []
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, "silu")
        first, second = conv(xb), conv(xb)
        assert first.channels == second.channels == c
        np.testing.assert_allclose(first.to_nchw(), expected, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(second.data, first.data)
        assert np.isfinite(first.data).all()
        twin = conv._merged_twin
        assert twin is not None and twin.weight_shape[0] == c + c_g
        assert twin.groups == (groups + 1) // 2
        outputs.append(first.data)
        for layout, value, kwargs in (("nchw", x, {}), ("nhwc", x.transpose(0, 2, 3, 1),
                                                         {"layout": "nhwc"})):
            y = conv(np.ascontiguousarray(value), **kwargs)
            np.testing.assert_allclose(y if layout == "nchw" else y.transpose(0, 3, 1, 2),
                                       expected, rtol=2e-5, atol=2e-5)
        assert conv.plan_for(x.shape).spec.groups == twin.groups   # (NCHW calls)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    adding = conv_of(wt, None, geometry, accumulate=True)
    plain = conv2d_reference(x, wt, None, **geometry)
    residual = rng.standard_normal(plain.shape).astype(np.float32)
    out = cso.Blocked.from_nchw(residual)
    assert adding(xb, out=out) is out
    np.testing.assert_allclose(out.to_nchw(), residual + plain, rtol=2e-5, atol=2e-5)
    bound = conv_of(wt, b, geometry, "silu").bound_blocked(x.shape, lanes)
    data = np.full(bound.out_shape, np.nan, np.float32)
    assert bound(xb.data, data) is data
    np.testing.assert_allclose(cso.Blocked(data, c).to_nchw(), expected, rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize("groups,stride", [(3, 1), (5, 1), (5, 2)])
def test_nchw_calls_run_padded_merges_on_their_planes(rng, monkeypatch, restore_threads,
                                                     groups, stride):
    """Groups of half a block that do not come in pairs, called on NCHW planes, on a plane of
    at most the record's ``padded_merge_max_plane`` outputs: the merge padded with a zero
    group runs on the planes as they are, its slab filled from the input's channels alone
    (the zero group's lanes zero) and its output planes written for the convolution's filters
    alone (no array of that many channels exists: the guard-page tests catch a read or write
    past them). The plain call as the first, ``out=`` in place, strided and accumulated, 1 and
    2 threads bit-identical; past the record's plane, the NCHW plan."""
    c_g = cso.layouts.block_size(np.dtype(np.float32)) // 2
    c = groups * c_g
    x, wt, b, geometry, expected = odd_groups_case(rng, groups, c_g, (9, 11), (1, 0, 1, 2))
    if stride == 2:
        geometry["stride"] = (2, 2)
        expected = silu(conv2d_reference(x, wt, b, **geometry))
    plane = expected.shape[2] * expected.shape[3]
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1, padded_merge_max_plane=plane - 1)
    conv = conv_of(wt, b, geometry, "silu")
    np.testing.assert_allclose(conv(x), expected, rtol=2e-5, atol=2e-5)
    assert conv.plan_for(x.shape).spec.groups == groups
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, grouped_blocked_max_plane=10 ** 6,
                 grouped_blocked_max_blocks=1, padded_merge_max_plane=plane)
    outputs = []
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, "silu")
        first, second = conv(x), conv(x)   # (the second a plain call)
        np.testing.assert_allclose(first, expected, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(second, first)
        plan = conv.plan_for(x.shape)
        twin = conv._merged_twin
        assert twin is not None and twin.weight_shape[0] == c + c_g
        assert plan.spec.groups == twin.groups and plan.spec.c == c + c_g
        out = np.full(first.shape, np.nan, np.float32)
        assert conv(x, out=out) is out
        np.testing.assert_array_equal(out, first)
        strided = np.full(first.shape[:3] + (2 * first.shape[3],), np.nan, np.float32)
        assert conv(x, out=strided[..., ::2]).base is strided
        np.testing.assert_array_equal(strided[..., ::2], first)
        outputs.append(first)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    adding = conv_of(wt, None, geometry, accumulate=True)
    plain = conv2d_reference(x, wt, None, **geometry)
    residual = rng.standard_normal(plain.shape).astype(np.float32)
    out = residual.copy()
    assert adding(x, out=out) is out
    np.testing.assert_allclose(out, residual + plain, rtol=2e-5, atol=2e-5)
    assert adding.plan_for(x.shape).spec.groups == (groups + 1) // 2


@pytest.mark.parametrize("groups", [3, 5])
def test_channels_last_calls_run_padded_merges_on_copied_blocks(rng, monkeypatch,
                                                                restore_threads, groups):
    """Groups of half a block that do not come in pairs, called on channels last or on
    blocks of other lanes, on a plane of at most the record's ``padded_merge_max_plane``
    outputs: the input copied into blocks of the lanes (zero padding lanes) runs the merge
    padded with a zero group, the output moved into the layout asked for; ``out=``, written
    and accumulated, the second (plain) call as the first, 1 and 2 threads bit-identical.
    Planes past the record's keep the NCHW plan, whose NCHW calls run the merge on their
    planes (the next test)."""
    c_g = cso.layouts.block_size(np.dtype(np.float32)) // 2
    c = groups * c_g
    x, wt, b, geometry, expected = odd_groups_case(rng, groups, c_g, (7, 6), (1, 1, 0, 2))
    plane = expected.shape[2] * expected.shape[3]
    xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    inputs = {"nhwc": (xh, {"layout": "nhwc"}),
              "blocks of other lanes": (cso.Blocked.from_nchw(x, c_g), {})}

    def merged(conv, value, kwargs):
        shape = value.shape if isinstance(value, cso.Blocked) else x.shape
        layout = kwargs.get("layout", "blocked")
        block = c if layout == "nhwc" else value.block
        return conv._route(shape, layout, block, layout, cso.get_num_threads()).merged
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, padded_merge_max_plane=plane - 1)
    conv = conv_of(wt, b, geometry, "silu")
    for value, kwargs in inputs.values():
        np.testing.assert_allclose(as_nchw(conv(value, **kwargs), kwargs.get("layout", "blocked")),
                                   expected, rtol=2e-5, atol=2e-5)
        assert merged(conv, value, kwargs) is None
    lifted_plans(monkeypatch, merged_groups_max_plane=10 ** 6, padded_merge_max_plane=plane)
    outputs = []
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv = conv_of(wt, b, geometry, "silu")
        got = outputs_in_every_layout(conv, inputs, expected)
        for value, kwargs in inputs.values():
            twin = merged(conv, value, kwargs)
            assert twin is not None and twin.weight_shape[0] == c + c_g
        out = np.full(xh.shape[:3] + (c,), np.nan, np.float32)
        assert conv(xh, layout="nhwc", out=out) is out
        np.testing.assert_array_equal(out.transpose(0, 3, 1, 2), got["nhwc", "nhwc"])
        assert conv._route(x.shape, "nchw", 1, "nchw", threads).merged is None
        outputs.append(got)
    assert all(np.array_equal(outputs[1][key], outputs[0][key]) for key in outputs[0])
    adding = conv_of(wt, None, geometry, accumulate=True)
    plain = conv2d_reference(x, wt, None, **geometry)
    residual = rng.standard_normal(plain.shape).astype(np.float32)
    for out_layout, out in (("nhwc", np.ascontiguousarray(residual.transpose(0, 2, 3, 1))),
                            ("nchw", residual.copy()),
                            ("blocked", cso.Blocked.from_nchw(residual))):
        assert adding(xh, layout="nhwc", out_layout=out_layout, out=out) is out
        np.testing.assert_allclose(as_nchw(out, out_layout), residual + plain, rtol=2e-5,
                                   atol=2e-5, err_msg=out_layout)
    assert csa.tuning.AVX512.padded_merge_max_plane == csa.tuning.AVX2.padded_merge_max_plane \
        == 225
    assert csa.tuning.NEON.padded_merge_max_plane == csa.tuning.GENERIC.padded_merge_max_plane \
        == 0
