"""Channel-blocked (NCHWc, ``cso.Blocked``) and channels-last (NHWC) activations in and out of
``Conv2d``: every layout pair against the NCHW reference (odd channel counts, every padding
form, strides, dilations, filter shapes, groups on and off the blocks, bias, activations,
batches, 1x1 planes); chains of blocked values and residuals (``accumulate=True``); bit-identical
results across thread counts and splits; no access outside the arrays (guard pages); pickling,
foreign block sizes and zero-copy NHWC views; the errors; and the blocked plans CSA makes."""
import dataclasses
import faulthandler
import pickle

import numpy as np
import pytest

import csa
import cso
import cso.jobs
from cso.layouts import Blocked, block_size
from microkernels import default_isa
from microkernels.reference import activation_values

from .guarded import guarded_copy, guarded_empty, in_child
from .machines import AVX2, AVX512, NEON, SMALL, ZEN3
from .reference import conv2d_reference

LAYOUTS = ("nchw", "nhwc", "blocked")
PAIRS = [(i, o) for i in LAYOUTS for o in LAYOUTS]
DTYPES = [np.float32, np.float64]
HOST_ISA = default_isa().name                # the kernels Conv2d uses unless told (CSO_ISA)
# a per-layer ISA other than the default (the portable kernels, 4 lanes of float32)
ISAS = [None] + (["generic"] if HOST_ISA != "generic" else [])


# helpers ---------------------------------------------------------------------------------------

def as_layout(x, layout, block=None):
    """NCHW array ``x`` laid out as ``layout`` (blocked: in blocks of ``block``)."""
    if layout == "nchw":
        return x
    if layout == "nhwc":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return Blocked.from_nchw(x, block)


def empty_out(layout, shape, dtype, block):
    """An ``out=`` buffer of NCHW ``shape`` in ``layout``, NaN everywhere (padding lanes
    included): whatever the convolution leaves unwritten shows."""
    n, k, p, q = shape
    if layout == "blocked":
        out = Blocked.empty(shape, dtype, block)
        out.data[...] = np.nan
        return out
    return np.full(shape if layout == "nchw" else (n, p, q, k), np.nan, dtype)


