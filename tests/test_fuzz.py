"""API fuzzing: ``conv2d`` and ``Conv2d`` fed odd arguments. A call either returns the right
answer or raises TypeError / ValueError whose message names the bad argument (a gigantic but
valid request: MemoryError with the size it needed), never a crash or a silently wrong answer.

Each example draws a small valid convolution, a valid variant of every argument (layouts,
views, spellings), and at most one argument replaced by a bad value; another test draws
channel layouts in and out (NCHW, channels last, blocks). ``CSO_FUZZ_EXAMPLES`` sets the number
of examples of each (the default is a short run for CI, the same examples every run, so that
a run is reproducible and fails on a change, not on the draw; e.g. 20000 for a long, random
one)."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cso
from cso.arguments import same_padding

from .reference import assert_conv_close, conv2d_reference

EXAMPLES = int(os.environ.get("CSO_FUZZ_EXAMPLES", "300"))
DERANDOMIZE = "CSO_FUZZ_EXAMPLES" not in os.environ

# argument -> the name its error messages use
NAMES = {"x": "input", "weight": "weight", "bias": "bias", "stride": "stride",
         "padding": "padding", "dilation": "dilation", "groups": "groups",
         "activation": "activation", "out": "out"}
BAD_INTS = [0, -1, 2 ** 31, 2 ** 40, 1.5, True, "2", None, (1,), (1, 2, 3), (1, 0), (2, 1.0),
            np.float64(2.0), [1, -2]]
BAD_VALUES = {
    "stride": BAD_INTS,
    "dilation": BAD_INTS,
    "padding": [-1, 2 ** 31, "SAME", "foo", "", 1.5, None, True, (1, 2, 3), ((1,), (2, 3)),
                ((1, 2), (3, -1)), ((1, 2), 3), (1, "1")],
    "groups": [0, -1, 1.5, True, "1", None, 2 ** 40],
    "activation": ["RELU", "gelu_exact", "", 1, True],
}
SPECIAL = ("nan", "inf")


def stride_variants(value):
    """Spellings of a valid stride or dilation ``value`` (h, w)."""
    h, w = value
    spellings = [value, list(value), (np.int64(h), np.int32(w))]
    if h == w:
        spellings += [h, np.int64(h)]
    return st.sampled_from(spellings)


@st.composite
def problems(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    c_g = 1 if groups > 1 and draw(st.booleans()) else draw(st.integers(1, 4))
    k = groups * draw(st.integers(1, 5))
    r, s = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h, w = draw(st.integers(5, 11)), draw(st.integers(5, 13))   # >= any kernel extent here
    padding, pads = draw(st.sampled_from([
        (0, (0, 0, 0, 0)), (1, (1, 1, 1, 1)), ((1, 0), (1, 1, 0, 0)), ([2, 1], (2, 2, 1, 1)),
        (((0, 1), (2, 0)), (0, 1, 2, 0)), ("valid", (0, 0, 0, 0)), ("same", None),
        (np.int64(1), (1, 1, 1, 1))]))
    if pads is None:
        pads = (same_padding(h, r, stride[0], dilation[0])
                + same_padding(w, s, stride[1], dilation[1]))
    return dict(
        n=draw(st.integers(0, 2)), c=c_g * groups, h=h, w=w, k=k, r=r, s=s, groups=groups,
        dtype=draw(st.sampled_from([np.float32, np.float64])),
        stride=stride, stride_arg=draw(stride_variants(stride)),
        dilation=dilation, dilation_arg=draw(stride_variants(dilation)),
        padding=pads, padding_arg=padding,
        bias=draw(st.booleans()), relu=draw(st.booleans()),
        x_layout=draw(st.sampled_from(["C", "F", "sliced", "broadcast", "readonly", "unbatched"]
                                      + list(SPECIAL))),
        out_layout=draw(st.sampled_from([None, "C", "F"])),
        api=draw(st.sampled_from(["conv2d", "Conv2d"])),
        bad=draw(st.sampled_from([None] * 4 + list(NAMES) + ["huge"])),
        bad_pick=draw(st.integers(0, 10 ** 6)), seed=draw(st.integers(0, 2 ** 32 - 1)))


def arrange(x, layout):
    if layout == "F":
        return np.asfortranarray(x)
    if layout == "sliced":
        big = np.zeros(x.shape[:3] + (2 * x.shape[3],), x.dtype)
        big[..., 1::2] = x
        return big[..., 1::2]
    if layout == "broadcast" and x.shape[0]:   # every image the same: a zero batch stride
        return np.broadcast_to(x[:1], x.shape)
    if layout == "readonly":
        x = x.copy()
        x.flags.writeable = False
    return x


def bad_array(name, good, pick):
    """A bad value for array argument ``name`` whose good value is ``good``."""
    other = np.float64 if good.dtype == np.float32 else np.float32
    values = [good.tolist(), good.astype(np.float16), np.zeros(good.shape, np.int32),
              good.astype(np.complex64), good.astype(other), np.ma.masked_array(good), "array",
              good[None, None]]
    if name in ("x", "weight"):
        values += [None, good.reshape(-1)[:1]]
    if name == "x":   # channel axis -3 whether batched or not
        values += [good[..., :0, :, :], good[..., :0, :], good[..., :0],
                   np.concatenate([good, good], axis=-3)]
    if name == "weight":
        values += [good[:0], good[:, :, :0], good[0]]
    if name == "bias":
        values += [good[:-1], good.reshape(1, -1), np.float32(1.0)]
    if name == "out":
        readonly = good.copy()
        readonly.flags.writeable = False
        values += [good[..., :-1], readonly, good.reshape(-1)]
    return values[pick % len(values)]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_odd_arguments_give_the_right_answer_or_a_named_error(p):
    rng = np.random.default_rng(p["seed"])
    dt = p["dtype"]
    x = rng.standard_normal((p["n"], p["c"], p["h"], p["w"])).astype(dt)
    if p["x_layout"] in SPECIAL and x.size:
        x.reshape(-1)[rng.integers(x.size)] = np.nan if p["x_layout"] == "nan" else -np.inf
    unbatched = p["x_layout"] == "unbatched" and p["n"] == 1
    given = x[0] if unbatched else arrange(x, p["x_layout"])
    x = np.array(given).reshape(x.shape)   # the values given (a broadcast repeats image 0)
    weight = rng.standard_normal((p["k"], p["c"] // p["groups"], p["r"], p["s"])).astype(dt)
    bias = rng.standard_normal(p["k"]).astype(dt) if p["bias"] else None
    expected = conv2d_reference(x, weight, bias, p["stride"], p["padding"], p["dilation"],
                                p["groups"], p["relu"]).astype(dt)
    call = dict(x=given, weight=weight, bias=bias,
                stride=p["stride_arg"], padding=p["padding_arg"], dilation=p["dilation_arg"],
                groups=p["groups"], activation="relu" if p["relu"] else None, out=None)
    if unbatched:
        expected = expected[0]
    if p["out_layout"]:
        call["out"] = np.zeros(expected.shape, dt, order=p["out_layout"])

    bad, errors = p["bad"], (TypeError, ValueError)
    if bad == "huge" and not p["n"]:
        bad = None   # an empty batch's output is empty whatever its planes
    if bad == "huge":   # valid, but its output cannot be allocated
        call["padding"], call["out"] = 2 ** (20 + p["bad_pick"] % 11), None
        errors = (MemoryError,)
    elif bad in ("x", "weight", "bias", "out"):
        good = {"bias": bias if bias is not None else np.zeros(p["k"], dt),
                "out": np.zeros(expected.shape, dt)}.get(bad, call[bad])
        call[bad] = bad_array(bad, good, p["bad_pick"])
    elif bad:
        values = BAD_VALUES[bad]
        call[bad] = values[p["bad_pick"] % len(values)]

    def run():
        if p["api"] == "conv2d":
            return cso.conv2d(**call)
        conv = cso.Conv2d(call["weight"], call["bias"], call["stride"], call["padding"],
                          call["dilation"], call["groups"], call["activation"])
        return conv(call["x"], out=call["out"])

    if bad is None:
        actual = run()
        if call["out"] is not None:
            assert actual is call["out"]
        if p["x_layout"] in SPECIAL:
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-3, equal_nan=True)
        else:
            assert_conv_close(actual.reshape((-1,) + expected.shape[-3:]), x, weight, bias,
                              relu=p["relu"],
                              stride=p["stride"], padding=p["padding"], dilation=p["dilation"],
                              groups=p["groups"])
        return
    with pytest.raises(errors) as raised:
        run()
    message = str(raised.value)
    if bad == "huge":
        assert "allocate" in message and "shape" in message, message
    else:
        assert NAMES[bad] in message, message


@st.composite
def layout_problems(draw):
    """A small valid convolution with channels that fill blocks, or part of them, in groups
    of 1 to 17 channels (one channel of several filters included: a grayscale image's first
    layer), and an input and an output of any channel layout."""
    groups = draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16]))
    c_g = draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16, 17]))
    k_g = draw(st.sampled_from([1, c_g, c_g, 2 * c_g, 3]))
    r, s = draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([1, 3, 5]))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (1, 1) if max(stride) > 1 else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, (r - 1) * dilation[0] + 1 - padding[0] - padding[1]), 13))
    w = draw(st.integers(max(1, (s - 1) * dilation[1] + 1 - padding[2] - padding[3]), 13))
    return dict(n=draw(st.integers(1, 2)), c=groups * c_g, h=h, w=w, k=groups * k_g, r=r, s=s,
                groups=groups, stride=stride, dilation=dilation, padding=padding,
                dtype=draw(st.sampled_from([np.float32, np.float32, np.float64])),
                bias=draw(st.booleans()), relu=draw(st.booleans()),
                layout=draw(st.sampled_from(["nchw", "nhwc", "blocked", "blocked_other"])),
                out_layout=draw(st.sampled_from(["nchw", "nhwc", "blocked"])),
                seed=draw(st.integers(0, 2 ** 32 - 1)))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layout_problems())
def test_every_channel_layout_gives_the_right_answer(p):
    """NCHW, channels-last and blocked values (of the kernels' block, or another one) in and
    out: the reference's values, on a call and on the call of its shape after it (a plain
    call, its checks and choices made before)."""
    rng = np.random.default_rng(p["seed"])
    dt = p["dtype"]
    x = rng.standard_normal((p["n"], p["c"], p["h"], p["w"])).astype(dt)
    weight = rng.standard_normal((p["k"], p["c"] // p["groups"], p["r"], p["s"])).astype(dt)
    bias = rng.standard_normal(p["k"]).astype(dt) if p["bias"] else None
    (t, b, left, right) = p["padding"]
    conv = cso.Conv2d(weight, bias, p["stride"], ((t, b), (left, right)), p["dilation"],
                      p["groups"], "relu" if p["relu"] else None)
    lanes = cso.layouts.block_size(dt, conv.isa)
    given = {"nchw": x, "nhwc": np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
             "blocked": cso.Blocked.from_nchw(x),
             "blocked_other": cso.Blocked.from_nchw(x, 4 if lanes > 4 else 8)}[p["layout"]]
    kwargs = {"out_layout": p["out_layout"]}
    if p["layout"] == "nhwc":
        kwargs["layout"] = "nhwc"
    for _ in range(2):
        y = conv(given, **kwargs)
        if p["out_layout"] == "blocked":
            y = y.to_nchw()
        elif p["out_layout"] == "nhwc":
            y = y.transpose(0, 3, 1, 2)
        assert_conv_close(y, x, weight, bias, relu=p["relu"], stride=p["stride"],
                          padding=p["padding"], dilation=p["dilation"], groups=p["groups"])
