"""Property test: random configurations of every feature against the NumPy reference."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cso
from cso.arguments import same_padding

from .reference import assert_conv_close


SLICING_OVERRIDES = [{}, {"schedule": "IS"}, {"schedule": "WS"}, {"nc": 2, "k2": 1, "k3": 2},
                     {"vectors_along": "windows"}, {"vectors_along": "filters"},
                     {"vectors_along": "filters", "schedule": "WS", "nc": 3, "k2": 2},
                     {"vectors_along": "windows", "nc": 1, "band": 1},
                     {"vectors_along": "windows", "nc": 2, "band": 2, "k2": 1}]
DEPTHWISE_OVERRIDES = [{}, {"block_vectors": 1}, {"block_vectors": 3}, {"nc": 1, "band": 1},
                       {"band": 2, "block_vectors": 2}, {"nc": 3}, {"split": (3, 1)},
                       {"depthwise": False}, {"depthwise": False, "vectors_along": "filters"}]


@st.composite
def configurations(draw):
    depthwise = draw(st.integers(0, 3)) == 0    # one input channel per group: its own plan
    groups = draw(st.integers(1, 9) if depthwise else st.sampled_from([1, 1, 2, 3]))
    c_g, k_g = 1 if depthwise else draw(st.integers(1, 7)), draw(st.integers(1, 16))
    r, s = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 6)))   # shuffled (<= 4) and gathered
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    padding = draw(st.one_of(st.sampled_from(["same", "valid"]),
                             st.tuples(*[st.integers(0, 3)] * 4)))
    extent = (dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1)
    pad_h = 0 if isinstance(padding, str) else padding[0] + padding[1]
    pad_w = 0 if isinstance(padding, str) else padding[2] + padding[3]
    h = draw(st.integers(max(1, extent[0] - pad_h), extent[0] + 12))
    w = draw(st.integers(max(1, extent[1] - pad_w), extent[1] + 40))
    return dict(
        n=draw(st.integers(1, 2)), c=c_g * groups, h=h, w=w, k=k_g * groups, r=r, s=s,
        stride=stride, dilation=dilation, padding=padding, groups=groups,
        dtype=draw(st.sampled_from([np.float32, np.float64])), bias=draw(st.booleans()),
        relu=draw(st.booleans()), layout=draw(st.sampled_from(["C", "F", "sliced"])),
        overrides=draw(st.sampled_from(DEPTHWISE_OVERRIDES if c_g == 1 else SLICING_OVERRIDES)),
        seed=draw(st.integers(0, 2 ** 32 - 1)),
    )


def explicit_padding(cfg):
    if cfg["padding"] == "valid":
        return (0, 0, 0, 0)
    if cfg["padding"] == "same":
        return (same_padding(cfg["h"], cfg["r"], cfg["stride"][0], cfg["dilation"][0])
                + same_padding(cfg["w"], cfg["s"], cfg["stride"][1], cfg["dilation"][1]))
    return cfg["padding"]


def layout(x, kind, rng):
    if kind == "F":
        return np.asfortranarray(x)
    if kind == "sliced":
        big = rng.standard_normal((x.shape[0], 2 * x.shape[1], x.shape[2], 2 * x.shape[3])).astype(x.dtype)
        big[:, ::2, :, 1::2] = x
        return big[:, ::2, :, 1::2]
    return x


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
def test_random_configurations_match_reference(cfg):
    rng = np.random.default_rng(cfg["seed"])
    dt = cfg["dtype"]
    x = rng.standard_normal((cfg["n"], cfg["c"], cfg["h"], cfg["w"])).astype(dt)
    w = rng.standard_normal((cfg["k"], cfg["c"] // cfg["groups"], cfg["r"], cfg["s"])).astype(dt)
    b = rng.standard_normal(cfg["k"]).astype(dt) if cfg["bias"] else None
    padding = cfg["padding"]
    if not isinstance(padding, str):
        padding = ((padding[0], padding[1]), (padding[2], padding[3]))
    conv = cso.Conv2d(w, b, cfg["stride"], padding, cfg["dilation"], cfg["groups"],
                      activation="relu" if cfg["relu"] else None, plan_overrides=cfg["overrides"])
    y = conv(layout(x, cfg["layout"], rng))
    assert_conv_close(y, x, w, b, relu=cfg["relu"], stride=cfg["stride"], padding=explicit_padding(cfg),
                      dilation=cfg["dilation"], groups=cfg["groups"])
