"""CSA: specs, machine facts and plans checked against hand-computed values."""
import dataclasses

import numpy as np
import pytest

import csa
from csa import ConvSpec, Machine
from microkernels import row_copy

from .machines import AVX2, AVX512, SMALL, ZEN3, ZEN5

# plans on SMALL use a 32 x 14 micro-tile, windows in vectors (a 56-wide row would split
# into two even direct tiles of 28 windows)
TILE = (32, 14)
PACKED = {"microtile_shape": TILE, "vectors_along": "windows"}
LAYER = ConvSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))


def test_kernel_model_against_measured_avx2_kernels():
    """The model's efficiency against the micro-kernels measured on Zen 3 (csa/TUNING.md):
    latency-bound with too few accumulators, load-bound with one vector row, spilled past the
    register file, at the peak in between."""
    model = csa.tuning.AVX2.kernel_efficiency
    assert model(16, 3, 2) == 0.75 and model(16, 2, 3) == 0.75    # 3x16, 2x24: measured 74, 73%
    assert model(16, 1, 4) == 0.5                                   # 1x32: 50%
    assert model(16, 7, 2) == 0 and model(16, 3, 4) == 0            # 7x16, 3x32 spill: 50, 66%
    assert abs(model(16, 8, 1) - 0.78) < 0.01                       # 8x8: 76%
    assert abs(model(16, 9, 1) - 0.79) < 0.01                       # 9x8: 80%
    for tile in ((4, 2), (5, 2), (6, 2), (3, 3), (4, 3)):           # 98-100%
        assert model(16, *tile) == 1.0, tile
    assert csa.tuning.AVX2.broadcast_counts(16, 2) == {4: 1.0, 5: 1.0, 6: 1.0}
    # AVX-512 FMAs take their broadcast from memory: 15 broadcasts x 2 vectors fit 32 registers
    assert max(csa.tuning.AVX512.broadcast_counts(32, 2)) == 15


def test_register_blocking_per_orientation():
    assert csa.register_blocking.microtile(AVX512, 4) == (32, 8)    # float32: 8 of the 4..15 that fit divide real K
    assert csa.register_blocking.microtile(AVX512, 8) == (16, 8)    # float64
    assert csa.register_blocking.microtile(AVX2, 4) == (16, 6)      # 4..6 fit: the fewest loads per FMA
    assert csa.register_blocking.microtile(AVX2, 8) == (8, 6)
    # filters in vectors: the count that covers the plane fastest at the speeds the record
    # measured in loop nests; one window of four vectors on a single-pixel plane
    for positions, windows in ((49, 7), (196, 14), (784, 14), (16, 8), (36, 12), (81, 9),
                               (100, 10), (144, 12), (169, 13), (225, 12)):
        assert csa.register_blocking.filter_vector_tile(AVX512, 4, positions) == (windows, 32), positions
    # (7 x 7 in 7 tiles of 7 at 0.95 against 5 of 10 at 0.96: 51.6 against 52.1 tiles' time)
    # and with the cost of packing them counted, where the record weighs runs: a stride-2 3x3
    # to 8 x 8 in 8-window tiles, a run (output row) each, not 13-window ones of 12 runs
    strided = ConvSpec.parse("n1c384h16w16k384r3s3p1u2g6")
    packing = csa.variants.packing_positions(strided, AVX512.tuning, 32)
    assert csa.register_blocking.filter_vector_tile(AVX512, 4, 64) == (13, 32)
    assert csa.register_blocking.filter_vector_tile(AVX512, 4, 64, packing=packing) == (8, 32)
    assert packing(13) == 12 * 90 / (3 * 64) and packing(8) == 8 * 90 / (3 * 64)
    plan = csa.analyze(strided, AVX512)
    assert (plan.vectors_along, plan.nwin, plan.nf) == ("filters", 8, 32)
    assert csa.variants.packing_positions(strided, AVX2.tuning, 16)(13) == 0   # runs not weighed
    assert csa.register_blocking.filter_vector_tile(AVX512, 4, 1) == (1, 64)
    assert csa.register_blocking.filter_vector_tile(AVX2, 4, 49) == (5, 16)     # 50 positions, against 52 and 54
    assert csa.register_blocking.filter_vector_tile(AVX2, 4, 196) == (6, 16)    # 198 at 1.0 against 196 at 0.96
    assert csa.register_blocking.filter_vector_tile(AVX2, 4, 4) == (4, 16)
    assert csa.register_blocking.filter_vector_tile(AVX2, 4, 1) == (1, 32)
    # direct: a row in even tiles (the short ones one window fewer) at the speed each record
    # measured for their width in loop nests, the narrowest count that makes them: AVX-512's 32
    # as 11 + 11 + 10, not 5 tiles of 7; 48 as 4 x 12 (12-14 wide tiles run as fast)
    for q, avx512, avx2 in ((56, 14, 6), (28, 14, 6), (14, 14, 5), (7, 7, 4), (35, 12, 6),
                            (32, 11, 6), (48, 12, 6), (20, 10, 5), (13, 13, 5), (112, 14, 6)):
        spec = ConvSpec(1, 64, q, q, 64, 3, 3, padding=(1, 1, 1, 1))
        assert csa.register_blocking.direct_windows(spec, AVX512) == avx512, q
        assert csa.register_blocking.direct_windows(spec, AVX2) == avx2, q


def calibrated(machine, speeds, fma_in_flight=8):
    """``machine`` as a calibration measuring ``speeds`` {variant: {broadcasts: fraction}} makes it."""
    measured = [(variant, csa.register_blocking.TILE_VECTORS, b, e) for variant, by_b in speeds.items()
                for b, e in by_b.items()]
    return machine.with_(tuning=machine.tuning.calibrated(fma_in_flight, measured, "test CPU"))


def test_calibration_candidates_are_the_rules_picks_their_neighbours_and_the_records_tiles():
    assert csa.register_blocking.calibration_candidates(AVX2) == {"packed": [4, 5, 6], "slab": [5, 6],
                                                     "direct": [3, 4, 5, 6]}
    # and the tiles the record measured in loop nests (AVX-512: 10, 12, 13 for planes of 100,
    # 144, 169 positions; direct rows' even tiles of 6 to 14)
    assert csa.register_blocking.calibration_candidates(AVX512) == {
        "packed": [6, 7, 8, 9, 10, 12, 13, 14, 15], "slab": [7, 8, 9],
        "direct": [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]}


def test_calibration_confirming_the_model_changes_no_tile():
    agree = calibrated(AVX2, {"packed": {3: 0.75, 4: 0.97, 5: 0.98, 6: 0.99}, "slab": {5: 0.96, 6: 0.97},
                              "direct": {3: 0.7, 4: 0.98, 5: 0.93, 6: 0.98}})
    assert csa.register_blocking.microtile(agree, 4) == (16, 6)
    assert csa.register_blocking.filter_vector_tile(agree, 4, 49) == (5, 16)
    assert csa.register_blocking.filter_vector_tile(agree, 4, 196) == (6, 16)
    spec = ConvSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    assert csa.register_blocking.direct_windows(spec, agree) == 6
    assert agree.tuning.calibration == "test CPU" and "test CPU" in str(agree)


