"""Grouped convolutions (2 or more groups of more than one channel): every plan family on the
shapes real networks and edge cases give, in every layout, against the NumPy reference; the
same bits on any thread count; the plan the rules give a group of a few channels."""
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