def logical(y, layout, shape, dtype, block):
    """The NCHW values of result ``y``, after checking that it is laid out as ``layout`` says:
    a Blocked of ``block`` (C-contiguous data, every lane finite, padding lanes included), a
    C-contiguous NHWC array, or an NCHW array."""
    n, k, p, q = shape
    if layout == "blocked":
        assert isinstance(y, Blocked), type(y)
        assert y.shape == shape and y.block == block and y.dtype == dtype, y
        assert y.data.shape == (n, -(-k // block), p, q, block) and y.data.flags.c_contiguous
        assert np.isfinite(y.data).all(), "non-finite values in the blocks (padding lanes?)"
        return y.to_nchw()
    assert isinstance(y, np.ndarray) and y.dtype == dtype, type(y)
    if layout == "nhwc":
        assert y.shape == (n, p, q, k) and y.flags.c_contiguous, y.shape
        return y.transpose(0, 3, 1, 2)
    assert y.shape == shape, y.shape
    return y


def geometry(conv, shape):
    """The reference's keyword arguments for ``conv`` on inputs of ``shape``."""
    spec = conv.spec_for(shape)
    return dict(stride=spec.stride, padding=spec.padding, dilation=spec.dilation,
                groups=spec.groups)


def assert_matches(actual, x, w, b, activation, geom, residual=None, what=""):
    """``actual`` (NCHW) is act(residual + conv(x) + b) within float rounding: per element the
    pre-activation error is at most tol * sqrt(depth) times the magnitude that fed it
    (``reference.assert_conv_close``'s bound), which the activations (slopes up to 1.5)
    carry through, plus a few units in the last place of their own."""
    f64 = np.float64
    pre = conv2d_reference(x.astype(f64), w.astype(f64), None if b is None else b.astype(f64),
                           **geom)
    magnitude = conv2d_reference(np.abs(x).astype(f64), np.abs(w).astype(f64),
                                 None if b is None else np.abs(b).astype(f64), **geom)
    if residual is not None:
        pre, magnitude = pre + residual, magnitude + np.abs(residual)
    if activation is None:
        expected = pre
    else:
        act = cso.Activation.of(activation)
        expected = activation_values(act.kind, pre, act.values)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    eps = np.finfo(x.dtype).eps
    depth = w.shape[1] * w.shape[2] * w.shape[3]
    tol = (1e-5 if x.dtype == np.float32 else 1e-13) * np.sqrt(depth)
    bound = 1.5 * tol * magnitude + 8 * eps * np.abs(expected) + np.finfo(x.dtype).tiny
    err = np.abs(actual.astype(f64) - expected)
    if not np.all(err <= bound):
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at "
                             f"{worst}: got {actual[worst]}, expected {expected[worst]}")


def used_blocked_plan(conv):
    """Whether a call of ``conv`` ran on a blocked plan (its prepared table holds one)."""
    blocked = [found.plan for key, found in conv._by_shape.items() if key[3] is not None]
    assert all(plan.layout == "blocked" for plan in blocked)
    return bool(blocked)


BLOCK = "one block"   # a channel-tile override: one block of the kernels' lanes


def for_lanes(overrides, lanes):
    """``overrides`` with a channel tile (``nc``) of ``BLOCK`` made ``lanes`` channels (8
    floats on AVX2, 16 on AVX-512): a blocked plan's tiles are whole blocks."""
    if overrides and overrides.get("nc") == BLOCK:
        return {**overrides, "nc": lanes}
    return overrides


def make_conv(rng, dtype, c, k, r, s, groups=1, bias=True, **kwargs):
    w = (rng.standard_normal((k, c // groups, r, s)) / np.sqrt(c // groups * r * s)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if bias else None
    if "plan_overrides" in kwargs:
        kwargs["plan_overrides"] = for_lanes(kwargs["plan_overrides"],
                                             block_size(dtype, kwargs.get("isa")))
    return cso.Conv2d(w, b, groups=groups, **kwargs), w, b


# 1. every layout pair against the reference ---------------------------------------------------

# name: (N, C, H, W, K, R, S, stride, padding, dilation, groups, bias, activation, extra)
CASES = {
    "c1_k1_same": (1, 1, 7, 9, 1, 3, 3, 1, "same", 1, 1, True, None, {}),
    # one channel, several filters (a grayscale image's first layer): planned as depthwise
    # with a channel multiplier, so not on blocks (its blocked plan took a filter a lane)
    "c1_k8_one_channel": (2, 1, 9, 11, 8, 3, 3, 1, 1, 1, 1, True, "relu", {}),
    "c1_k20_7x7_s2": (1, 1, 15, 13, 20, 7, 7, 2, 3, 1, 1, False, None, {}),
    "c3_k5_pad1_batch3": (3, 3, 8, 10, 5, 3, 3, 1, 1, 1, 1, True, "relu", {}),
    "c5_k13_asymmetric": (1, 5, 9, 11, 13, 3, 3, 1, ((0, 2), (1, 0)), 1, 1, True, None, {}),
    "c13_k20_valid_s2_batch3": (3, 13, 11, 12, 20, 3, 3, 2, "valid", 1, 1, False, "silu", {}),
    "c17_k33_s3": (1, 17, 13, 14, 33, 3, 3, 3, 1, 1, 1, True, "hardswish", {}),
    "stride_1x2_5x5": (1, 6, 12, 15, 11, 5, 5, (1, 2), 2, 1, 1, True, "relu", {}),
    "same_s2_5x5_odd": (1, 5, 9, 10, 7, 5, 5, 2, "same", 1, 1, True, None, {}),
    "dilation2_same": (1, 9, 12, 11, 10, 3, 3, 1, "same", 2, 1, True, None, {}),
    "dilation_2x1_batch3": (3, 4, 10, 9, 7, 3, 3, 1, (2, 1), (2, 1), 1, False, None, {}),
    "stem_7x7_s2": (1, 3, 17, 19, 16, 7, 7, 2, 3, 1, 1, True, "relu", {}),
    "1x3_asymmetric": (1, 7, 6, 13, 9, 1, 3, 1, ((0, 0), (2, 0)), 1, 1, True, None, {}),
    "3x3_unpadded_in_place": (2, 11, 7, 10, 19, 3, 3, 1, 0, 1, 1, True, None, {}),
    "3x3_unpadded_s2_dilated": (1, 6, 13, 12, 5, 3, 3, 2, "valid", 2, 1, True, "silu", {}),
    "pointwise_in_place_batch3": (3, 24, 5, 6, 40, 1, 1, 1, 0, 1, 1, True, "relu", {}),
    "pointwise_s2": (1, 13, 9, 9, 17, 1, 1, 2, 0, 1, 1, False, None, {}),
    "channel_tiles_and_bands": (2, 24, 11, 9, 19, 3, 3, 1, 1, 1, 1, True, "relu",
                                {"plan_overrides": {"nc": BLOCK, "band": 2}}),
    "pointwise_channel_tiles_odd": (2, 21, 5, 6, 11, 1, 1, 1, 0, 1, 1, True, "relu",
                                    {"plan_overrides": {"nc": BLOCK}}),
    "pointwise_7x7_merged_rows": (2, 24, 7, 7, 40, 1, 1, 1, 0, 1, 1, True, "relu", {}),
    "pointwise_14x14_merged_rows": (1, 16, 14, 14, 19, 1, 1, 1, 0, 1, 1, False, None, {}),
    "se_reduce_1x1_plane": (3, 32, 1, 1, 8, 1, 1, 1, 0, 1, 1, True, "relu", {}),
    "se_expand_1x1_plane": (1, 8, 1, 1, 33, 1, 1, 1, 0, 1, 1, True, "hardswish", {}),
    "3x3_on_1x1_plane": (1, 5, 1, 1, 13, 3, 3, 1, "same", 1, 1, True, None, {}),
    "groups2_on_blocks": (1, 32, 6, 7, 32, 3, 3, 1, 1, 1, 2, True, "relu", {}),
    "groups4_on_blocks_1x1": (3, 32, 5, 6, 32, 1, 1, 1, 0, 1, 4, True, None, {}),
    "groups4_on_blocks_s2": (1, 32, 9, 9, 64, 3, 3, 2, 1, 1, 4, False, "silu", {}),
    "groups3_off_blocks": (1, 12, 6, 7, 18, 3, 3, 1, 1, 1, 3, True, "silu", {}),
    "depthwise": (1, 16, 8, 9, 16, 3, 3, 1, 1, 1, 16, True, "relu", {}),
    "depthwise_s2_batch3": (3, 16, 9, 8, 16, 3, 3, 2, "same", 1, 16, False, None, {}),
    "depthwise_13_in_place": (1, 13, 9, 10, 13, 3, 3, 1, 0, 1, 13, True, "hardswish", {}),
    "depthwise_multiplier2": (1, 8, 7, 9, 16, 3, 3, 1, 1, 1, 8, True, None, {}),
    "depthwise_shuffled": (1, 12, 7, 8, 12, 3, 3, 1, 1, 1, 12, True, None,
                           {"channel_shuffle": 4}),
    # a strided 1x1's slab holds whole rows: the kernel steps the stride along them (it was
    # given the subsampled slab of a slicing plan, and read past its windows)
    "depthwise_1x1_s2": (2, 19, 9, 11, 19, 1, 1, 2, 0, 1, 19, True, "relu", {}),
    "depthwise_1x1_s3": (1, 16, 10, 8, 16, 1, 1, 3, 0, 1, 16, False, None, {}),
}


def case_params():
    for name in CASES:
        for dtype in DTYPES:
            for isa in ISAS:
                yield pytest.param(name, dtype, isa,
                                   id=f"{name}-{np.dtype(dtype).name}-{isa or HOST_ISA}")


@pytest.mark.parametrize("name,dtype,isa", list(case_params()))
def test_every_layout_pair_matches_the_reference(rng, name, dtype, isa):
    n, c, h, w, k, r, s, stride, padding, dilation, groups, bias, activation, extra = CASES[name]
    conv, wt, b = make_conv(rng, dtype, c, k, r, s, groups, bias, stride=stride,
                            padding=padding, dilation=dilation, activation=activation, isa=isa,
                            **extra)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    shuffle = extra.get("channel_shuffle", 1)
    seen = x.reshape(n, shuffle, c // shuffle, h, w).transpose(0, 2, 1, 3, 4).reshape(x.shape)
    geom = geometry(conv, x.shape)
    spec = conv.spec_for(x.shape)
    shape = (n,) + spec.output_shape[1:]
    lanes = block_size(dtype, isa)
    assert lanes == cso.host_machine(isa).vector_bytes // np.dtype(dtype).itemsize
    for in_layout, out_layout in PAIRS:
        xl = as_layout(x, in_layout, lanes)   # (other blocks: test_a_blocked_of_any_block)
        kwargs = {} if in_layout == "blocked" else {"layout": in_layout}
        if out_layout != in_layout:
            kwargs["out_layout"] = out_layout
        what = f"{in_layout} -> {out_layout}"
        y = conv(xl, **kwargs)
        assert_matches(logical(y, out_layout, shape, dtype, lanes), seen, wt, b, activation,
                       geom, what=what)
        out = empty_out(out_layout, shape, dtype, lanes)
        assert conv(xl, out=out, **kwargs) is out, what
        got = logical(out, out_layout, shape, dtype, lanes)
        np.testing.assert_array_equal(got, logical(y, out_layout, shape, dtype, lanes), what)
        if in_layout == "blocked":   # the input is left as it was
            np.testing.assert_array_equal(xl.to_nchw(), x)
    # blocked plans where they fit (depthwise ones of a filter per channel included); the
    # others (groups off the blocks, a channel multiplier, a shuffle) on the NCHW plan
    assert used_blocked_plan(conv) == (csa.layout.blocked_fits(spec, lanes) and shuffle == 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_lanes_of_the_input_are_never_read_into_a_result(rng, dtype):
    """A Blocked input's padding lanes may hold anything: huge values and NaN in them change
    no result, read in place (no padding) or through a slab (padded)."""
    for padding in (0, 1):
        conv, w, b = make_conv(rng, dtype, 5, 13, 3, 3, padding=padding)
        x = rng.standard_normal((2, 5, 9, 11)).astype(dtype)
        expected = conv(Blocked.from_nchw(x)).data
        for junk in (1e30, -np.inf, np.nan):
            xb = Blocked.from_nchw(x)
            xb.data[:, -1, :, :, 5:] = junk
            np.testing.assert_array_equal(conv(xb).data, expected, f"padding {padding}, {junk}")


# 2. chains and residuals ----------------------------------------------------------------------

def chain(rng, dtype, isa=None):
    """Convolutions whose outputs feed the next: padding lanes that are not zero (sigmoid(0)),
    an in-place 1x1 at stride 2, grouped on blocks, a depthwise one (NCHW plan in between),
    a dilated 'same' one."""
    specs = [(5, 13, 3, 3, 1, dict(padding=1, activation="sigmoid")),
             (13, 32, 1, 1, 1, dict(stride=2, activation="relu")),
             (32, 32, 3, 3, 2, dict(padding=1)),
             (32, 32, 3, 3, 32, dict(padding=1, activation="relu")),
             (32, 33, 3, 3, 1, dict(padding="same", dilation=2, activation="silu"))]
    return [make_conv(rng, dtype, c, k, r, s, g, isa=isa, **kw)[0]
            for c, k, r, s, g, kw in specs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["blocked", "nhwc"])
@pytest.mark.parametrize("isa", ISAS, ids=lambda isa: isa or HOST_ISA)
def test_chain_without_conversions_equals_the_nchw_chain(rng, dtype, layout, isa):
    convs = chain(rng, dtype, isa)
    x = rng.standard_normal((2, 5, 13, 12)).astype(dtype)
    expected = x
    for conv in convs:
        expected = conv(expected)
    y = as_layout(x, layout, block_size(dtype, isa))
    for conv in convs:
        y = conv(y) if layout == "blocked" else conv(y, layout="nhwc")
        assert isinstance(y, Blocked if layout == "blocked" else np.ndarray)
        if layout == "blocked":
            assert np.isfinite(y.data).all()
    got = y.to_nchw() if layout == "blocked" else y.transpose(0, 3, 1, 2)
    assert got.shape == expected.shape
    scale = np.abs(expected).max()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_layout,out_layout", PAIRS)
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_accumulate_adds_into_out_in_every_layout(rng, dtype, in_layout, out_layout, groups):
    """accumulate=True: out = relu(out + conv(x) + bias) whatever the layouts, on a blocked
    plan (groups 1 with a padded last block, groups 2 on blocks) or the NCHW one (groups 3)."""
    c, k = {1: (7, 13), 2: (32, 32), 3: (12, 18)}[groups]
    conv, w, b = make_conv(rng, dtype, c, k, 3, 3, groups, padding=1, activation="relu",
                           accumulate=True)
    x = rng.standard_normal((2, c, 6, 7)).astype(dtype)
    residual = rng.standard_normal((2, k, 6, 7)).astype(dtype)
    lanes = block_size(dtype)
    out = as_layout(residual.copy(), out_layout, lanes)
    kwargs = {} if in_layout == "blocked" else {"layout": in_layout}
    assert conv(as_layout(x, in_layout), out=out, out_layout=out_layout, **kwargs) is out
    got = logical(out, out_layout, residual.shape, dtype, lanes)
    assert_matches(got, x, w, b, "relu", geometry(conv, x.shape), residual=residual)
    fits = groups != 3 or csa.layout.blocked_fits(conv.spec_for(x.shape), lanes)
    # (NCHW in and out: the NCHW plan, unless a group is one block of a small plane)
    nchw_plan = conv._prepared(x.shape, np.dtype(dtype), cso.get_num_threads()).plan
    on_blocks = (in_layout, out_layout) != ("nchw", "nchw") or conv._grouped_on_blocks(nchw_plan)
    assert used_blocked_plan(conv) == (fits and on_blocks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_block_on_blocked_values(rng, dtype):
    """A ResNet basic block kept blocked: y = relu(x + conv2(conv1(x))), the residual added
    by conv2's store into a Blocked copy of x."""
    conv1, w1, b1 = make_conv(rng, dtype, 13, 13, 3, 3, padding=1, activation="relu")
    conv2, w2, b2 = make_conv(rng, dtype, 13, 13, 3, 3, padding=1, activation="relu",
                              accumulate=True)
    x = rng.standard_normal((1, 13, 8, 9)).astype(dtype)
    xb = Blocked.from_nchw(x)
    out = Blocked.from_nchw(x)
    assert conv2(conv1(xb), out=out) is out
    expected = x.copy()
    conv2(conv1(x), out=expected)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.to_nchw(), expected, rtol=tol, atol=tol)
    assert np.isfinite(out.data).all()


# 3. threads -----------------------------------------------------------------------------------

# name: (N, C, H, W, K, R, S, stride, padding, groups, plan overrides)
THREAD_CASES = {
    "filters_split": (1, 16, 6, 7, 70, 3, 3, 1, 1, 1, {"split": (1, 2)}),
    "rows_split": (1, 8, 23, 9, 16, 3, 3, 1, 1, 1, {"split": (3, 1)}),
    "both_split_s2_batch": (2, 13, 11, 10, 80, 3, 3, 2, 1, 1, {"split": (2, 2)}),
    "in_place_1x1": (2, 24, 9, 10, 66, 1, 1, 1, 0, 1, {"split": (2, 2)}),
    "merged_rows_1x1": (2, 24, 14, 14, 40, 1, 1, 1, 0, 1, {"split": (3, 1)}),
    "own_split": (2, 32, 28, 28, 48, 3, 3, 1, 1, 1, {}),
    "channel_tiles_bands_split": (1, 40, 13, 11, 70, 3, 3, 1, 1, 1,
                                  {"nc": BLOCK, "band": 2, "split": (2, 2)}),
    "groups_on_blocks": (1, 32, 12, 11, 128, 3, 3, 1, 1, 2, {"split": (2, 2)}),
    "depthwise": (2, 24, 13, 11, 24, 3, 3, 1, 1, 24, {"split": (3, 1)}),
    "depthwise_own_split": (2, 64, 28, 28, 64, 3, 3, 1, 1, 64, {}),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(THREAD_CASES))
def test_blocked_results_are_bit_identical_across_threads_and_splits(rng, restore_threads,
                                                                     name, dtype):
    n, c, h, w, k, r, s, stride, padding, groups, overrides = THREAD_CASES[name]
    overrides = for_lanes(overrides, block_size(dtype))
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c // groups, r, s)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    kwargs = dict(stride=stride, padding=padding, groups=groups, activation="relu")
    cso.set_num_threads(1)
    unsplit = {key: value for key, value in overrides.items() if key != "split"}
    plain = cso.Conv2d(wt, b, plan_overrides=unsplit, **kwargs)
    one = plain(Blocked.from_nchw(x))
    one_nhwc = plain(as_layout(x, "nhwc"), layout="nhwc")
    assert_matches(one.to_nchw(), x, wt, b, "relu", geometry(plain, x.shape))
    conv = cso.Conv2d(wt, b, plan_overrides=overrides, **kwargs)
    spec = conv.spec_for(x.shape)
    for threads in (1, 2, 3):
        cso.set_num_threads(threads)
        plan = csa.analyze(spec, cso.host_machine(), threads=threads, layout="blocked",
                           **overrides)
        assert plan.layout == "blocked"
        if "split" in overrides:   # split over rows (windows), filters or both, as forced
            assert plan.split == overrides["split"], plan.split
        elif threads > 1:
            assert plan.split != (1, 1), plan.split
        for model in (conv, plain):
            got = model(Blocked.from_nchw(x))
            assert np.array_equal(got.data, one.data), (threads, plan.split)
            got = model(as_layout(x, "nhwc"), layout="nhwc")
            assert np.array_equal(got, one_nhwc), (threads, plan.split)
            got = model(Blocked.from_nchw(x), out_layout="nchw")   # (from each band)
            assert np.array_equal(got, one.to_nchw()), (threads, plan.split)
    assert used_blocked_plan(conv)


# name: (C, H, W, K, R, S, stride, padding, dilation): padded slabs, output rows of two tiles
# (short ones among them) at strides 1 and 2, dilated taps, a subsampled 1x1
SLAB_PART_CASES = {
    "3x3_s1": (16, 17, 23, 24, 3, 3, 1, 1, 1),
    "3x3_s2_short_tiles": (16, 23, 29, 20, 3, 3, 2, 1, 1),
    "3x3_s2_asymmetric": (20, 22, 31, 17, 3, 3, 2, ((0, 1), (0, 1)), 1),
    "5x5_dilated": (8, 19, 21, 16, 5, 5, 1, 4, 2),
    "1x1_s2": (24, 21, 27, 19, 1, 1, 2, 0, 1),
}


@pytest.mark.parametrize("in_layout", ["blocked", "nhwc", "nchw"])
@pytest.mark.parametrize("name", sorted(SLAB_PART_CASES))
def test_blocked_parts_fill_the_slab_rows_their_tiles_read(rng, restore_threads, name,
                                                           in_layout):
    """A blocked plan whose parts split its band: each part fills the slab rows its own
    tiles read, no more (a part had filled every row to the plane's end: six parts of a
    14 x 14 output copied the input 3.4 times), and none fewer: run one after the other on
    one thread, a part that read a row it had not filled would find the previous part's rows
    there, or NaN from an earlier call, and its bits would differ from one part's."""
    c, h, w, k, r, s, stride, padding, dilation = SLAB_PART_CASES[name]
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, r, s)) / np.sqrt(c * r * s)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation)
    cso.set_num_threads(1)

    def run(conv, values):
        got = conv(as_layout(values, in_layout), out_layout="blocked",
                   **({"layout": "nhwc"} if in_layout == "nhwc" else {}))
        return got.to_nchw()

    one = run(cso.Conv2d(wt, b, plan_overrides={"split": (1, 1)}, **kwargs), x)
    assert_matches(one, x, wt, b, None, geometry(cso.Conv2d(wt, b, **kwargs), x.shape))
    for parts in (2, 5, 11):
        conv = cso.Conv2d(wt, b, plan_overrides={"split": (parts, 1)}, **kwargs)
        run(conv, np.full_like(x, np.nan))   # (the workspace's slab rows NaN)
        got = run(conv, x)
        plan = csa.analyze(conv.spec_for(x.shape), cso.host_machine(), layout="blocked",
                           split=(parts, 1))
        assert plan.parts[0] == parts and plan.band >= plan.window_tiles, plan
        np.testing.assert_array_equal(got, one, err_msg=f"{parts} parts")
        assert used_blocked_plan(conv)


# 4. guard pages -------------------------------------------------------------------------------

# name: (N, C, H, W, K, R, S, stride, padding, dilation, groups): output rows no multiple of
# the window tile, filters no multiple of 16, padded (slab) and in-place reads
GUARD_CASES = {
    "padded_3x3_edges": (2, 13, 9, 11, 19, 3, 3, 1, 1, 1, 1),
    "in_place_1x1": (1, 21, 5, 13, 37, 1, 1, 1, 0, 1, 1),
    "in_place_3x3_s2": (1, 9, 11, 13, 17, 3, 3, 2, 0, 1, 1),
    "same_dilated_asymmetric": (1, 6, 10, 9, 10, 3, 3, 1, ((0, 2), (2, 1)), (2, 1), 1),
    "stem_7x7_s2": (1, 3, 15, 17, 9, 7, 7, 2, 3, 1, 1),
    "single_filter": (1, 5, 6, 7, 1, 3, 3, 1, 1, 1, 1),
    "groups_on_blocks": (1, 32, 7, 9, 32, 3, 3, 1, 1, 1, 2),
    # a group's channels of channels-last pixels moved into the slab's blocks, or read in place
    "groups_of_48_s2_dilated": (2, 96, 11, 10, 32, 3, 3, 2, 2, 2, 2),
    "groups_in_place": (1, 64, 7, 9, 64, 3, 3, 1, 0, 1, 4),
    # channel tiles of channels-last pixels ending inside a block of the slab
    "channel_tiles_odd_padded": (2, 21, 7, 9, 19, 3, 3, 1, 1, 1, 1, {"nc": 16}),
    "channel_tiles_and_bands": (2, 40, 13, 11, 19, 3, 3, 1, 1, 1, 1, {"nc": BLOCK, "band": 2}),
    "merged_rows_1x1_7x7": (2, 13, 7, 7, 19, 1, 1, 1, 0, 1, 1),
    "merged_rows_1x1_14x14": (1, 9, 14, 14, 21, 1, 1, 1, 0, 1, 1),
    "depthwise_padded": (2, 13, 9, 11, 13, 3, 3, 1, 1, 1, 13),
    "depthwise_in_place_s2": (1, 16, 11, 13, 16, 3, 3, 2, 0, 1, 16),
    "depthwise_5x5_same_bands": (1, 20, 15, 9, 20, 5, 5, 1, "same", 1, 20, {"band": 2}),
    # read in place in bands (rows no window reads past them), into channels last
    "depthwise_in_place_bands": (1, 16, 12, 9, 16, 3, 3, 2, 0, 1, 16, {"band": 1}),
    # NCHW planes and channels-last pixels moved into a partial last block, and back
    "depthwise_7x7_s2_partial_block": (2, 19, 15, 13, 19, 7, 7, 2, 3, 1, 19),
    "depthwise_1x1_s2_partial_block": (1, 19, 13, 11, 19, 1, 1, 2, 0, 1, 19),
    "in_place_channel_tiles": (1, 40, 6, 13, 21, 1, 1, 1, 0, 1, 1, {"nc": BLOCK, "band": 1}),
    # channels last read in place, a channel tile from its first channel in each pixel
    "in_place_channel_tiles_odd": (2, 37, 5, 7, 19, 1, 1, 1, 0, 1, 1, {"nc": BLOCK}),
}
# (into NCHW: each band's output transposed from the ``out_t`` workspace into the planes)
GUARD_LAYOUTS = [("blocked", "blocked"), ("nhwc", "nhwc"), ("nchw", "blocked"),
                 ("blocked", "nhwc"), ("blocked", "nchw"), ("nhwc", "nchw")]


def guard_params():
    for name in sorted(GUARD_CASES):
        for dtype in DTYPES:
            for threads in (1, 2) if dtype == np.float32 else (1,):
                yield pytest.param(name, dtype, threads,
                                   id=f"{name}-{np.dtype(dtype).name}-{threads}t")


@pytest.mark.parametrize("name,dtype,threads", list(guard_params()))
def test_no_access_outside_blocked_arrays(rng, restore_threads, name, dtype, threads):
    n, c, h, w, k, r, s, stride, padding, dilation, groups, *overrides = GUARD_CASES[name]
    cso.set_num_threads(threads)
    conv, wt, b = make_conv(rng, dtype, c, k, r, s, groups, stride=stride, padding=padding,
                            dilation=dilation, activation="relu",
                            plan_overrides=overrides[0] if overrides else None)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    lanes = block_size(dtype)
    shape = (n,) + conv.spec_for(x.shape).output_shape[1:]
    expected = {}
    for pair in GUARD_LAYOUTS:   # compiled here, in the parent: the children only run
        in_layout, out_layout = pair
        kwargs = {} if in_layout == "blocked" else {"layout": in_layout}
        y = conv(as_layout(x, in_layout), out_layout=out_layout, **kwargs)
        expected[pair] = y.data if out_layout == "blocked" else y
        assert_matches(logical(y, out_layout, shape, dtype, lanes), x, wt, b, "relu",
                       geometry(conv, x.shape))
    assert used_blocked_plan(conv)

    def guarded_run(at):
        faulthandler.disable()   # (a fault fails the case: no dump from the child)
        cso.jobs.new_workspace = lambda elements, dt: guarded_empty((elements,), dt, at)
        cso.jobs.REUSED_WORKSPACE_BYTES = 0   # (none kept: each new, guarded)
        conv.bias = guarded_copy(conv.bias, at)
        if conv._padded_bias is not None:
            conv._padded_bias = guarded_copy(conv._padded_bias, at)
        conv._packed = {nf: guarded_copy(p, at) for nf, p in conv._packed.items()}
        conv._routes.clear()   # (they hold the filters and bias they read: taken again)
        for (in_layout, out_layout), want in expected.items():
            if in_layout == "blocked":
                xb = Blocked.from_nchw(x)
                xg, kwargs = Blocked(guarded_copy(xb.data, at), c), {}
            else:
                xg, kwargs = guarded_copy(as_layout(x, in_layout), at), {"layout": in_layout}
            out = (Blocked(guarded_empty(want.shape, dtype, at), k) if out_layout == "blocked"
                   else guarded_empty(want.shape, dtype, at))
            assert conv(xg, out=out, out_layout=out_layout, **kwargs) is out
            got = out.data if out_layout == "blocked" else out
            np.testing.assert_array_equal(got, want, f"{in_layout} -> {out_layout}")

    for at in ("end", "start"):
        failure = in_child(lambda: guarded_run(at))
        assert failure is None, f"arrays flush at their {at}: {failure}"


# 5. pickling, foreign blocks, NHWC views ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_blocked_pickles_and_the_copy_convolves_the_same(rng, dtype):
    conv, w, b = make_conv(rng, dtype, 5, 13, 3, 3, padding=1, activation="sigmoid")
    x = rng.standard_normal((2, 5, 6, 7)).astype(dtype)
    for value in (Blocked.from_nchw(x), Blocked.from_nchw(x, 3), conv(Blocked.from_nchw(x))):
        copy = pickle.loads(pickle.dumps(value))
        assert isinstance(copy, Blocked) and copy.data is not value.data
        assert (copy.shape, copy.block, copy.dtype, copy.channels) == (
            value.shape, value.block, value.dtype, value.channels)
        assert copy.data.flags.c_contiguous
        np.testing.assert_array_equal(copy.data, value.data)
    copy = pickle.loads(pickle.dumps(Blocked.from_nchw(x)))
    np.testing.assert_array_equal(conv(copy).data, conv(Blocked.from_nchw(x)).data)


def numpy_blocks(x, block):
    """The blocked array of NCHW ``x`` by NumPy alone: channels padded with zeros to whole
    blocks, each pixel's block its last axis."""
    n, c, h, w = x.shape
    padded = np.zeros((n, -(-c // block) * block, h, w), x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, -1, block, h, w).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8, 1, 1), (2, 13, 5, 7), (1, 3, 2, 9), (3, 40, 11, 6),
                                   (1, 17, 23, 1), (2, 9, 13, 11)])
def test_compiled_reorders_match_numpy(restore_threads, dtype, shape):
    """``cso.reorder`` (NCHW and channels last to blocks of the lanes and back, behind
    ``Blocked``'s conversions and ``unblock_into``, and NCHW to channels last and back):
    partial blocks, runs of pixels no multiple of the lanes or of a unit's, 1 and 2 threads,
    against NumPy's transposes; padding lanes zero; nothing read or written past the arrays
    (guard pages)."""
    from cso import reorder
    from cso.layouts import unblock_into
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    lanes = block_size(dtype)
    assert reorder.reorder_lanes(dtype) == lanes
    want = numpy_blocks(x, lanes)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    for threads in (1, 2):
        cso.set_num_threads(threads)
        blocked = np.full(want.shape, np.nan, dtype)
        np.testing.assert_array_equal(reorder.to_blocks(x, blocked), want)
        blocked = np.full(want.shape, np.nan, dtype)
        np.testing.assert_array_equal(reorder.nhwc_to_blocks(nhwc, blocked), want)
        np.testing.assert_array_equal(unblock_into(want, np.full(shape, np.nan, dtype)), x)
        np.testing.assert_array_equal(reorder.to_nhwc(want, np.full(nhwc.shape, np.nan, dtype)),
                                      nhwc)
        np.testing.assert_array_equal(Blocked.from_nchw(x).data, want)
        np.testing.assert_array_equal(Blocked.from_nhwc(nhwc).reblocked(lanes).data, want)
        np.testing.assert_array_equal(Blocked(want, shape[1]).to_nhwc(), nhwc)
        np.testing.assert_array_equal(
            reorder.nchw_to_nhwc(x, np.full(nhwc.shape, np.nan, dtype)), nhwc)
        np.testing.assert_array_equal(reorder.nhwc_to_nchw(nhwc, np.full(shape, np.nan, dtype)),
                                      x)
        np.testing.assert_array_equal(Blocked.from_nhwc(nhwc).to_nchw(), x)

    def guarded_reorders(at):
        faulthandler.disable()   # (a fault fails the case: no dump from the child)
        got = reorder.nchw_to_nhwc(guarded_copy(x, at), guarded_empty(nhwc.shape, dtype, at))
        np.testing.assert_array_equal(got, nhwc)
        got = reorder.nhwc_to_nchw(guarded_copy(nhwc, at), guarded_empty(shape, dtype, at))
        np.testing.assert_array_equal(got, x)

    for at in ("end", "start"):
        failure = in_child(lambda: guarded_reorders(at))
        assert failure is None, f"arrays flush at their {at}: {failure}"
    with pytest.raises(ValueError, match="unblock_into takes C-contiguous blocks of"):
        unblock_into(numpy_blocks(x, lanes * 2), np.empty(shape, dtype))
    with pytest.raises(ValueError, match="unblock_into takes C-contiguous blocks of"):
        unblock_into(want, np.empty(shape + (2,), dtype)[..., 0])   # a strided out


def test_blocked_round_trips_and_views():
    x = np.arange(2 * 5 * 3 * 4, dtype=np.float32).reshape(2, 5, 3, 4)
    for block in (1, 2, 3, 4, 5, 8, 16):
        xb = Blocked.from_nchw(x, block)
        assert xb.shape == x.shape and xb.block == block and xb.channels == 5
        assert xb.data.shape == (2, -(-5 // block), 3, 4, block)
        padding = xb.data.shape[1] * block - 5
        if padding:
            np.testing.assert_array_equal(xb.data[:, -1, ..., -padding:], 0)
        np.testing.assert_array_equal(xb.to_nchw(), x)
        np.testing.assert_array_equal(xb.to_nhwc(), x.transpose(0, 2, 3, 1))
        assert xb.reblocked(block) is xb
        np.testing.assert_array_equal(xb.reblocked(4).to_nchw(), x)
        assert xb.reblocked(4).block == 4
    # channel c of pixel (h, w) is lane c % B of block c // B
    xb = Blocked.from_nchw(x, 2)
    assert xb.data[1, 2, 0, 3, 0] == x[1, 4, 0, 3] and xb.data[0, 1, 2, 1, 1] == x[0, 3, 2, 1]
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    view = Blocked.from_nhwc(nhwc)
    assert np.shares_memory(view.data, nhwc) and view.block == 5 and view.shape == x.shape
    assert np.shares_memory(view.to_nhwc(), nhwc)
    np.testing.assert_array_equal(view.to_nchw(), x)


# name: (C, K, groups, padding, plan overrides): one channel tile, several of a block and of 16
# channels (whole blocks of the lanes here), groups on blocks of 16 channels, in place
FOREIGN_CASES = {
    "c5_padded": (5, 13, 1, 1, {}),
    "c13_padded": (13, 13, 1, 1, {}),
    "c40_one_tile_padded": (40, 19, 1, 1, {}),
    "c40_tiles_of_a_block_padded": (40, 19, 1, 1, {"nc": BLOCK}),
    "c40_tiles_of_16_padded": (40, 19, 1, 1, {"nc": 16}),
    "c40_in_place": (40, 19, 1, 0, {}),
    "groups2_padded": (32, 32, 2, 1, {}),
}
FOREIGN_BLOCKS = (1, 2, 3, 4, 5, 8, 16, 32)


def foreign_params():
    for name in FOREIGN_CASES:
        for dtype in DTYPES:
            for isa in ISAS:
                for block in FOREIGN_BLOCKS:
                    yield pytest.param(
                        name, dtype, isa, block,
                        id=f"{name}-{np.dtype(dtype).name}-{isa or HOST_ISA}-block{block}",
                        )


@pytest.mark.parametrize("name,dtype,isa,block", list(foreign_params()))
def test_a_blocked_of_any_block_is_read_correctly(rng, name, dtype, isa, block):
    """Blocks the kernels read as they are (their lanes, 1, blocks every channel tile starts
    on) and blocks they cannot (re-blocked first), e.g. a Blocked of 16 channels a block from
    an AVX-512 machine on an AVX2 one, or an AVX2 layer's output fed to a generic-ISA layer:
    the result equals that on the kernels' own block, bit for bit. In a child, the input data
    and the workspaces flush against guard pages."""
    c, k, groups, padding, overrides = FOREIGN_CASES[name]
    conv, w, b = make_conv(rng, dtype, c, k, 3, 3, groups, padding=padding, isa=isa,
                           plan_overrides=overrides)
    x = rng.standard_normal((2, c, 5, 6)).astype(dtype)
    lanes = block_size(dtype, isa)
    expected = conv(Blocked.from_nchw(x, lanes))
    assert_matches(expected.to_nchw(), x, w, b, None, geometry(conv, x.shape))
    assert used_blocked_plan(conv)
    xb = Blocked.from_nchw(x, block)
    np.testing.assert_array_equal(xb.to_nchw(), x)

    def run():
        cso.jobs.new_workspace = lambda elements, dt: guarded_empty((elements,), dt)
        cso.jobs.REUSED_WORKSPACE_BYTES = 0   # (none kept: each new, guarded)
        given = Blocked(guarded_copy(xb.data), c)
        y = conv(given)
        assert y.block == lanes and y.shape == expected.shape
        np.testing.assert_array_equal(y.data, expected.data)
        np.testing.assert_array_equal(conv(given, out_layout="nhwc"), expected.to_nhwc())
        assert given.block == block   # not re-blocked in place
        np.testing.assert_array_equal(given.to_nchw(), x)

    failure = in_child(run)
    assert failure is None, f"block {block} on lanes {lanes}: {failure}"


@pytest.mark.parametrize("n,c,k,r,padding", [(1, 24, 96, 1, 0), (3, 40, 10, 3, 1),
                                             (1, 256, 1024, 1, 0)])
def test_one_pixel_channels_last_calls_are_the_nchw_calls(rng, restore_threads, n, c, k, r,
                                                          padding):
    """A channels-last pixel is its NCHW array byte for byte: such calls (a squeeze and
    excitation's 1x1s; a padded 3x3 on one pixel; 1 MiB of filters, in two parts at 2
    threads) run as the NCHW calls, bit for bit, the repeated ones too, on no blocked route,
    and match the reference."""
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv, w, b = make_conv(rng, np.float32, c, k, r, r, padding=padding,
                               activation="relu")
        x = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
        want = conv(x)
        assert_matches(want, x, w, b, "relu", geometry(conv, x.shape))
        xn = x.reshape(n, 1, 1, c)
        for _ in range(2):
            got = conv(xn, layout="nhwc")
            assert got.shape == (n, 1, 1, k) and got.flags.c_contiguous
            np.testing.assert_array_equal(got.reshape(want.shape), want)
        assert (xn.shape, xn.dtype, threads, "nhwc") in conv._plain and not conv._routes
        out = np.full((n, 1, 1, k), np.nan, np.float32)   # (out=: the checked route)
        assert conv(xn, out=out, layout="nhwc") is out
        np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,c,k,groups", [(1, 12, 20, 4), (2, 48, 80, 16), (2, 12, 20, 4),
                                          (1, 21, 35, 7), (1, 24, 96, 1), (1, 256, 1024, 1)])
def test_one_pixel_blocked_calls_are_the_nchw_calls(rng, restore_threads, n, c, k, groups):
    """A Blocked pixel (one image, or blocks without padding) runs as the NCHW call on its
    data, bit for bit, the repeated calls too, whether a blocked plan would take the
    convolution or not (groups of 3 channels fit no block; 1 MiB of filters: two parts at 2
    threads); the output's padding channels are zeros. Two images with padded blocks take
    the blocked route and match as well."""
    for threads in (1, 2):
        cso.set_num_threads(threads)
        conv, w, b = make_conv(rng, np.float32, c, k, 1, 1, groups=groups, activation="relu")
        x = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
        want = conv(x)
        assert_matches(want, x, w, b, "relu", geometry(conv, x.shape))
        xb = Blocked.from_nchw(x)
        direct = n == 1 or c % xb.block == 0
        for _ in range(2):
            got = conv(xb)
            assert got.channels == k and got.block == block_size(np.float32)
            if direct:
                np.testing.assert_array_equal(got.to_nchw(), want)
                assert not got.data.reshape(n, -1)[:, k:].any()
            else:
                np.testing.assert_allclose(got.to_nchw(), want, rtol=1e-5, atol=1e-5)
        plain = conv._plain.get((xb.data.shape, xb.dtype, threads, c))
        assert (plain is not None and "_one_pixel_blocked" in plain.__qualname__) == direct


def test_a_one_pixel_blocked_call_runs_the_nchw_plan_where_it_has_the_threads(
        rng, restore_threads):
    """640 -> 2560 in 2 groups on one pixel: at 2 threads the blocked plan splits its 3 MiB
    of filters (with AVX2 or AVX-512 kernels: the others' records want more work), and so
    does the NCHW plan (its one window cannot be split), so the Blocked call runs as the
    NCHW call on its data; where the NCHW plan runs on fewer threads, the blocked plan."""
    cso.set_num_threads(2)
    conv, w, b = make_conv(rng, np.float32, 640, 2560, 1, 1, groups=2)
    x = rng.standard_normal((1, 640, 1, 1)).astype(np.float32)
    xb = Blocked.from_nchw(x)
    for _ in range(2):
        np.testing.assert_allclose(conv(xb).to_nchw(), conv(x), rtol=1e-4, atol=1e-4)
    (route,) = conv._routes.values()
    nchw = conv._prepared(x.shape, x.dtype, 2).plan
    if HOST_ISA in ("avx2", "avx512"):
        assert nchw.split == (1, 2) and route.prepared.plan.threads == 2
    plain = conv._plain[(xb.data.shape, xb.dtype, 2, 640)]
    assert ("_one_pixel_blocked" in plain.__qualname__) == (
        nchw.threads >= route.prepared.plan.threads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nhwc_in_and_out_are_zero_copy(rng, dtype):
    conv, w, b = make_conv(rng, dtype, 6, 13, 3, 3, padding=1)
    x = rng.standard_normal((2, 6, 5, 7)).astype(dtype)
    nhwc = as_layout(x, "nhwc")
    view = Blocked.from_nhwc(nhwc)
    assert np.shares_memory(view.data, nhwc)
    out = np.empty((2, 5, 7, 13), dtype)
    assert conv(nhwc, out=out, layout="nhwc") is out
    assert_matches(out.transpose(0, 3, 1, 2), x, w, b, None, geometry(conv, x.shape))
    assert conv(view, out_layout="nhwc").shape == (2, 5, 7, 13)
    np.testing.assert_array_equal(conv(view, out_layout="nhwc"), out)
    # a Blocked output of one block of all K channels (the NHWC one, viewed) is written too
    np.testing.assert_array_equal(Blocked.from_nhwc(out).to_nchw(), conv(x))


@pytest.mark.parametrize("case", ["dense", "merged_1x1", "depthwise", "grouped",
                                  "strided_grouped_1x1"])
def test_repeated_blocked_and_nhwc_calls_run_what_the_first_chose(rng, case):
    """A Blocked or channels-last call on a shape called before in that layout (no ``out``,
    no ``out_layout``) runs what the first call chose (``Conv2d._plain``): a new output of
    the same layout and the same values each time, matching the reference. A Blocked of the
    same blocks but fewer channels, and an NCHW array of the NHWC shape, are calls of their
    own."""
    c, k, r, groups, hw, stride = {
        "dense": (13, 21, 3, 1, (6, 7), 1), "merged_1x1": (16, 24, 1, 1, (4, 6), 1),
        "depthwise": (24, 24, 3, 24, (5, 9), 1), "grouped": (32, 64, 3, 2, (6, 6), 1),
        "strided_grouped_1x1": (32, 64, 1, 2, (7, 6), 2)}[case]
    conv, w, b = make_conv(rng, np.float32, c, k, r, r, groups=groups, padding=r // 2,
                           stride=stride)
    x = rng.standard_normal((2, c) + hw).astype(np.float32)
    out_hw = conv(x).shape[2:]
    geom = geometry(conv, x.shape)
    for layout in ("blocked", "nhwc"):
        value = as_layout(x, layout)
        kwargs = {"layout": "nhwc"} if layout == "nhwc" else {}
        first = conv(value, **kwargs)
        second = conv(value, **kwargs)
        assert type(second) is type(first) and second is not first
        data = (first.data, second.data) if layout == "blocked" else (first, second)
        assert not np.shares_memory(*data)
        np.testing.assert_array_equal(*data)
        as_nchw = second.to_nchw() if layout == "blocked" else second.transpose(0, 3, 1, 2)
        assert_matches(as_nchw, x, w, b, None, geom)
        if layout == "blocked":
            assert second.shape == (2, k) + out_hw and second.block == value.block
    # the blocked call's and the NHWC one's, and the NCHW one's (a strided grouped 1x1's
    # channels last re-blocks its input: a reblock the plain call repeats)
    assert len(conv._plain) == 3
    routes = {key[1]: route.reblock for key, route in conv._routes.items()}
    assert routes == {"blocked": False, "nhwc": case == "strided_grouped_1x1"}
    # the same blocks holding a channel fewer: the checked call, which refuses them
    fewer = Blocked.from_nchw(x[:, :-1], block_size(np.float32))
    if fewer.data.shape == as_layout(x, "blocked").data.shape:
        with pytest.raises(ValueError, match="channels"):
            conv(fewer)
    # an NCHW array whose shape is the NHWC one's: not the NHWC call
    square = rng.standard_normal((1, c, c, c)).astype(np.float32)
    np.testing.assert_array_equal(conv(np.ascontiguousarray(square), layout="nhwc"),
                                  conv(np.ascontiguousarray(square), layout="nhwc"))
    assert_matches(conv(square), square, w, b, None, geometry(conv, square.shape))


# 6. errors ------------------------------------------------------------------------------------

def test_layout_argument_errors(rng):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = rng.standard_normal((1, 5, 6, 7)).astype(np.float32)
    xb = Blocked.from_nchw(x)
    with pytest.raises(ValueError, match=r"layout='nchw' describes an array input.*Blocked"):
        conv(xb, layout="nchw")
    with pytest.raises(ValueError, match=r"layout='nhwc' describes an array input"):
        conv(xb, layout="nhwc")
    for bad in ("NCHW", "blocked", "nchwc", 1):
        with pytest.raises(ValueError, match=r"layout must be 'nchw' or 'nhwc'"):
            conv(x, layout=bad)
    for bad in ("NHWC", "nchwc", "", 0):
        with pytest.raises(ValueError, match=r"out_layout must be one of"):
            conv(x, out_layout=bad)
        with pytest.raises(ValueError, match=r"out_layout must be one of"):
            conv(xb, out_layout=bad)
    with pytest.raises(ValueError, match=r"input must be 4-D \(NCHW\) for out_layout "
                                         r"'blocked', got shape \(5, 6, 7\)"):
        conv(x[0], out_layout="blocked")
    with pytest.raises(TypeError, match=r"input must be a numpy.ndarray, got list"):
        conv([[1.0]], out_layout="nhwc")


def test_out_errors(rng):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = rng.standard_normal((1, 5, 6, 7)).astype(np.float32)
    xb = Blocked.from_nchw(x)
    lanes = block_size(np.float32)
    shape = (1, 13, 6, 7)
    bad_blocked = [Blocked.empty((1, 13, 6, 8), np.float32, lanes),      # shape
                   Blocked.empty((1, 12, 6, 7), np.float32, lanes),      # channels
                   Blocked.empty(shape, np.float32, 2 * lanes),          # block
                   Blocked.empty(shape, np.float32, 1),
                   Blocked.empty(shape, np.float64, lanes),              # dtype
                   np.empty((1, 2, 6, 7, lanes), np.float32),            # not a Blocked
                   np.empty(shape, np.float32)]
    for out in bad_blocked:
        for value in (xb, x):
            with pytest.raises(ValueError, match=r"out must be a writeable cso.Blocked of shape "
                                                 rf"\(1, 13, 6, 7\), block {lanes}"):
                conv(value, out=out, out_layout="blocked")
    with pytest.raises(ValueError, match=r"out must be a writeable cso.Blocked"):
        conv(xb, out=np.empty((1, 2, 6, 7, lanes), np.float32))   # (out_layout: the input's)
    with pytest.raises(ValueError, match=r"out must have shape \(1, 6, 7, 13\) \(NHWC\)"):
        conv(xb, out=np.empty(shape, np.float32), out_layout="nhwc")
    with pytest.raises(ValueError, match=r"out must have shape \(1, 13, 6, 7\) \(NCHW\) and "
                                         r"dtype float32, got \(1, 13, 6, 7\) float64"):
        conv(xb, out=np.empty(shape), out_layout="nchw")
    with pytest.raises(TypeError, match=r"out must be a numpy.ndarray, got Blocked"):
        conv(xb, out=Blocked.empty(shape, np.float32, lanes), out_layout="nhwc")
    strided = np.empty((1, 6, 7, 26), np.float32)[..., ::2]
    with pytest.raises(ValueError, match=r"out \(NHWC\) must be a C-contiguous"):
        conv(xb, out=strided, out_layout="nhwc")
    fortran = np.asfortranarray(np.empty((1, 6, 7, 13), np.float32))
    with pytest.raises(ValueError, match=r"out \(NHWC\) must be a C-contiguous"):
        conv(x, out=fortran, out_layout="nhwc")
    readonly = np.empty((1, 6, 7, 13), np.float32)
    readonly.flags.writeable = False
    for layout in ("nhwc", "nchw"):
        with pytest.raises(ValueError, match=r"out must be writeable"):
            conv(xb, out=readonly if layout == "nhwc" else readonly.transpose(0, 3, 1, 2),
                 out_layout=layout)


def test_blocked_construction_errors():
    data = np.zeros((1, 2, 3, 3, 8), np.float32)
    for channels in (8, 17, 0, -1):
        with pytest.raises(ValueError, match=r"Blocked channels must be an int filling the last "
                                             r"of 2 blocks of 8 \(from 9 to 16\)"):
            Blocked(data, channels)
    for channels in (True, 12.0, "12", None):
        with pytest.raises(ValueError, match=r"Blocked channels must be an int"):
            Blocked(data, channels)
    assert Blocked(data, np.int64(9)).channels == 9 and Blocked(data, 16).shape == (1, 16, 3, 3)
    with pytest.raises(TypeError, match=r"Blocked data must be a 5-D numpy.ndarray.*"
                                        r"\(1, 16, 3, 3\)"):
        Blocked(np.zeros((1, 16, 3, 3), np.float32), 16)
    with pytest.raises(TypeError, match=r"Blocked data must be a 5-D numpy.ndarray .*got list"):
        Blocked([[0.0]], 1)
    with pytest.raises(TypeError, match=r"C-contiguous float32 or float64, got int32"):
        Blocked(np.zeros((1, 2, 3, 3, 8), np.int32), 16)
    with pytest.raises(TypeError, match=r"C-contiguous float32 or float64, got float32"):
        Blocked(np.zeros((1, 2, 3, 3, 16), np.float32)[..., ::2], 16)
    with pytest.raises(TypeError, match=r"from_nchw takes a 4-D numpy.ndarray.*\(16, 3, 3\)"):
        Blocked.from_nchw(np.zeros((16, 3, 3), np.float32))
    with pytest.raises(TypeError, match=r"from_nhwc takes a 4-D numpy.ndarray.*\(3, 3, 16\)"):
        Blocked.from_nhwc(np.zeros((3, 3, 16), np.float32))


def test_dtype_and_accumulate_errors(rng):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = rng.standard_normal((1, 5, 6, 7))
    for value, kwargs in ((Blocked.from_nchw(x), {}), (as_layout(x, "nhwc"), {"layout": "nhwc"}),
                          (x, {"out_layout": "blocked"})):
        with pytest.raises(TypeError, match=r"input dtype float64 differs from weight dtype "
                                            r"float32"):
            conv(value, **kwargs)
    with pytest.raises(ValueError, match=r"expected input with 5 channels .* got input of "
                                         r"shape \(1, 6, 6, 7\)"):
        conv(Blocked.from_nchw(np.zeros((1, 6, 6, 7), np.float32)))
    acc, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1, accumulate=True)
    xf = x.astype(np.float32)
    for value, kwargs in ((Blocked.from_nchw(xf), {}), (as_layout(xf, "nhwc"), {"layout": "nhwc"}),
                          (xf, {"out_layout": "blocked"}), (Blocked.from_nchw(xf),
                                                            {"out_layout": "nchw"})):
        with pytest.raises(ValueError, match=r"accumulate=True adds to out: pass out="):
            acc(value, **kwargs)


# 7. the plans ---------------------------------------------------------------------------------

PLAN_SPECS = ["n1c64h56w56k64r3s3p1u1", "n1c13h9w11k19r3s3p1u1", "n1c256h14w14k512r1s1p0u1",
              "n1c3h224w224k64r7s7p3u2", "n1c512h7w7k512r3s3p1u1", "n2c32h8w8k32r3s3p1u1g2",
              "n1c1024h14w14k1024r1s1p0u1", "n1c48h9w9k24r3s3p0u2d2",
              "n1c2048h7w7k512r1s1p0u1", "n1c256h28w28k256r3s3p1u1",
              "n1c2048h14w14k512r3s3p1u1"]   # (channel tiles on any core's caches)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("machine", ["host", "zen3", "avx2", "avx512", "small", "neon"])
def test_blocked_plans(dtype, machine):
    machine = {"host": cso.host_machine(), "zen3": ZEN3, "avx2": AVX2, "avx512": AVX512,
               "small": SMALL, "neon": NEON}[machine]
    lanes = machine.vector_bytes // np.dtype(dtype).itemsize
    tiled = False
    for name in PLAN_SPECS:
        spec = csa.ConvSpec.parse(name)
        spec = dataclasses.replace(spec, dtype=dtype)
        if not csa.layout.blocked_fits(spec, lanes):
            continue
        plan = csa.analyze(spec, machine, layout="blocked")
        assert plan.variant == "blocked" and plan.layout == "blocked" and plan.blocked
        assert plan.vectors_along == "filters" and plan.slab
        assert plan.nc == spec.c_per_group or plan.nc % lanes == 0, (name, plan.nc, lanes)
        tiled |= plan.channel_tiles > 1
        assert plan.reads_input_unpacked == (spec.padding == (0, 0, 0, 0))
        text = plan.explain()
        assert f"layout: channel-blocked ({lanes} channels a block" in text, text
        assert ("read in place from its blocks" in text) == plan.reads_input_unpacked
        for threads in (2, 3):   # the channel tiles and kernels stay, whatever the threads
            other = csa.analyze(spec, machine, threads=threads, layout="blocked")
            assert (other.nc, other.nwin, other.nf, other.variant) == (
                plan.nc, plan.nwin, plan.nf, "blocked")
        assert csa.analyze(spec, machine).variant != "blocked"
    assert tiled   # some spec split its channels into tiles (of whole blocks)


def test_blocked_plan_errors():
    machine = cso.host_machine()
    lanes = machine.vector_bytes // 4
    # a depthwise convolution of several filters per channel has no blocked plan
    multiplier = csa.ConvSpec(1, 8, 8, 8, 16, 3, 3, padding=(1, 1, 1, 1), groups=8)
    with pytest.raises(ValueError, match=r"n1c8h8w8k16r3s3p1u1g8"):
        csa.analyze(multiplier, machine, layout="blocked")
    # one filter per channel: a blocked DepthwisePlan of its own (since b7d3141)
    depthwise = csa.ConvSpec(1, 16, 8, 8, 16, 3, 3, padding=(1, 1, 1, 1), groups=16)
    plan = csa.analyze(depthwise, machine, layout="blocked")
    assert isinstance(plan, csa.DepthwisePlan) and plan.layout == "blocked"
    assert "channel-blocked" in plan.explain() and plan.lanes == lanes
    assert csa.analyze(depthwise, machine).layout == "nchw"
    off = csa.ConvSpec(1, 12, 8, 8, 18, 3, 3, padding=(1, 1, 1, 1), groups=3)
    with pytest.raises(ValueError, match=rf"cannot run on blocks of {lanes} channels: its 3 "
                                         r"groups of 4 channels and 6 filters"):
        csa.analyze(off, machine, layout="blocked")
    spec = csa.ConvSpec(1, 16, 8, 8, 24, 3, 3, padding=(1, 1, 1, 1))
    for overrides in ({"vectors_along": "windows"}, {"slab": True}, {"slab": False}):
        with pytest.raises(ValueError, match=r"vectors_along and slab cannot be overridden"):
            csa.analyze(spec, machine, layout="blocked", **overrides)
    assert csa.analyze(spec, machine, layout="blocked", vectors_along="filters").blocked
    for bad in ("NHWC", "NCHW", "blocks"):
        with pytest.raises(ValueError, match=r"layout must be one of \('nchw', 'blocked', "
                                             r"'nhwc'\)"):
            csa.analyze(spec, machine, layout=bad)


# bound_blocked: what cso.onnx runs between blocked layers ------------------------------------

class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("dtype", DTYPES)
def test_bound_blocked_runs_as_the_call(rng, dtype):
    lanes = block_size(dtype)
    for c, k, r, padding, groups in ((13, 19, 3, 1, 1), (24, 40, 1, 0, 1), (16, 16, 3, 1, 16)):
        conv, w, b = make_conv(rng, dtype, c, k, r, r, groups, padding=padding,
                               activation="relu")
        x = rng.standard_normal((2, c, 7, 7)).astype(dtype)
        expected = conv(Blocked.from_nchw(x, lanes))
        # (a blocked depthwise plan transposes NCHW planes into its slab of blocks)
        for in_block, value in ((lanes, Blocked.from_nchw(x, lanes).data), (1, x)):
            run = conv.bound_blocked(x.shape, in_block)
            assert run.out_shape == expected.data.shape
            out = np.full(run.out_shape, np.nan, dtype)
            assert run(value, out) is out
            np.testing.assert_array_equal(out, expected.data)
            # other arrays than the bound ones (here an ndarray subclass) take the checked call
            out = np.full(run.out_shape, np.nan, dtype)
            np.testing.assert_array_equal(run(value.view(_Subclass), out), expected.data)
    off, _, _ = make_conv(rng, dtype, 9, 9, 3, 3, 3, padding=1)   # (3 channels a group)
    with pytest.raises(ValueError, match=r"has no blocked plan reading blocks of"):
        off.bound_blocked((1, 9, 6, 7), lanes)


# regressions: bugs these tests found -----------------------------------------------------------

@pytest.mark.parametrize("out_layout", ["blocked", "nhwc"])
def test_non_contiguous_nchw_input_to_another_layout(rng, out_layout):
    conv, w, b = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = rng.standard_normal((2, 5, 18, 11)).astype(np.float32)[:, :, ::2]
    y = conv(x, out_layout=out_layout)
    got = y.to_nchw() if out_layout == "blocked" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, conv(np.ascontiguousarray(x)), rtol=1e-5, atol=1e-5)


def test_nc_override_off_the_blocks(rng):
    """An nc override that is not whole blocks is refused (channel tiles would start
    mid-block)."""
    conv, w, b = make_conv(rng, np.float32, 40, 16, 3, 3, padding=1, plan_overrides={"nc": 5})
    x = rng.standard_normal((1, 40, 6, 7)).astype(np.float32)
    with pytest.raises(ValueError, match="nc override 5"):
        csa.analyze(conv.spec_for(x.shape), cso.host_machine(), layout="blocked", nc=5)
    with pytest.raises(ValueError, match="nc override 5"):
        conv(Blocked.from_nchw(x))


def test_read_only_blocked_out_is_refused(rng):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = Blocked.from_nchw(rng.standard_normal((1, 5, 6, 7)).astype(np.float32))
    out = Blocked.empty((1, 13, 6, 7), np.float32, block_size(np.float32))
    out.data[...] = 0
    out.data.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        conv(x, out=out)


@pytest.mark.parametrize("value,exc,match", [
    (np.zeros((6, 7, 5), np.float32), ValueError, r"input must be 4-D \(NHWC\)"),
    ([[1.0]], TypeError, r"input must be a numpy.ndarray, got list"),
])
def test_nhwc_input_errors_name_the_input(rng, value, exc, match):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    with pytest.raises(exc, match=match):
        conv(value, layout="nhwc")


@pytest.mark.parametrize("in_layout", ["blocked", "nhwc"])
def test_empty_batch_to_nchw(rng, in_layout):
    conv, _, _ = make_conv(rng, np.float32, 5, 13, 3, 3, padding=1)
    x = np.zeros((0, 5, 6, 7), np.float32)
    assert conv(x).shape == (0, 13, 6, 7)   # (NCHW: fine)
    kwargs = {} if in_layout == "blocked" else {"layout": in_layout}
    assert conv(as_layout(x, in_layout), out_layout="nchw", **kwargs).shape == (0, 13, 6, 7)
    assert Blocked.from_nchw(x).to_nhwc().shape == (0, 6, 7, 5)


@pytest.mark.parametrize("block", [0, -1, 2.5])
def test_bad_block_is_named(block):
    with pytest.raises((ValueError, TypeError), match="block"):
        Blocked.from_nchw(np.zeros((1, 5, 3, 3), np.float32), block)


def test_a_layer_prepared_for_blocked_calls_packs_its_filters_once(rng):
    """``input_layout="blocked"`` with ``input_shape`` packs the filters for the blocked plan
    (24 filters: one tile of three vectors on AVX2), so blocked calls repack nothing: a model
    keeps one packing per layer; a bad value is refused."""
    w = rng.standard_normal((24, 16, 1, 1)).astype(np.float32)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    conv = cso.Conv2d(w, input_shape=x.shape, input_layout="blocked")
    nf = conv._blocked_plan(conv.spec_for(x.shape), block_size(np.float32), 1)[0].nf
    assert list(conv._packed) == [nf]
    y = conv(Blocked.from_nchw(x))
    assert list(conv._packed) == [nf]
    np.testing.assert_allclose(y.to_nchw(), cso.Conv2d(w)(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="input_layout must be 'nchw' or 'blocked'"):
        cso.Conv2d(w, input_shape=x.shape, input_layout="nhwc")


def test_concurrent_first_blocked_calls_agree(rng):
    """Several threads making a layer's first blocked calls at once (plans, packings, padded
    bias and depthwise weights made while the others look them up) all get the answer one
    call gets alone."""
    import threading
    lanes = block_size(np.float32)
    x = Blocked.from_nchw(rng.standard_normal((1, 24, 9, 10)).astype(np.float32))
    for groups, k in ((1, 21), (24, 24)):   # padded bias; depthwise weights
        w = rng.standard_normal((k, 24 // groups, 3, 3)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32)
        expected = cso.Conv2d(w, b, padding=1, groups=groups)(x).data
        conv = cso.Conv2d(w, b, padding=1, groups=groups)
        barrier, results = threading.Barrier(4), {}

        def call(i):
            barrier.wait()
            results[i] = conv(x, out_layout="blocked" if i % 2 else None).data
        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 1, 2, 3] and expected.shape[-1] == lanes
        for got in results.values():
            np.testing.assert_array_equal(got, expected)