def test_calibration_overturns_tiles_measured_slow():
    # a core where six broadcasts stall (say, fewer rename registers): five, within the noise
    # of the best, wherever the model would have taken six
    slow6 = calibrated(AVX2, {"packed": {3: 0.75, 4: 0.97, 5: 0.98, 6: 0.80}, "slab": {5: 0.96, 6: 0.7},
                              "direct": {3: 0.7, 4: 0.98, 5: 0.97, 6: 0.81}})
    assert csa.register_blocking.microtile(slow6, 4) == (16, 5)
    assert csa.tuning.MEASURED_TOLERANCE < 1 - 0.8 / 0.97
    # a tile slow in one variant is slow for the orientation that runs both
    assert csa.register_blocking.microtile(calibrated(AVX2, {"packed": {5: 0.98, 6: 0.98}, "slab": {5: 0.97, 6: 0.6}}),
                         4) == (16, 5)
    # a core that needs fewer FMAs in flight (ymm FMAs at half rate): three broadcasts measured
    # as fast as four, and the model, told so, agrees; with no loop-nest speeds for that core
    # (the record's are Zen 3's, which lists no 3), a 3x3 plane takes three windows
    half = calibrated(AVX2, {"packed": {3: 0.97, 4: 0.98, 5: 0.98, 6: 0.97}}, fma_in_flight=4)
    assert set(half.tuning.broadcast_counts(16, 2)) == {3, 4, 5, 6}
    unmeasured = half.with_(tuning=dataclasses.replace(half.tuning, filter_windows=()))
    assert csa.register_blocking.filter_vector_tile(unmeasured, 4, 3 * 3) == (3, 16)
    assert csa.tuning.AVX2.broadcast_counts(16, 2) == {4: 1.0, 5: 1.0, 6: 1.0}
    # tiles the model rejects are taken when every tile it prefers measured slow
    odd = calibrated(AVX2, {"packed": {3: 0.95, 4: 0.6, 5: 0.6, 6: 0.6}})
    assert csa.register_blocking.filter_vector_tile(odd, 4, 196) == (3, 16)
    # variants not measured plan from the model
    assert csa.register_blocking.microtile(odd, 4) == (16, 6)


def test_plan_hand_computed_input_stationary():
    plan = csa.analyze(LAYER, SMALL, **PACKED, schedule="IS")
    assert (plan.nwin, plan.nf) == (32, 14)
    # Nc: (0.9*32768 - 32*14*4) / ((32+14)*9*4) = 27699.2 / 1656 = 16.7
    assert plan.nc == 16
    assert plan.footprints() == (32 * 9 * 16 * 4, 14 * 9 * 16 * 4, 32 * 14 * 4)
    # K2: (0.9*65536 - 18432) / (8064 + 1792) = 4.11; K3: (235929.6 - 4*8064) / (18432 + 4*1792) = 7.96
    assert (plan.k2, plan.k3) == (4, 7)
    # one output band: bands of 0.25*0.9*65536 // (32*64*4) = 1 window tile cost more than they save
    assert plan.band == plan.window_tiles
    banded = csa.analyze(LAYER, SMALL, **PACKED, schedule="IS", band=3)
    assert banded.band == 3 and (banded.k2, banded.k3) == (4, 3)   # the blocks lie within a band
    # 5 filter tiles, more than the record's 4 share a slab: packed tiles, ceil(3136 / 32);
    # forced, a slab's tiles cover 55 virtual rows of 58 plus 56: ceil(3246 / 32)
    assert not plan.slab
    assert (plan.window_tiles, plan.filter_tiles, plan.channel_tiles) == (98, 5, 4)
    slab = csa.analyze(LAYER, SMALL, **PACKED, schedule="IS", slab=True)
    assert (slab.window_tiles, slab.filter_tiles, slab.channel_tiles) == (102, 5, 4)


def test_plan_hand_computed_weight_stationary():
    plan = csa.analyze(LAYER, SMALL, **PACKED, schedule="WS", band=102)  # one band
    # K2 window tiles: (58982.4 - 8064) / (18432 + 1792) = 2.5; K3 filter tiles:
    # (235929.6 - 2*18432) / (8064 + 2*1792) = 17.1, clamped to the 5 filter tiles
    assert (plan.k2, plan.k3) == (2, 5)
    assert plan.schedule == "WS" and "schedule" in plan.forced and "band" in plan.forced


def test_blocking_clamps_to_tile_counts_and_at_least_one():
    huge = SMALL.with_(l2=1 << 30, l3=1 << 34)
    plan = csa.analyze(LAYER, huge, **PACKED, schedule="IS")
    assert (plan.k2, plan.k3) == (plan.filter_tiles, plan.window_tiles)
    tiny = SMALL.with_(l1d=1024, l2=2048, l3=4096)
    plan = csa.analyze(LAYER, tiny)
    assert plan.nc == 1 and plan.k2 == 1 and plan.k3 == 1


def test_channel_tile_never_exceeds_channels_per_group():
    spec = ConvSpec(1, 32, 8, 8, 32, 1, 1, groups=8)
    assert csa.analyze(spec, SMALL, **PACKED).nc == 4
    assert csa.blocking.channel_tile(spec, 32, 14, 48 * 1024) == 4


def test_output_bands_where_they_pay():
    zen = ZEN5
    # 0.25*0.9*1 MiB // (32*128*4) = 14 window tiles: 6.4 MB of partial outputs kept in L2
    big_output = csa.analyze(ConvSpec.parse("n1c128h112w112k128r3s3p1u1"), zen, vectors_along="windows")
    assert big_output.band == 14 and "28 of 14 window tiles" in big_output.explain()
    # 9.4 MB of filters read again per band for 1.6 MB of output: one band
    big_filters = csa.analyze(ConvSpec.parse("n1c512h28w28k512r3s3p1u1"), zen, vectors_along="windows")
    assert big_filters.band == big_filters.window_tiles
    one_channel_tile = csa.analyze(ConvSpec.parse("n1c3h224w224k64r7s7p3u2"), zen, vectors_along="windows")
    assert one_channel_tile.band == one_channel_tile.window_tiles
    assert "no partial outputs" in one_channel_tile.explain()


