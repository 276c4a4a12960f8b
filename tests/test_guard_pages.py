"""No kernel reads or writes outside its arrays: every path runs with the input, packed
weights, bias, output and workspaces each flush against an inaccessible page, at their end and
then at their start, in a child process (a fault fails the case instead of the test run). With
several parts the workspaces are one block of cache-line-rounded rows, one per part: the
block is guarded, and the rounding (under a line) of the last row is not.

The shapes leave an edge on every side of the micro-tile: output planes that are no multiple
of the window tile, filter counts no multiple of the filter tile, channel counts no multiple of
the channel tile, slab rows that end mid-vector."""
import numpy as np
import pytest

import cso
import cso.jobs
import microkernels as mk
from microkernels import supported_isas

from .guarded import guarded_copy, guarded_empty, in_child
from .reference import assert_conv_close

ISAS = [isa.name for isa in supported_isas()]

# name: (N, C, H, W, K, R, S, stride, padding, dilation, groups, plan overrides)
CASES = {
    "packed_IS": (2, 5, 11, 13, 19, 3, 3, 1, 1, 1, 1, {"slab": False, "schedule": "IS", "nc": 2}),
    "packed_WS": (2, 5, 11, 13, 19, 3, 3, 1, 1, 1, 1, {"slab": False, "schedule": "WS", "nc": 3}),
    "packed_stride2_dilated": (1, 4, 15, 17, 10, 3, 3, 2, 2, 2, 1, {"slab": False}),
    "packed_wide_filter": (1, 3, 12, 40, 6, 2, 9, 1, (0, 4), 1, 1, {"slab": False}),
    "packed_stem_7x7_s2": (1, 3, 29, 31, 9, 7, 7, 2, 3, 1, 1, {"slab": False}),
    "unpacked_1x1_IS": (2, 7, 9, 11, 21, 1, 1, 1, 0, 1, 1, {"slab": False, "schedule": "IS"}),
    "unpacked_1x1_WS": (1, 7, 9, 11, 21, 1, 1, 1, 0, 1, 1, {"slab": False, "schedule": "WS"}),
    "1x1_stride2": (1, 6, 13, 13, 17, 1, 1, 2, 0, 1, 1, {}),
    # one-pixel planes (a squeeze-excitation 1x1): the transposing pass moves rows as they are
    "1x1_one_pixel": (3, 40, 1, 1, 37, 1, 1, 1, 0, 1, 1, {}),
    "3x3_one_pixel_filters": (2, 6, 3, 3, 19, 3, 3, 1, 0, 1, 1, {"vectors_along": "filters"}),
    "slab_IS": (1, 5, 23, 37, 19, 3, 3, 1, 1, 1, 1,
                {"slab": True, "vectors_along": "windows", "schedule": "IS", "nc": 2}),
    "slab_WS_bands": (2, 5, 23, 37, 19, 3, 3, 1, 1, 1, 1,
                      {"slab": True, "vectors_along": "windows", "schedule": "WS", "band": 3}),
    "slab_stride2_5x5": (1, 4, 41, 70, 11, 5, 5, 2, 2, 1, 1, {"slab": True, "vectors_along": "windows"}),
    "filters_in_vectors": (1, 16, 7, 9, 37, 3, 3, 1, 1, 1, 1, {"vectors_along": "filters", "slab": False}),
    # the record's window tile for the plane (``register_blocking.filter_vector_tile``;
    # AVX-512: 13 windows on 5 x 5, the last tile 12; 14 on 11 x 11, the last 9), partial
    # filter tiles
    "filters_in_vectors_1x1_5x5": (1, 24, 5, 5, 37, 1, 1, 1, 0, 1, 1,
                                   {"vectors_along": "filters", "slab": False}),
    "filters_in_vectors_11x11_s2": (2, 8, 21, 22, 40, 3, 3, 2, 1, 1, 1,
                                    {"vectors_along": "filters", "slab": False}),
    "direct": (1, 16, 9, 35, 37, 3, 3, 1, 1, 1, 1, {"vectors_along": "filters", "slab": True, "nc": 5}),
    # an 11-wide row, one tile of its own width (AVX-512: direct_min_row_windows), 2 groups
    "direct_narrow_rows": (1, 128, 5, 11, 64, 3, 3, 1, 1, 1, 2, {}),
    # a 24-wide row, two even tiles of 12 (AVX-512), its filter tile in L1 (60 tiles)
    "direct_even_rows": (1, 64, 30, 24, 64, 3, 3, 1, 1, 1, 1, {}),
    # stride 2, an 11-wide output row one tile (AVX-512), 60 filters: a partial filter tile
    "direct_narrow_rows_s2": (1, 64, 21, 22, 60, 3, 3, 2, 1, 1, 1, {}),
    "direct_bands_s2": (2, 8, 19, 35, 21, 3, 3, 2, 1, 1, 1,
                        {"vectors_along": "filters", "slab": True, "band": 2}),
    # stems past stride 2 (``csa.variants.use_direct``, forced for every ISA's tiles): 16
    # stride-4 phase planes a channel, partial filter tiles, rows of 16 and 6 windows, input
    # columns past the last window
    "direct_stem_7x7_s4": (1, 3, 45, 61, 56, 7, 7, 4, 3, 1, 1,
                           {"vectors_along": "filters", "slab": True}),
    "direct_stem_16x16_s8": (2, 3, 40, 57, 40, 16, 16, 8, 0, 1, 1,
                             {"vectors_along": "filters", "slab": True}),
    "grouped": (1, 12, 10, 11, 18, 3, 3, 1, 1, 1, 3, {}),
    "grouped_filters": (1, 12, 6, 7, 18, 3, 3, 1, 1, 1, 3, {"vectors_along": "filters"}),
    # groups of 8 channels: direct, a vector of filters a tile (AVX2); 12 filters a group: two
    "grouped_direct": (2, 24, 9, 13, 24, 3, 3, 1, 1, 1, 3, {}),
    "grouped_direct_partial_tiles": (1, 16, 7, 11, 24, 3, 3, 1, (1, 2), 1, 2, {}),
    # 9 groups of a block each, an NCHW call on blocks and NCHW plans: at 2 threads runs of
    # 4.5 groups, parts of half a group's rows (``csa.thread_split.group_runs``)
    "grouped_runs_on_blocks": (1, 144, 11, 13, 144, 3, 3, 1, 1, 1, 9, {}),
    "grouped_runs_direct": (1, 144, 11, 13, 144, 3, 3, 1, 1, 1, 9,
                            {"vectors_along": "filters", "slab": True}),
    "grouped_runs_packed_windows": (1, 144, 11, 13, 144, 3, 3, 1, 1, 1, 9,
                                    {"vectors_along": "windows", "slab": False}),
    # groups of 8 in an odd number (AVX-512 float32: merged in pairs onto blocks of 16, the
    # last with a zero group; groups of 4 so on AVX2's blocks of 8): NCHW planes read for the
    # real channels alone, written for the real filters alone
    "padded_merge_planes": (2, 24, 9, 8, 24, 3, 3, 1, 1, 1, 3, {}),
    "padded_merge_planes_s2": (2, 40, 11, 9, 40, 3, 3, 2, (1, 2), 1, 5, {}),
    "padded_merge_planes_4": (2, 20, 9, 8, 20, 3, 3, 1, 1, 1, 5, {}),
    # unpadded: the merge's blocked plan would read its planes in place, the zero group's
    # past the input's end (the NCHW plan runs it)
    "padded_merge_unpadded": (1, 40, 12, 12, 40, 3, 3, 1, 0, 1, 5, {}),
    "padded_merge_unpadded_4": (1, 20, 9, 8, 20, 3, 3, 1, 0, 1, 5, {}),
    "depthwise": (1, 9, 13, 17, 9, 3, 3, 1, 1, 1, 9, {}),
    # the NCHW plan where the ISA's record runs a 3x3's planes through blocks (AVX-512)
    "depthwise_nchw_plan": (1, 9, 13, 17, 9, 3, 3, 1, 1, 1, 9, {"depthwise": True}),
    "depthwise_s2_multiplier": (2, 5, 14, 19, 10, 5, 5, 2, 2, 1, 5, {}),
    "depthwise_7x7_small": (1, 3, 7, 7, 3, 7, 7, 1, 3, 1, 3, {}),
    # NCHW planes transposed into blocks and back (a 7x7: its blocked plan), a partial block
    "depthwise_7x7_blocked_s2": (2, 19, 15, 13, 19, 7, 7, 2, 3, 1, 19, {}),
    # output rows moved into the planes a few at a time (4 + 1 on AVX-512, 2 + 2 + 1 on
    # AVX2: ``cso.depthwise.store_rows``), a partial block
    "depthwise_rows_stored_together": (1, 20, 5, 30, 20, 7, 7, 1, 3, 1, 20, {}),
    # channels read through a shuffle (not a plan override: a Conv2d argument)
    "depthwise_shuffled": (1, 12, 13, 17, 12, 3, 3, 1, 1, 1, 12, {"channel_shuffle": 4}),
    "depthwise_shuffled_s2_multiplier": (2, 6, 14, 19, 12, 3, 3, 2, 1, 1, 6,
                                         {"channel_shuffle": 3}),
    "no_bias": (1, 5, 11, 13, 19, 3, 3, 1, 1, 1, 1, {"slab": False}),
}


