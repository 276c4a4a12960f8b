"""Grouped convolutions (2 or more groups of more than one channel): every plan family on the
shapes real networks and edge cases give, in every layout, against the NumPy reference; the
same bits on any thread count; the plan the rules give a group of a few channels."""
import dataclasses

import numpy as np
import pytest

import csa
import cso
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
    "cg24": (1, 48, 11, 11, 48, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "cg32_large_plane": (1, 64, 40, 36, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
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
                                  "cg32_large_plane", "cg8_stride2"])
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


def test_a_few_channels_per_group_run_direct_where_measured():
    """The AVX2 record (measured on Zen 3) plans stride-1 groups of 8 or more channels on
    planes of up to 32 x 32 direct, with filter tiles of the lanes a group's filters use; not
    groups of 4, stride 2, larger planes, nor on a record that has not measured it."""
    avx2, avx512 = ZEN3, ZEN5
    regnet = ConvSpec.parse("n1c512h14w14k1024r3s3p1u1g64")   # 8 channels, 16 filters a group
    plan = csa.analyze(regnet, avx2)
    assert (plan.vectors_along, plan.slab, plan.nf, plan.nc) == ("filters", True, 16, 8)
    assert csa.analyze(ConvSpec.parse("n1c48h14w14k48r3s3p1u1g6"), avx2).nf == 8
    for other in ("n1c416h14w14k416r3s3p1u1g104",   # 4 channels a group
                  "n1c360h12w12k360r3s3p1u2g45",    # stride 2
                  "n1c88h72w72k88r3s3p1u1g11"):     # a 72 x 72 plane
        assert not csa.variants.grouped_direct(ConvSpec.parse(other), avx2), other
    assert not csa.variants.grouped_direct(regnet, avx512)


def test_small_planes_of_one_block_a_group_run_on_blocks_where_measured():
    """An NCHW call runs the blocked plan (reading the planes, reordering the output's
    blocks) for groups of one block of channels, in and out, a filter larger than 1x1 and
    an output plane of at most the record's ``grouped_blocked_max_plane`` pixels (196 in the
    AVX-512 record, measured on a Xeon; 0, never, where not measured)."""
    conv = cso.Conv2d(np.ones((4, 2, 3, 3), np.float32), groups=2)   # (its dtype and ISA)
    lanes = cso.layouts.block_size(np.dtype(np.float32), conv.isa)
    machine = cso.host_machine()
    measured = machine.with_(tuning=dataclasses.replace(machine.tuning,
                                                        grouped_blocked_max_plane=196))

    def on_blocks(name, machine=measured, conv=conv):
        spec = ConvSpec.parse(name.format(c=20 * lanes, g=20, k=20 * lanes))
        return conv._grouped_on_blocks(csa.analyze(spec, machine))
    assert on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}")
    assert on_blocks("n1c{c}h28w28k{k}r3s3p1u2g{g}")        # 14 x 14 out
    assert on_blocks("n1c{c}h7w7k{k}r5s5p2u1g{g}")
    assert not on_blocks("n1c{c}h16w16k{k}r3s3p1u1g{g}")    # 256 pixels
    assert not on_blocks("n1c{c}h14w14k{k}r1s1p0u1g{g}")    # 1x1
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g10")     # two blocks a group
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g1")
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}", machine.with_(
        tuning=dataclasses.replace(machine.tuning, grouped_blocked_max_plane=0)))
    forced = cso.Conv2d(np.ones((4, 2, 3, 3), np.float32), groups=2,
                        plan_overrides={"vectors_along": "windows"})
    assert not on_blocks("n1c{c}h14w14k{k}r3s3p1u1g{g}", conv=forced)
    assert csa.tuning.AVX512.grouped_blocked_max_plane == 196
    assert csa.tuning.AVX2.grouped_blocked_max_plane == 0


@pytest.mark.parametrize("case", [
    # (N, C/lanes groups, H, W, R, stride, padding (t, b, l, r), dilation)
    (1, 3, 14, 14, 3, 1, (1, 1, 1, 1), 1),
    (2, 2, 13, 11, 3, 2, (1, 0, 2, 1), 1),
    (1, 2, 7, 7, 5, 1, (2, 2, 2, 2), 1),
    (1, 3, 12, 12, 3, 1, (2, 2, 2, 2), 2),
])
def test_an_nchw_call_on_blocks_matches_the_reference(rng, monkeypatch, case):
    """The route through blocks, forced on whatever the host's record says: bias and
    activation, stride, asymmetric padding, dilation, batches; ``out=`` contiguous or
    strided, accumulation; the second call (its plain path) as the first; the same bits on
    1 and 2 threads."""
    n, groups, h, w, r, stride, pads, dilation = case
    conv0 = cso.Conv2d(np.ones((1, 1, 1, 1), np.float32))
    lanes = cso.layouts.block_size(np.dtype(np.float32), conv0.isa)
    monkeypatch.setattr(cso.Conv2d, "_grouped_on_blocks", lambda self, plan: (
        plan.spec.groups > 1 and plan.spec.c_per_group == lanes and self.channel_shuffle == 1
        and not self.overrides))
    c = groups * lanes
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((c, lanes, r, r)) / np.sqrt(lanes * r * r)).astype(np.float32)
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