def test_channel_tiles_split_evenly():
    zen = ZEN5
    # 30 channels of a 32 x 8 tile fit L1: (0.9*49152 - 1024) // (40*9*4) = 30
    for c, nc in ((30, 30), (32, 16), (64, 22), (256, 29), (31, 16)):
        spec = ConvSpec(1, c, 28, 28, 64, 3, 3, padding=(1,) * 4)
        assert csa.blocking.channel_tile(spec, 32, 8, zen.l1d) == nc
        assert csa.analyze(spec, zen, vectors_along="windows").channel_tiles == -(-c // 30)


def test_expanding_1x1s_past_l2_stream_their_filter_tile():
    # 1536 -> 6144 at 7 x 7 on Zen 5: a transposed output of 49*6144*4 = 1.2 MB, past a band's
    # share of L2 (0.25*0.9*1 MiB): the window tile alone in L1, (0.9*49152 - 7*32*4) // (7*4)
    # = 1547 channels, all 1536, where the L1 rule of both tiles takes 6 tiles of 256
    spec = ConvSpec.parse("n1c1536h7w7k6144r1s1p0u1")
    assert csa.blocking.streams_1x1_filters(spec, 7, ZEN5)
    assert csa.blocking.channel_tile(spec, 7, 32, ZEN5.l1d) == 256
    assert csa.blocking.channel_tile(spec, 7, 32, ZEN5.l1d, filters_streamed=True) == 1536
    plan = csa.analyze(spec, ZEN5)
    assert (plan.vectors_along, plan.nwin, plan.nc) == ("filters", 7, 1536)
    # not 1x1s of fewer filters than twice their channels, larger filters, nor an output
    # within the share (49*1024*4 = 200 KB)
    for fewer in ("n1c1024h18w18k512r1s1p0u1", "n1c160h56w56k320r3s3p1u2", "n1c256h7w7k1024r1s1p0u1"):
        assert not csa.blocking.streams_1x1_filters(ConvSpec.parse(fewer), 7, ZEN5), fewer


def test_float64_roughly_halves_the_channel_tile():
    f32 = csa.analyze(LAYER, SMALL, **PACKED)
    f64 = csa.analyze(ConvSpec(1, 64, 56, 56, 64, 3, 3, padding=(1,) * 4, dtype="float64"), SMALL,
                      **PACKED)
    # (29491.2 - 32*14*8) / (46*9*8) = 7.8 against 16.7 for float32
    assert f64.nc == 7 and f32.nc == 16


def test_cost_model_picks_the_cheaper_schedule_and_shows_every_term():
    plan = csa.analyze(LAYER, SMALL, **PACKED)
    totals = {name: terms["total"] for name, terms in plan.costs.items()}
    assert plan.schedule == min(totals, key=totals.get)
    for terms in plan.costs.values():
        parts = [v for k, v in terms.items() if k != "total"]
        assert all(v >= 0 for v in parts)
        assert terms["total"] == pytest.approx(sum(parts))
    text = plan.explain()
    for needle in ("Nc = 16", "K2 = ", "K3 = ", "IS: total", "WS: total", str(LAYER), "cheaper"):
        assert needle in text


def test_filters_become_the_vector_dimension_on_small_planes():
    """Where tiles along the filters waste fewer lanes by more than their transposing pass
    costs: the pass counts as ``transpose_depth`` rows of kernel depth, much beside 64
    channels (a 14 x 14 plane's 12% of wasted lanes do not pay for it), little beside 512."""
    machine = SMALL
    for c, hw, k, expected in ((512, 7, 512, "filters"), (512, 14, 256, "filters"),
                               (64, 14, 256, "windows"), (64, 1, 1984, "filters"),
                               (64, 56, 64, "windows"), (64, 28, 128, "windows"),
                               (64, 16, 64, "windows")):
        plan = csa.analyze(ConvSpec(1, c, hw, hw, k, 1, 1), machine)
        assert plan.vectors_along == expected, (c, hw, k)
    # 7x7: 49 windows fill 7 tiles of 7 exactly, against 2 tiles of 32 (64 lanes)
    assert csa.variants.padded_work(ConvSpec(1, 8, 7, 7, 64, 1, 1), 7, 32) == 49 * 64
    assert csa.variants.padded_work(ConvSpec(1, 8, 7, 7, 64, 1, 1), 32, 8) == 64 * 64
    # one pixel: up to four vectors of filters, but the two of a few pixels' plans where the
    # filters stream from beyond L2 (64 KiB here), so that one packing serves both
    for k, tile in ((200, (1, 64)), (1984, (1, 32))):
        plan = csa.analyze(ConvSpec(1, 64, 1, 1, k, 1, 1), machine)
        assert (plan.nwin, plan.nf) == tile, k
    assert csa.analyze(ConvSpec(1, 64, 2, 1, 1984, 1, 1), machine).nf == 32
    assert "vectors along the filters" in csa.analyze(ConvSpec(1, 512, 7, 7, 64, 1, 1),
                                                      machine).explain()


def test_output_streams_term_follows_the_inner_loop():
    """Windows in vectors: IS walks down K2*Nf output rows per window tile (rows a page or
    more apart), WS continues Nf rows; with filters in vectors both schedules sweep window tiles
    past a filter tile, writing consecutive rows of the transposed output."""
    zen = ZEN5
    plan = csa.analyze(ConvSpec.parse("n1c3h331w331k96r3s3p0u2"), zen,   # measured: WS 29% faster
                       vectors_along="windows")
    assert plan.costs["IS"]["output streams"] > 0 and plan.costs["WS"]["output streams"] == 0
    assert plan.schedule == "WS"
    small_rows = csa.analyze(ConvSpec.parse("n1c64h28w28k128r3s3p1u1"), zen)  # rows 3 KiB apart
    assert all(t["output streams"] == 0 for t in small_rows.costs.values())
    transposed = csa.analyze(ConvSpec.parse("n1c2432h7w7k1600r1s1p0u1"), zen)
    assert transposed.vectors_along == "filters"
    assert all(t["output streams"] == 0 for t in transposed.costs.values())


def test_overrides_are_applied_and_reported():
    plan = csa.analyze(LAYER, SMALL, nc=3, k2=2, k3=5, schedule="WS")
    assert (plan.nc, plan.k2, plan.k3, plan.schedule) == (3, 2, 5, "WS")
    assert "forced" in plan.explain()
    with pytest.raises(ValueError, match="schedule"):
        csa.analyze(LAYER, SMALL, schedule="XS")
    with pytest.raises(ValueError, match="nc"):
        csa.analyze(LAYER, SMALL, nc=0)
    # the same overrides in another order make the same plan (a tuning record's are sorted)
    assert csa.analyze(LAYER, SMALL, schedule="WS", k3=5, nc=3, k2=2) == plan
    depthwise = ConvSpec.parse("n1c32h14w14k32r3s3p1u1g32")
    assert csa.analyze(depthwise, SMALL, nc=8, split=(1, 1)) == \
        csa.analyze(depthwise, SMALL, split=(1, 1), nc=8)


def test_slab_where_it_applies_and_pays():
    """With windows in vectors (direct plans: test_direct_where_it_applies)."""
    zen = ZEN5

    def plan(name, **overrides):
        return csa.analyze(ConvSpec.parse(name), zen, vectors_along="windows", **overrides)

    few_filters = plan("n1c64h56w56k32r3s3p1u1")                # 4 filter tiles
    assert few_filters.slab and "slab" in few_filters.explain()
    assert not plan("n1c64h56w56k64r3s3p1u1").slab              # 8 filter tiles
    # at a stride, only when forced (test_convolutions_at_a_stride_pack_their_tiles)
    assert plan("n1c32h208w208k64r3s3p1u2", slab=True).slab     # phase planes
    for name in ("n1c64h56w56k64r3s3p1u2",      # slab rows of 28 + 1 < 32 windows
                 "n1c64h28w28k64r3s3p1u1",      # slab rows of 30 < 32 windows
                 "n1c64h56w56k64r1s1p0u1"):     # unpadded 1x1 reads its input unpacked
        assert not plan(name).slab
        with pytest.raises(ValueError, match="slab override"):
            plan(name, slab=True)
    forced = plan("n1c256h56w56k256r3s3p1u1", slab=True)
    assert forced.slab and "forced: slab" in forced.explain()
    with pytest.raises(TypeError, match="slab"):
        csa.analyze(LAYER, zen, slab=1)


def test_conv_spec_output_size_and_flops():
    spec = ConvSpec(2, 6, 10, 13, 4, 3, 2, stride=(2, 3), padding=(0, 1, 2, 0), dilation=(2, 1), groups=2)
    assert (spec.p, spec.q) == ((10 + 1 - 4 - 1) // 2 + 1, (13 + 2 - 1 - 1) // 3 + 1)
    assert spec.flops == 2 * 2 * 4 * spec.p * spec.q * 3 * 3 * 2
    assert spec.weight_shape == (4, 3, 3, 2)


@pytest.mark.parametrize("spec", [
    LAYER,
    ConvSpec(8, 64, 56, 56, 256, 1, 1, stride=(2, 1), padding=(0, 1, 2, 3), dilation=(2, 2), groups=2,
             dtype="float64"),
    ConvSpec(1, 3, 224, 224, 64, 7, 7, stride=(2, 2), padding=(3, 3, 3, 3)),
], ids=str)
def test_conv_spec_canonical_string_round_trip(spec):
    assert ConvSpec.parse(str(spec)) == spec


def test_conv_spec_canonical_string_example():
    assert str(LAYER) == "n1c64h56w56k64r3s3p1u1"
    with pytest.raises(ValueError, match="canonical"):
        ConvSpec.parse("n1c64")


@pytest.mark.parametrize("kwargs", [dict(n=0), dict(groups=4), dict(r=9), dict(dtype="float16")])
def test_conv_spec_rejects_invalid(kwargs):
    base = dict(n=1, c=6, h=8, w=8, k=6, r=3, s=3)
    with pytest.raises(ValueError):
        ConvSpec(**dict(base, **kwargs))


def test_machine_reads_a_sysfs_tree(tmp_path):
    def entry(i, level, kind, size):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("coherency_line_size", "128")):
            (d / name).write_text(value + "\n")
    entry(0, "1", "Data", "48K")
    entry(1, "1", "Instruction", "32K")
    entry(2, "2", "Unified", "1024K")
    entry(3, "3", "Unified", "32M")
    assert csa.read_sysfs_caches(str(tmp_path)) == {"l1d": 48 * 1024, "l2": 1 << 20, "l3": 32 << 20,
                                                    "line": 128}
    assert csa.read_sysfs_caches(str(tmp_path / "missing")) == {}


def test_host_machine_has_plausible_caches_and_overrides():
    m = Machine.host(vector_bytes=32, vector_registers=16)
    assert 8 * 1024 <= m.l1d <= m.l2 <= m.l3
    assert m.line in (32, 64, 128, 256)
    assert (m.vector_bytes, m.vector_registers) == (32, 16)
    assert Machine.host(l2=12345).l2 == 12345


def test_parse_size():
    assert csa.parse_size("48K") == 49152
    assert csa.parse_size("32M") == 32 << 20
    assert csa.parse_size("512") == 512


def test_unpacked_1x1_only_where_channel_rows_spread_over_l1_sets():
    def unpacked(name, vectors_along="windows", tuning=csa.tuning.AVX512):
        return csa.variants.reads_input_unpacked(ConvSpec.parse(name), vectors_along, tuning)
    assert unpacked("n1c64h56w56k64r1s1p0u1")
    assert unpacked("n1c128h16w16k128r1s1p0u1")   # 4 sets
    for aliased in ("n1c256h64w64k128r1s1p0u1", "n1c256h32w32k128r1s1p0u1",
                    "n1c128h128w128k64r1s1p0u1"):
        assert not unpacked(aliased)
    assert not unpacked("n1c64h56w56k64r1s1p0u1", "filters")
    assert not unpacked("n1c64h56w56k64r3s3p1u1")
    # both records pack from 256 filters: every filter tile reuses the packed tile
    for tuning in (csa.tuning.AVX2, csa.tuning.AVX512):
        assert unpacked("n1c64h28w28k255r1s1p0u1", tuning=tuning)
        assert not unpacked("n1c64h28w28k256r1s1p0u1", tuning=tuning)
        # and from 96 on planes of 6 KiB and more (40 x 40), whose rows lie pages apart
        assert not unpacked("n1c64h40w40k96r1s1p0u1", tuning=tuning)
        assert unpacked("n1c64h40w40k95r1s1p0u1", tuning=tuning)
        assert unpacked("n1c64h39w39k128r1s1p0u1", tuning=tuning)
    assert unpacked("n1c64h56w56k255r1s1p0u1", tuning=csa.tuning.GENERIC)
    zen = ZEN5
    assert not csa.analyze(ConvSpec.parse("n1c64h64w64k64r1s1p0u1"), zen).slab   # packed tiles


def test_direct_depth_and_slab_filter_tiles_come_from_the_record():
    """The AVX2 record plans direct from a kernel depth (C*R*S) of 144 and reads a slab with
    windows in vectors for at most 3 filter tiles; the AVX-512 record from 512 (144 where the
    filters fit one direct tile) and 4."""
    zen3, zen5 = ZEN3, ZEN5
    def plan(name, machine):
        p = csa.analyze(ConvSpec.parse(name), machine)
        return "direct" if p.direct else p.vectors_along + (" slab" if p.slab else " packed")
    assert plan("n1c16h112w112k32r3s3p1u1", zen3) == "direct"        # depth 144
    assert plan("n1c16h112w112k32r3s3p1u1", zen5) == "direct"        # one tile of 32
    assert plan("n1c16h112w112k64r3s3p1u1", zen5) == "windows packed"
    assert plan("n1c8h112w112k32r3s3p1u1", zen5) == "windows slab"    # depth 72
    assert plan("n1c3h224w224k64r3s3p1u1", zen3) == "windows packed"  # depth 27; 11 filter tiles
    assert plan("n1c3h224w224k64r3s3p1u1", zen5) == "windows packed"  # 8 filter tiles
    assert plan("n1c3h224w224k32r3s3p1u1", zen5) == "windows slab"    # 4
    assert plan("n1c3h224w224k18r3s3p1u1", zen3) == "windows slab"    # 3 filter tiles
    assert plan("n1c3h224w224k24r3s3p1u1", zen3) == "windows packed"  # 4
    assert plan("n1c3h224w224k24r3s3p1u1", zen5) == "windows slab"


def test_vectors_along_the_filters_where_they_waste_fewer_lanes_than_the_transpose_costs():
    """14x14 1x1s (196 windows: 13 tiles of 16, 33 of 6): filters in vectors beside hundreds of
    channels, windows in vectors beside a few dozen (their transposing pass costs as much as
    16 channels more per output in the AVX2 record, 24 in the AVX-512 one); 7x7 planes waste
    a third of 16-window tiles. Without a transpose cost (``transpose_depth`` 0) the wasted
    lanes alone decide."""
    zen3, zen5 = ZEN3, ZEN5
    def vector(name, machine=zen3):
        return csa.analyze(ConvSpec.parse(name), machine).vectors_along
    assert vector("n1c512h14w14k512r1s1p0u1") == "filters"
    assert vector("n1c64h14w14k512r1s1p0u1") == "windows"
    assert vector("n1c64h14w14k512r1s1p0u1", zen5) == "windows"
    assert vector("n1c512h14w14k512r1s1p0u1", zen5) == "filters"
    zen5_lanes_alone = dataclasses.replace(zen5, tuning=dataclasses.replace(
        zen5.tuning, transpose_depth=0, packing_filters=0))
    assert vector("n1c64h14w14k512r1s1p0u1", zen5_lanes_alone) == "filters"
    assert vector("n1c768h7w7k384r1s1p0u1") == "filters"
    assert vector("n1c256h56w56k64r1s1p0u1") == "windows"
    # 16 or 32 filters: packing the input for them costs more than windows read in place
    # (6 filters' FMAs a value in the AVX2 record); lanes alone would say filters
    assert vector("n1c128h55w55k16r1s1p0u1") == "windows"
    assert vector("n1c480h13w13k16r1s1p0u1") == "windows"
    zen3_without = dataclasses.replace(zen3, tuning=dataclasses.replace(zen3.tuning,
                                                                        packing_filters=0))
    assert vector("n1c128h55w55k16r1s1p0u1", zen3_without) == "filters"


def test_tile_runs_count_a_run_a_tile_and_a_row_start_inside_one():
    """``tile_runs`` against a count tile by tile: the rows each tile's windows lie on."""
    from csa.variants import tile_runs
    for p, q, nwin in [(1, 1, 16), (7, 7, 32), (14, 14, 32), (28, 28, 32), (32, 32, 32),
                       (56, 56, 14), (13, 17, 6), (3, 40, 16), (9, 11, 48), (5, 64, 32)]:
        spec = ConvSpec.parse(f"n1c8h{p}w{q}k8r1s1p0u1")
        rows = sum((min(p * q, t0 + nwin) - 1) // q - t0 // q + 1 for t0 in range(0, p * q, nwin))
        assert tile_runs(spec, nwin) == rows, (p, q, nwin)


def test_window_tiles_across_short_rows_weigh_their_runs():
    """On the AVX-512 record, stride-2 3x3s whose output rows are shorter than a window tile
    (32 windows on rows of 14 or 28: copied in 3 or 2 runs a tile) take filters in vectors,
    which the lanes and the transposing pass alone leave to windows (the packing runs cost
    these 0.81-0.95x the time, csa/TUNING.md); rows of 56 keep windows in vectors, as do
    1x7s (one tap a row: no tap copies); the AVX2 record does not count runs (its plans of
    16-window tiles ran slower for them)."""
    machine = dataclasses.replace(ZEN5, tuning=csa.tuning.record("avx512"))
    def vector(name, machine=machine):
        return csa.analyze(ConvSpec.parse(name), machine).vectors_along
    assert machine.tuning.packing_run > 0
    short_rows = ("n1c888h14w14k888r3s3p1u2g37", "n1c128h56w56k128r3s3p1u2")
    for name in short_rows:
        assert vector(name) == "filters", name
        uncounted = dataclasses.replace(machine, tuning=dataclasses.replace(
            machine.tuning, packing_run=0))
        assert vector(name, uncounted) == "windows", name
    assert vector("n1c64h112w112k64r3s3p1u2") == "windows"
    assert vector("n1c64h73w73k64r7s1p3_3_0_0u1") == "windows"
    assert csa.tuning.record("avx2").packing_run == 0


def test_a_groups_last_filter_tile_counts_the_vectors_it_fills():
    """112 filters a group: three tiles of 32 and one of 16 (a narrower kernel), not 128
    lanes; so 1232 channels in 11 groups at 14 x 14 (a row a direct tile) run direct, where
    128 lanes a group (14% of its FMAs on zeros) passed the direct plan's waste bound."""
    from csa.variants import filter_lanes, padded_work
    assert [filter_lanes(k, 32, 16) for k in (1, 16, 32, 48, 112, 120, 128)] == [
        32, 32, 32, 48, 112, 128, 128]
    assert filter_lanes(112, 32, 8) == 112 and filter_lanes(20, 16, 8) == 24
    spec = ConvSpec.parse("n1c1232h14w14k1232r3s3p1u1g11")
    assert padded_work(spec, 14, 32, 16) == 196 * 112
    assert padded_work(spec, 14, 32) == 196 * 128
    machine = dataclasses.replace(ZEN5, tuning=csa.tuning.record("avx512"))
    plan = csa.analyze(spec, machine)
    assert plan.direct and plan.nf == 32, plan


def test_output_prefetch_with_windows_in_vectors_only():
    """Plans whose kernel stores NCHW output rows (windows in vectors, packed or slab) ask it
    to prefetch them the record's tiles ahead; filters in vectors (stores to the band's
    transposed output) do not; the AVX-512 record asks it as the AVX2 one (measured on Zen 4);
    the kernel a Conv2d runs carries it."""
    import cso
    from cso.lowering import kernel_spec
    stem, deep = ConvSpec.parse("n1c3h224w224k64r3s3p0u2"), ConvSpec.parse("n1c512h14w14k512r3s3p1u1")
    windows, filters = csa.analyze(stem, ZEN3), csa.analyze(deep, ZEN3)
    assert (windows.vectors_along, filters.vectors_along) == ("windows", "filters")
    assert windows.output_prefetch == csa.tuning.AVX2.output_prefetch == 2
    assert kernel_spec(windows, "avx2").name == "f32_conv_ukernel_6x16_pf2__avx2"
    assert filters.output_prefetch == 0 == kernel_spec(filters, "avx2").prefetch
    slab = csa.analyze(stem, ZEN3, slab=True)
    assert slab.slab and kernel_spec(slab, "avx2").name == "f32_conv_ukernel_6x16_slab_pf2__avx2"
    assert csa.analyze(stem, ZEN5).output_prefetch == csa.tuning.AVX512.output_prefetch == 2
    conv = cso.Conv2d(np.ones((64, 3, 3, 3), np.float32), stride=2, isa="generic")
    plan = conv.plan_for((1, 3, 224, 224))
    assert conv.kernel_for((1, 3, 224, 224)).prefetch == plan.output_prefetch == (
        csa.tuning.GENERIC.output_prefetch if plan.vectors_along == "windows" else 0)


def test_next_filter_tile_prefetched_with_filters_in_vectors():
    """Plans with filters in vectors, packed or direct, run the kernel that prefetches the
    next filter tile; windows in vectors (filters broadcast) do not. On several threads only
    where a thread's filters overflow its L2 (its part of them where the split is over
    filters); blocked plans where they are twice L2, or overflow it on a small plane."""
    import cso
    from cso.lowering import kernel_spec
    stem, deep = ConvSpec.parse("n1c3h224w224k64r3s3p0u2"), ConvSpec.parse("n1c512h14w14k512r3s3p1u1")
    windows, filters = csa.analyze(stem, ZEN3), csa.analyze(deep, ZEN3, slab=False)
    direct = csa.analyze(deep, ZEN5, slab=True)
    blocked = csa.analyze(deep, ZEN5, layout="blocked")
    assert (filters.variant, direct.variant, blocked.variant) == ("packed", "direct", "blocked")
    assert 512 * 512 * 9 * 4 > csa.slicing.BLOCKED_PREFETCH_L2S * ZEN5.l2
    assert [p.prefetch_filters for p in (windows, filters, direct, blocked)] == [
        False, True, True, True]
    small_blocked = csa.analyze(ConvSpec.parse("n1c128h14w14k256r3s3p1u1"), ZEN5,
                                layout="blocked")
    assert 128 * 256 * 9 * 4 <= csa.slicing.BLOCKED_PREFETCH_L2S * ZEN5.l2
    assert small_blocked.blocked and not small_blocked.prefetch_filters
    # filters over L2 but not twice it: on blocks, prefetched on a small plane alone
    plane_7, plane_14 = (csa.analyze(ConvSpec.parse(f"n1c640h{hw}w{hw}k512r1s1p0u1"), ZEN5,
                                     layout="blocked") for hw in (7, 14))
    assert ZEN5.l2 < 640 * 512 * 4 <= csa.slicing.BLOCKED_PREFETCH_L2S * ZEN5.l2
    assert 7 * 7 <= csa.slicing.BLOCKED_PREFETCH_PLANE < 14 * 14
    assert plane_7.blocked and plane_7.prefetch_filters and not plane_14.prefetch_filters
    assert kernel_spec(filters, "avx2").name == f"f32_conv_ukernel_{filters.nwin}x16_next__avx2"
    assert not kernel_spec(windows, "avx2").prefetch_next
    assert kernel_spec(blocked, "avx512").name == f"f32_conv_ukernel_{blocked.nwin}x32_blocked_next__avx512"
    assert not kernel_spec(small_blocked, "avx512").prefetch_next
    small = csa.analyze(ConvSpec.parse("n1c128h14w14k256r3s3p1u1"), ZEN5, threads=2)
    assert small.split == (1, 2) and 128 * 256 * 9 * 4 / 2 <= ZEN5.l2
    assert csa.analyze(small.spec, ZEN5).prefetch_filters and not small.prefetch_filters
    windows_split = csa.analyze(small.spec, ZEN3, threads=2)   # each thread all 1.2 MB
    assert windows_split.split == (2, 1) and windows_split.prefetch_filters
    big = csa.analyze(deep, ZEN5, threads=2)
    assert big.split == (1, 2) and big.prefetch_filters
    conv = cso.Conv2d(np.ones((512, 512, 3, 3), np.float32), padding=1, isa="generic")
    plan = conv.plan_for((1, 512, 14, 14))
    assert conv.kernel_for((1, 512, 14, 14)).prefetch_next == plan.prefetch_filters
    assert plan.prefetch_filters <= (plan.vectors_along == "filters")


def test_slab_planes_the_taps_read():
    assert csa.layout.slab_planes(ConvSpec.parse("n1c8h20w20k8r3s3p1u2")) == 0b1111
    assert csa.layout.slab_planes(ConvSpec.parse("n1c8h20w20k8r1s1p0u2")) == 0b0001
    assert csa.layout.slab_planes(ConvSpec.parse("n1c8h20w20k8r3s3p1u1")) == 0b1
    # stride (1, 2), 1 x 3 filter dilated by 2 along the width: columns 0, 2, 4 are all even
    dilated = ConvSpec(1, 8, 20, 20, 8, 1, 3, stride=(1, 2), dilation=(1, 2))
    assert csa.layout.slab_planes(dilated) == 0b01
    assert csa.layout.slab_planes(ConvSpec.parse("n1c3h224w224k8r16s16p0u16")) == -1   # 256 planes


def test_direct_where_it_applies():
    """Direct plans (filters in vectors, windows broadcast in place from the slab): stride-1
    convolutions (and stride-2 3x3s of rows one tile wide) deep enough per kernel call whose
    tiles waste little; 14 windows per tile, 7 on planes a multiple of 7 but not 14, rows of
    tiles evened out; channel tiles by the filter tile's share of L2; bands of whole output
    rows even with one channel tile (each band transposes its own rows). (Filter tiles in L1:
    the test after the next.)"""
    zen = ZEN5.with_(tuning=dataclasses.replace(ZEN5.tuning, direct_l1_filter_tiles=0))
    plan = csa.analyze(ConvSpec.parse("n1c256h56w56k256r3s3p1u1"), zen)
    assert plan.direct and (plan.vectors_along, plan.nwin, plan.nf, plan.row_tiles) == ("filters", 14, 32, 4)
    assert plan.nc == 128   # 32*9*256*4 B > 0.25*L2 >= 32*9*128*4 B
    assert plan.band % plan.row_tiles == 0 and "direct" in plan.explain()
    assert plan.window_tiles == 56 * 4
    one_tile = csa.analyze(ConvSpec.parse("n1c128h112w112k128r3s3p1u1"), zen)
    assert one_tile.direct and one_tile.channel_tiles == 1
    assert one_tile.band == 32   # 0.25*0.9*1 MiB // (14*128*4 B), 4 rows of 8 tiles
    # a group's transposed output is passed after its tiles: 2 groups of 64, the band of 64
    # filters, as a dense layer's of 64, and a transposed band of one group's
    grouped = csa.analyze(ConvSpec.parse("n1c128h112w112k128r3s3p1u1g2"), zen)
    assert grouped.direct and grouped.band == 64
    assert grouped.band_buffers[1] == 64 * grouped.nwin * 64
    assert csa.analyze(ConvSpec.parse("n1c64h112w112k64r3s3p1u1"), zen).band == 64
    assert csa.analyze(ConvSpec.parse("n1c512h7w7k512r3s3p1u1"), zen).nwin == 7
    evened = csa.analyze(ConvSpec.parse("n1c128h104w104k128r3s3p1u1"), zen)
    assert (evened.nwin, evened.row_tiles) == (13, 8)   # tiles of 14 evened out: 104 = 8 x 13
    # a row narrower than a tile is one tile of its width, from the record's
    # direct_min_row_windows (10 on AVX-512), at stride 1 from direct_row_tile_min_windows (8);
    # a row of 6 is one tile of the record's narrowest width (measured as fast as packed tiles);
    # narrower rows count padded to it (5 of 6), and so do rows of 8 at stride 2 (to 14)
    for q, direct in ((12, True), (10, True), (8, True), (6, True), (5, False)):
        narrow = csa.analyze(ConvSpec(1, 256, q, q, 256, 3, 3, padding=(1, 1, 1, 1)), zen)
        assert narrow.direct == direct, q
        assert not direct or (narrow.nwin, narrow.row_tiles) == (q, 1)
    assert not csa.analyze(ConvSpec.parse("n1c256h16w16k256r3s3p1u2"), zen).direct
    # (where the record lists no tile that narrow: 14 and 7 only)
    one_row_unmeasured = zen.with_(tuning=dataclasses.replace(
        zen.tuning, direct_row_tile_min_windows=0, direct_windows=((14, 1.0), (7, 0.93))))
    assert not csa.analyze(ConvSpec.parse("n1c256h8w8k256r3s3p1u1"), one_row_unmeasured).direct
    # so do rows of even tiles that wide (24 = 2 x 12, 36 = 3 x 12); uneven ones count padded
    # to their wider tiles (17 = 9 + 8 as 2 x 9, 32 = 11 + 11 + 10 as 3 x 11), not to 14
    for q, nwin, tiles in ((24, 12, 2), (36, 12, 3), (17, 9, 2), (32, 11, 3)):
        even = csa.analyze(ConvSpec(1, 256, q, q, 256, 3, 3, padding=(1, 1, 1, 1)), zen)
        assert even.direct, q
        assert (even.nwin, even.row_tiles) == (nwin, tiles), q
    # at stride 2 where an output row is one such tile (10-14 wide) and the windows overlap
    for name in ("n1c64h20w20k64r3s3p1u2", "n1c64h28w28k64r3s3p1u2", "n1c64h28w28k64r3s3p2u2d2"):
        assert csa.analyze(ConvSpec.parse(name), zen).direct, name
    for name in ("n1c64h56w56k64r3s3p1u2",      # two tiles a row
                 "n1c64h14w14k64r3s3p1u2",      # 7 wide
                 "n1c256h28w28k256r2s2p0u2",    # 2x2 at stride 2: windows do not overlap
                 "n1c256h28w28k256r1s1p0u2"):   # nor do a strided 1x1's
        assert not csa.analyze(ConvSpec.parse(name), zen).direct, name
    unmeasured = zen.with_(tuning=dataclasses.replace(zen.tuning, direct_min_row_windows=0,
                                                      direct_row_tile_min_windows=0,
                                                      direct_windows=((14, 1.0), (7, 0.93))))
    assert not csa.analyze(ConvSpec.parse("n1c256h12w12k256r3s3p1u1"), unmeasured).direct
    assert not csa.analyze(ConvSpec.parse("n1c256h24w24k256r3s3p1u1"), unmeasured).direct
    assert not csa.analyze(ConvSpec.parse("n1c64h20w20k64r3s3p1u2"), unmeasured).direct
    for name in ("n1c64h224w224k128r3s3p1u2",   # stride 2
                 "n1c32h147w147k64r3s3p1u1",    # 288 rows per call
                 "n1c512h14w14k512r1s1p0u1",    # unpadded 1x1: read in place or packed
                 "n1c256h28w28k40r3s3p1u1"):    # 40 filters in tiles of 32
        assert not csa.analyze(ConvSpec.parse(name), zen).direct, name
    strided = ConvSpec.parse("n1c64h224w224k128r3s3p1u2")
    assert csa.analyze(strided, zen, vectors_along="filters", slab=True).direct
    # past the strides whose taps the packer shuffles, overlapping windows of at least twice
    # as many values (C*R*S) as filters, padded work up to 20%: stems such as 7x7 at stride 4
    assert csa.variants.SHUFFLED_TAPS_MAX_STRIDE == max(row_copy.TAP_STRIDES)
    for name in ("n1c3h224w224k64r7s7p3u4", "n1c3h224w224k32r7s7p3u4",
                 "n1c3h240w240k56r7s7p3u4",     # 56 filters in 64 lanes
                 "n1c3h224w224k40r7s7p3u4",     # 40 in 48 (a narrower last tile)
                 "n1c3h224w224k144r16s16p0u8"):  # 144 in 160 (and 27 = 2 x 14 - 1 windows)
        assert csa.analyze(ConvSpec.parse(name), zen).direct, name
    for name in ("n1c3h224w224k96r7s7p3u4",     # 2 x 96 filters > 147 values a window
                 "n1c3h224w224k20r7s7p3u4",     # 20 filters in 32 lanes
                 "n1c3h224w224k96r4s4p0u4",     # 4x4 at stride 4: windows do not overlap
                 "n1c3h224w224k64r7s7p3u2"):    # stride 2: its taps shuffled
        assert not csa.analyze(ConvSpec.parse(name), zen).direct, name
    assert not csa.analyze(ConvSpec.parse("n1c256h56w56k256r3s3p1u1"), zen, slab=False).direct
    assert csa.blocking.direct_channel_tile(ConvSpec.parse("n1c512h28w28k512r3s3p1u1"), 32, zen) == 171


def test_direct_channel_tile_fits_the_band_in_l2():
    """A direct plan's channel tile is cut so that the filter tile, its slab rows and the
    band's partial outputs of one group fit 0.9*L2, unless the partial outputs alone leave
    calls shallower than ``direct_min_depth`` rows. (The filter tile's L2 rule: without the
    record's ``direct_l1_filter_tiles``.)"""
    # 6 x 16 direct tiles, 512 KiB of L2: 471859 B to fill
    zen = ZEN3.with_(tuning=dataclasses.replace(ZEN3.tuning, direct_l1_filter_tiles=0))
    deep = csa.analyze(ConvSpec.parse("n1c512h28w28k512r3s3p1u1"), zen)
    assert csa.blocking.direct_channel_tile(deep.spec, 16, zen) == 171   # the filter rule's
    # per channel 16*9*4 B of filters + 8 slab rows of 30 columns * 4 B; 30 tiles of 6 windows
    # x 512 filters * 4 B of outputs: (471859 - 368640) // 1536 = 67 -> 8 tiles of 64
    assert (deep.band, deep.row_tiles, deep.band_rows) == (30, 5, 8)
    assert deep.nc == 64 and deep.direct_l2_set == 64 * 1536 + 368640
    assert "a group's partial outputs of a band <= 0.9*L2 (466944 vs 471859)" in deep.explain()
    # already within: 128 * (576 + 5 * 58 * 4) + 30*6*256*4 = 406528
    fits = csa.analyze(ConvSpec.parse("n1c256h56w56k256r3s3p1u1"), zen)
    assert fits.nc == 128 and fits.direct_l2_set == 406528
    # one group's outputs count: 4 groups of 256 filters take 184320 B, not 737280
    grouped = csa.analyze(ConvSpec.parse("n1c1024h28w28k1024r3s3p1u1g4"), zen)
    assert grouped.direct and grouped.nc == 128 and grouped.direct_l2_set == 380928
    # 30*5*2048*4 B of partial outputs overflow L2 on their own: the filter rule's tile stays
    wide = csa.analyze(ConvSpec.parse("n1c2048h15w15k2048r3s3p1u1"), zen)
    assert wide.nc == 205 == csa.blocking.direct_channel_tile(wide.spec, 16, zen)
    # forced values win
    assert csa.analyze(deep.spec, zen, nc=171).nc == 171


def test_blocked_tiles_of_few_windows_keep_their_filter_tile_in_l1():
    """A blocked direct tile of fewer windows than its filter tile's lines take to stream
    from L2 (``streams_filters``: 8 on AVX-512, 4 on AVX2) keeps its filter tile within half
    of L1, where more than one window tile reads it; an NCHW direct plan, and a one-pixel
    plane's single tile, keep the L2 rule."""
    blocking = csa.blocking
    assert not blocking.streams_filters(7, ZEN5) and blocking.streams_filters(8, ZEN5)
    assert not blocking.streams_filters(3, ZEN3) and blocking.streams_filters(4, ZEN3)
    late_1x1 = ConvSpec.parse("n1c768h7w7k384r1s1p0u1")   # tiles of 7 windows on blocks
    plan = csa.analyze(late_1x1, ZEN5, layout="blocked")
    room = blocking.DIRECT_L1_FILTER_FILL * ZEN5.l1d
    filter_row = plan.nf * 4   # a channel's share of the filter tile (1x1, float32)
    assert plan.nwin == 7 and plan.nc % 16 == 0
    assert plan.nc * filter_row <= room < (plan.nc + 16) * filter_row * 2
    assert "too few to stream the filter tile from L2" in plan.explain()
    nchw = csa.analyze(ConvSpec.parse("n1c512h7w7k512r3s3p1u1"), ZEN5)
    assert nchw.direct and nchw.nwin == 7 and nchw.nc * nchw.nf * 9 * 4 > room
    pixel = ConvSpec.parse("n1c1098h1w1k91r1s1p0u1")
    one = csa.analyze(pixel, ZEN5, layout="blocked")
    assert one.nc * one.nf * 4 > room
    wide = csa.analyze(ConvSpec.parse("n1c256h28w28k256r3s3p1u1"), ZEN5, layout="blocked")
    assert wide.nwin == 14 and wide.nc * wide.nf * 9 * 4 > room


@pytest.mark.parametrize("machine", [ZEN5, ZEN3], ids=["avx512", "avx2"])
def test_nchw_direct_plans_of_many_window_tiles_keep_their_filter_tile_in_l1(machine):
    """An NCHW direct plan whose image holds ``tuning.direct_l1_filter_tiles`` window tiles
    or more keeps its filter tile within half of L1, which they read in turn; fewer tiles
    (a 7 x 7 plane) keep the L2 rule, and so do bands whose partial outputs overflow L2 (1024
    filters: each extra channel tile would pass over them from L3) and every plan where the
    record has no value."""
    blocking, tiles = csa.blocking, machine.tuning.direct_l1_filter_tiles
    room = blocking.DIRECT_L1_FILTER_FILL * machine.l1d
    wide = csa.analyze(ConvSpec.parse("n1c128h56w56k128r3s3p1u1"), machine)
    filter_row = wide.nf * 9 * 4   # a channel's share of the filter tile (3x3, float32)
    assert tiles and wide.direct and wide.spec.p * wide.row_tiles >= tiles
    assert wide.nc * filter_row <= room < 2 * wide.nc * filter_row
    assert blocking.filters_in_l1(wide.spec, wide.nwin, machine, blocked=False)
    assert "read the filter tile from L1 in turn" in wide.explain()
    late = csa.analyze(ConvSpec.parse("n1c512h7w7k512r3s3p1u1"), machine,
                       vectors_along="filters", slab=True)
    assert late.direct and late.spec.p * late.row_tiles < tiles and late.nc * filter_row > room
    many = csa.analyze(ConvSpec.parse("n1c256h56w56k1024r3s3p1u1"), machine)
    assert many.direct and not blocking.band_fits_l2(many.spec, many.nwin, many.band, machine)
    assert many.nc * filter_row > room
    unmeasured = machine.with_(tuning=dataclasses.replace(machine.tuning,
                                                          direct_l1_filter_tiles=0))
    assert csa.analyze(wide.spec, unmeasured).nc * filter_row > room


@pytest.mark.parametrize("layout", ["nchw", "blocked"])
def test_a_direct_plans_band_override_is_whole_output_rows(rng, layout):
    """A direct plan's bands are whole output rows (its slab's rows): a band override of part
    of a row is rounded down to whole rows, at least one, and the convolution stays right."""
    import cso
    from .reference import assert_conv_close
    # (41 columns: two or more tiles a row whatever the host's tiles, 30 windows on NEON's)
    spec = ConvSpec(2, 24, 11, 41, 19, 3, 3, padding=(1, 1, 1, 1))
    overrides = {} if layout == "blocked" else {"vectors_along": "filters", "slab": True}
    row = csa.analyze(spec, cso.host_machine(), layout=layout, **overrides).row_tiles
    assert row >= 2
    overrides["band"] = row + 1   # a row and part of the next
    plan = csa.analyze(spec, cso.host_machine(), layout=layout, **overrides)
    assert plan.direct and plan.row_tiles == row
    assert plan.band == row
    x = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    conv = cso.Conv2d(w, None, padding=1, plan_overrides=overrides)
    y = conv(cso.Blocked.from_nchw(x)).to_nchw() if layout == "blocked" else conv(x)
    assert_conv_close(y, x, w, padding=(1, 1, 1, 1))


def test_channels_last_depthwise_bands_keep_a_large_images_pixels_in_l2():
    """On channels last (layout "nhwc") a blocked depthwise plan's blocks take turns at each
    band's pixels: where the record says (AVX2), an image of more than pixel_band_image x L2
    gets bands whose input rows of all channels fit L2 (at least PIXEL_BAND_ROWS output rows),
    a smaller one the blocked plan's own; elsewhere every image gets the blocked plan's. A
    slicing plan is the blocked one whatever the layout says."""
    from csa.depthwise import PIXEL_BAND_FILL, PIXEL_BAND_ROWS
    machine = ZEN3
    large = ConvSpec.parse("n1c256h96w96k256r3s3p1u1g256")
    blocked = csa.analyze(large, machine, layout="blocked")
    pixels = csa.analyze(large, machine, layout="nhwc")
    row = large.w * large.c * large.itemsize
    assert large.h * row > machine.tuning.pixel_band_image * machine.l2
    assert pixels.blocked and pixels.layout == "blocked" and pixels.band < blocked.band
    rows = (pixels.band - 1) * large.stride[0] + large.r   # input rows a band reads
    assert pixels.band == PIXEL_BAND_ROWS or rows * row <= PIXEL_BAND_FILL * machine.l2
    strided = ConvSpec.parse("n1c1536h56w56k1536r3s3p1u2g1536")   # a row is most of L2
    assert csa.analyze(strided, machine, layout="nhwc").band == PIXEL_BAND_ROWS
    small = ConvSpec.parse("n1c1024h14w14k1024r3s3p1u1g1024")
    assert small.h * small.w * small.c * small.itemsize <= 4 * machine.l2
    for spec, on in ((small, machine), (large, ZEN5), (strided, ZEN5)):   # (AVX-512: never)
        assert csa.analyze(spec, on, layout="nhwc") == csa.analyze(spec, on, layout="blocked")
    dense = ConvSpec.parse("n1c64h56w56k64r3s3p1u1")
    assert csa.analyze(dense, machine, layout="nhwc") == csa.analyze(dense, machine,
                                                                      layout="blocked")
    with pytest.raises(ValueError, match="layout must be one of"):
        csa.analyze(dense, machine, layout="nchwc")


@pytest.mark.parametrize("machine", [ZEN3, ZEN5], ids=["zen3", "zen5"])
def test_convolutions_at_a_stride_pack_their_tiles(machine):
    """Windows in vectors read a slab only at stride 1 (a slab of stride phases ran at
    0.5-0.94x the speed of packed tiles on stems over 3 channels, 0.67-1.0x on grouped
    layers, and split over threads worse), grouped or not; at stride 1 the slab rule holds."""
    for name in ("n1c184h32w32k184r3s3p1u2g23", "n1c88h64w64k88r3s3p1u2g11",
                 "n1c32h112w112k32r3s3p1u2g8", "n1c3h224w224k16r3s3p1u2",
                 "n1c3h224w224k64r7s7p3u2", "n1c32h208w208k64r3s3p1u2",
                 "n1c64h150w150k128r1s1p0u2", "n1c3h224w224k96r4s4p0u4"):
        plan = csa.analyze(ConvSpec.parse(name), machine)
        assert plan.vectors_along == "windows" and not plan.slab, name
    same = csa.analyze(ConvSpec.parse("n1c3h224w224k16r3s3p1u1"), machine)
    assert same.vectors_along == "windows" and same.slab