def _variants():
    for name in sorted(CASES):
        for dtype in ("float32", "float64"):
            for isa in ISAS if dtype == "float32" else ISAS[:1]:
                for threads in (1, 2) if dtype == "float32" and isa == ISAS[0] else (1,):
                    yield pytest.param(name, dtype, isa, threads,
                                       id=f"{name}-{dtype}-{isa}-{threads}t")


@pytest.mark.parametrize("name,dtype,isa,threads", list(_variants()))
def test_no_access_outside_the_arrays(rng, restore_threads, name, dtype, isa, threads):
    n, c, h, w, k, r, s, stride, padding, dilation, groups, overrides = CASES[name]
    overrides = dict(overrides)
    shuffle = overrides.pop("channel_shuffle", 1)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    weight = rng.standard_normal((k, c // groups, r, s)).astype(dtype)
    bias = None if name == "no_bias" else rng.standard_normal(k).astype(dtype)
    cso.set_num_threads(threads)
    conv = cso.Conv2d(weight, bias, stride, padding, dilation, groups, "relu",
                      plan_overrides=overrides, isa=isa, channel_shuffle=shuffle)
    expected = conv(x)   # compiles here, in the parent, so that the children only run
    pad = (padding,) * 4 if isinstance(padding, int) else (padding[0],) * 2 + (padding[1],) * 2
    shuffled = x.reshape(n, shuffle, c // shuffle, h, w).transpose(0, 2, 1, 3, 4).reshape(x.shape)
    assert_conv_close(expected, shuffled, weight, bias, relu=True, stride=(stride, stride),
                      padding=pad, dilation=(dilation, dilation), groups=groups)

    def guarded_run(at):
        cso.jobs.new_workspace = lambda elements, dt: guarded_empty((elements,), dt, at)
        cso.jobs.REUSED_WORKSPACE_BYTES = 0   # (none kept: each new, guarded)
        conv.bias = guarded_copy(conv.bias, at)
        if conv._padded_bias is not None:   # (a blocked plan's, over whole blocks)
            conv._padded_bias = guarded_copy(conv._padded_bias, at)
        conv._packed = {nf: guarded_copy(p, at) for nf, p in conv._packed.items()}
        out = guarded_empty(expected.shape, dtype, at)
        assert conv(guarded_copy(x, at), out=out) is out
        np.testing.assert_array_equal(out, expected)

    for at in ("end", "start"):
        failure = in_child(lambda: guarded_run(at))
        assert failure is None, f"arrays flush at their {at}: {failure}"


# name: (N, C, H, W, K, R, S, stride, padding, groups, plan overrides)
PHASE_CASES = {
    "slicing_slab": (1, 12, 5, 37, 20, 3, 3, 1, 1, 1, {"slab": True}),
    "depthwise_nchw_plan": (1, 9, 13, 17, 9, 3, 3, 1, 1, 9, {"depthwise": True}),
    # NCHW planes through blocks (a 7x7 on every record): its geom's fields are its own
    "depthwise_7x7_blocked": (2, 19, 15, 13, 19, 7, 7, 2, 3, 19, {}),
}


@pytest.mark.parametrize("name", sorted(PHASE_CASES))
@pytest.mark.parametrize("isa", ISAS)
def test_phases_alone_stay_inside_the_arrays(rng, restore_threads, name, isa):
    """The benchmark's time breakdown runs loop-nest phases alone (``Conv2d.call_phases``): on
    guarded arrays, each subset of them touches nothing outside them (the blocked depthwise
    loop nest's phases were written into another field of its geom, and faulted), and all of
    them is the call."""
    from cso.loop_nests import ALL_PHASES
    n, c, h, w, k, r, s, stride, padding, groups, overrides = PHASE_CASES[name]
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((k, c // groups, r, s)).astype(np.float32)
    cso.set_num_threads(1)
    conv = cso.Conv2d(weight, rng.standard_normal(k).astype(np.float32), stride, padding,
                      groups=groups, activation="relu", plan_overrides=overrides, isa=isa)
    expected = conv(x)
    assert conv.plan_for(x.shape).blocked == (name == "depthwise_7x7_blocked")

    def guarded_runs(at):
        cso.jobs.new_workspace = lambda elements, dt: guarded_empty((elements,), dt, at)
        cso.jobs.REUSED_WORKSPACE_BYTES = 0
        conv._packed = {nf: guarded_copy(p, at) for nf, p in conv._packed.items()}
        for phases in range(ALL_PHASES + 1):
            y = conv.call_phases(guarded_copy(x, at), phases)
            assert y.shape == expected.shape
        np.testing.assert_array_equal(y, expected)   # (the last: every phase)

    for at in ("end", "start"):
        failure = in_child(lambda: guarded_runs(at))
        assert failure is None, f"arrays flush at their {at}: {failure}"


@pytest.mark.parametrize("spec", [mk.TransposeSpec("f32", isa) for isa in ISAS]
                         + [mk.TransposeSpec("f64", ISAS[0])], ids=str)
def test_transpose_blocks_stay_inside_their_arrays(rng, spec):
    """The block transpose on every rows x cols block, bare (no flags) and with the epilogue
    reading its destination (ACCUMULATE | BIAS), its source (rows past the last read again
    in a partial block) and destination each flush against guard pages at their end and at
    their start: ``transpose_block_every_size``'s values, with nothing read or written past
    either array."""
    lanes, dt = spec.lanes, spec.np_dtype
    run, reference = mk.compile(spec), mk.reference_kernel(spec)
    lds, ldd = lanes + 3, lanes + 5
    blocks = []
    for rows in range(1, lanes + 1):
        for cols in range(1, lanes + 1):
            for flags in (0, mk.ACCUMULATE | mk.BIAS):
                src = rng.standard_normal((rows - 1) * lds + cols).astype(dt)
                dst = rng.standard_normal((cols - 1) * ldd + rows).astype(dt)
                bias = rng.standard_normal(cols).astype(dt)
                expected = dst.copy()
                reference(src, lds, expected, ldd, rows, cols, bias, flags)
                blocks.append((src, dst, bias, rows, cols, flags, expected))
    run(*blocks[0][:1], lds, blocks[0][1].copy(), ldd, *blocks[0][3:5], blocks[0][2],
        blocks[0][5])   # compiled here, in the parent

    def guarded_runs(at):
        for src, dst, bias, rows, cols, flags, expected in blocks:
            out = guarded_copy(dst, at)
            run(guarded_copy(src, at), lds, out, ldd, rows, cols, guarded_copy(bias, at), flags)
            np.testing.assert_array_equal(out, expected, err_msg=f"{rows} x {cols}")

    for at in ("end", "start"):
        failure = in_child(lambda: guarded_runs(at))
        assert failure is None, f"arrays flush at their {at}: {failure}"


@pytest.mark.parametrize("at,offset", [("end", 0), ("start", -4)])
def test_the_guard_pages_catch_one_element_too_far(at, offset):
    import ctypes
    a = guarded_empty((5,), np.float32, at)
    a[...] = 1
    assert in_child(lambda: a.sum()) is None
    beyond = a.ctypes.data + (a.nbytes if at == "end" else 0) + offset
    assert in_child(lambda: ctypes.c_float.from_address(beyond).value) == "killed by SIGSEGV"
