"""cso.onnx with channel-blocked values between steps (``cso.onnx.layouts``): which values are
held blocked, the reorders, and every output equal to the NCHW run's and onnxruntime's."""
import pickle

import numpy as np
import pytest
from onnx import helper

import cso
import cso.onnx
from cso.layouts import block_size, unblock_into
from cso.onnx.concat import Slot
from cso.onnx.conv import ConvStep
from cso.onnx.layouts import (BlockedAffine, BlockedGate, BlockedGlobalPool, BlockedPool,
                              BlockedResize, Reorder)

from .guarded import calls_stay_inside
from .onnx_models import make_model, onnxruntime, tensor

LANES = block_size(np.float32)


def _conv(name, x, y, weights, rng, c, k, kernel=3, stride=1, group=1, pad=None, bias=True):
    """A Conv node and its initializers (``weights``, updated)."""
    pad = kernel // 2 if pad is None else pad
    weights[f"{name}_w"] = (rng.standard_normal((k, c // group, kernel, kernel)) /
                            np.sqrt(c // group * kernel * kernel)).astype(np.float32)
    inputs = [x, f"{name}_w"]
    if bias:
        weights[f"{name}_b"] = rng.standard_normal(k).astype(np.float32)
        inputs.append(f"{name}_b")
    return helper.make_node("Conv", inputs, [y], name=name, kernel_shape=[kernel, kernel],
                            strides=[stride, stride], pads=[pad] * 4, group=group)


def _network(rng, c=13, width=20):
    """A small CNN with what a blocked model meets: a stem read from NCHW (3 channels), a
    residual sum, a depthwise convolution, a squeeze-excitation gate whose two convolutions
    read a Concat of channels that are not whole blocks (kept NCHW), pools and a Concat of
    whole blocks (blocked), a standalone BatchNormalization, a sum of two convs and a
    standalone activation, an LRN (read through a reorder), global pools, a flatten and a
    Gemm; odd channel counts (``c``, ``width``, 21) leave blocks padded."""
    w = {}
    nodes = [
        _conv("stem", "x", "s", w, rng, 3, c, stride=2),
        helper.make_node("Relu", ["s"], ["s_relu"]),
        _conv("c1", "s_relu", "a", w, rng, c, width),
        helper.make_node("Relu", ["a"], ["a_relu"]),
        _conv("c2", "a_relu", "b", w, rng, width, width),
        helper.make_node("Add", ["b", "a_relu"], ["sum"]),            # a residual sum
        helper.make_node("Relu", ["sum"], ["sum_relu"]),
        _conv("dw", "sum_relu", "d", w, rng, width, width, group=width),
        helper.make_node("HardSwish", ["d"], ["d_act"]),
        helper.make_node("GlobalAveragePool", ["d_act"], ["pooled"]),     # squeeze ...
        _conv("se1", "pooled", "se_a", w, rng, width, 5, kernel=1),
        helper.make_node("Relu", ["se_a"], ["se_r"]),
        helper.make_node("Concat", ["se_r", "se_r"], ["se_cat"], axis=1),  # kept NCHW
        _conv("se2", "se_cat", "se_b", w, rng, 10, width, kernel=1),
        helper.make_node("Sigmoid", ["se_b"], ["gate"]),
        helper.make_node("Mul", ["d_act", "gate"], ["excited"]),          # ... and excitation
        _conv("c3", "excited", "e", w, rng, width, 2 * LANES, kernel=1),
        helper.make_node("MaxPool", ["e"], ["e_max"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["e"], ["e_avg"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        _conv("c4", "e", "f", w, rng, 2 * LANES, 21, stride=2),
        helper.make_node("Concat", ["e_max", "e_avg"], ["cat"], axis=1),   # whole blocks
        helper.make_node("BatchNormalization", ["cat", "bn_s", "bn_b", "bn_m", "bn_v"],
                         ["cat_bn"]),
        _conv("c5", "cat_bn", "g", w, rng, 4 * LANES, 21, kernel=1),
        helper.make_node("Add", ["f", "g"], ["fg"]),
        helper.make_node("Tanh", ["fg"], ["fg_act"]),
        helper.make_node("GlobalAveragePool", ["fg_act"], ["gap"]),
        helper.make_node("LRN", ["fg_act"], ["fg_lrn"], size=3),         # read as NCHW
        helper.make_node("GlobalAveragePool", ["fg_lrn"], ["gap_lrn"]),
        helper.make_node("Add", ["gap", "gap_lrn"], ["gaps"]),
        helper.make_node("Flatten", ["gaps"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    w["bn_s"], w["bn_b"] = rng.standard_normal((2, 4 * LANES)).astype(np.float32)
    w["bn_m"] = rng.standard_normal(4 * LANES).astype(np.float32)
    w["bn_v"] = rng.uniform(0.5, 2, 4 * LANES).astype(np.float32)
    w["fc_w"] = rng.standard_normal((10, 21)).astype(np.float32)
    w["fc_b"] = rng.standard_normal(10).astype(np.float32)
    return make_model(nodes, [tensor("x", [None, 3, 33, 35])], [tensor("y", [None, 10])], w,
                      opset=17)


@pytest.fixture(scope="module")
def network():
    return _network(np.random.default_rng(3))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_blocked_model_runs_as_the_nchw_one(network, threads):
    """Blocked and NCHW runs of one model agree to float rounding, on every batch size,
    recorded and replayed; the blocked one holds the convolutions' values blocked but where
    a Concat of partial blocks reads them, and reorders where the LRN reads one."""
    cso.set_num_threads(threads)
    try:
        blocked = cso.onnx.load(network, {"x": (2, 3, 33, 35)})
        plain = cso.onnx.load(network, {"x": (2, 3, 33, 35)}, blocked=False)
        rng = np.random.default_rng(0)
        for batch in (2, 1, 3, 2):
            x = rng.standard_normal((batch, 3, 33, 35)).astype(np.float32)
            expected = plain(x)
            for _ in range(2):   # the recording, then the replay
                np.testing.assert_allclose(blocked(x), expected, rtol=2e-5, atol=2e-5)
    finally:
        cso.set_num_threads(1)
    convs = {step.run.node.name: step.run.blocked for step in blocked.steps
             if isinstance(step.run, ConvStep)}
    assert convs == dict(dict.fromkeys(("stem", "c1", "c2", "dw", "se2", "c3", "c4", "c5"),
                                       True), se1=False), convs
    kinds = [type(step.run) for step in blocked.steps]
    assert kinds.count(Reorder) == 1     # fg_act, for the LRN
    assert kinds.count(BlockedGate) == 1 and kinds.count(BlockedGlobalPool) == 2
    assert kinds.count(BlockedPool) == 2 and kinds.count(BlockedAffine) == 1
    assert not any(isinstance(step.run, ConvStep) and step.run.blocked
                   for step in plain.steps)


def test_blocked_values_stay_blocked_between_convolutions(network):
    """The values a blocked convolution makes are 5-D blocks of the lanes, padded; the model
    keeps no other layout between them (no reorder but the LRN's)."""
    model = cso.onnx.load(network, {"x": (1, 3, 33, 35)})
    # the pools make their blocks in the Concat's array
    assert model.slots == {"e_max": Slot("cat", 0, 2, (4, 9, 9, LANES)),
                           "e_avg": Slot("cat", 2, 4, (4, 9, 9, LANES))}
    seen = {}
    original = ConvStep.__call__

    def spy(self, x, *args, **kwargs):
        result = original(self, x, *args, **kwargs)
        seen[self.node.name] = (x.shape, result[0].shape)
        return result
    ConvStep.__call__ = spy
    try:
        model.time_by_operator({"x": np.ones((1, 3, 33, 35), np.float32)})
    finally:
        ConvStep.__call__ = original
    assert seen["stem"] == ((1, 3, 33, 35), (1, -(-13 // LANES), 17, 18, LANES))
    assert seen["c1"][0] == seen["stem"][1]                # read blocked, as made
    assert seen["c2"][1] == (1, -(-20 // LANES), 17, 18, LANES)
    # the Concat's blocks, as its pools made them in its array
    assert seen["c5"] == ((1, 4, 9, 9, LANES), (1, -(-21 // LANES), 9, 9, LANES))
    assert seen["se2"] == ((1, 10, 1, 1), (1, -(-20 // LANES), 1, 1, LANES))


@pytest.mark.skipif(onnxruntime is None, reason="onnxruntime is not installed")
def test_a_blocked_model_matches_onnxruntime(network):
    from bench.models import onnxruntime_session
    model = cso.onnx.load(network, {"x": (1, 3, 33, 35)})
    session = onnxruntime_session(network, 1)
    x = np.random.default_rng(1).standard_normal((1, 3, 33, 35)).astype(np.float32)
    expected = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(model(x), expected, rtol=1e-4, atol=1e-4)


def test_blocked_models_pickle(network):
    """A blocked model pickles (its blocked steps with it) and runs the same when loaded."""
    model = cso.onnx.load(network, {"x": (1, 3, 33, 35)})
    x = np.random.default_rng(2).standard_normal((1, 3, 33, 35)).astype(np.float32)
    copy = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(copy(x), model(x))


def test_blocked_is_a_bool(network):
    with pytest.raises(TypeError, match="blocked must be True or False"):
        cso.onnx.load(network, {"x": (1, 3, 33, 35)}, blocked=1)


def test_a_model_reads_nchw_where_no_convolution_reads_blocked():
    """Values read by NCHW steps alone stay NCHW: a conv feeding only a MaxPool writes NCHW,
    no reorder."""
    rng = np.random.default_rng(4)
    w = {}
    nodes = [_conv("a", "x", "y0", w, rng, 3, 16),
             helper.make_node("MaxPool", ["y0"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = cso.onnx.load(make_model(nodes, [tensor("x", [1, 3, 8, 8])],
                                     [tensor("y", [1, 16, 4, 4])], w))
    assert not any(isinstance(s.run, (ConvStep,)) and s.run.blocked for s in model.steps)
    assert not any(isinstance(s.run, Reorder) for s in model.steps)


@pytest.mark.parametrize("mode,coordinates", [("nearest", "asymmetric"),
                                              ("linear", "half_pixel"),
                                              ("cubic", "align_corners")])
def test_a_resize_between_convolutions_resizes_blocks(mode, coordinates):
    """A feature pyramid's top-down step: a Resize of a blocked value's planes is blocked (the
    scales a constant, or the sizes), and equals the NCHW model and onnxruntime; a Resize
    that scales the channels keeps its values NCHW."""
    rng = np.random.default_rng(7)
    w = {"scales": np.array([1, 1, 2, 2], np.float32),
         "sizes": np.array([1, 21, 11, 9], np.int64),
         "channels": np.array([1, 2, 1, 1], np.float32)}
    nodes = [_conv("a", "x", "a_out", w, rng, 3, 21, stride=2),
             _conv("b", "x", "b_out", w, rng, 3, 21),
             helper.make_node("Resize", ["a_out", "", "scales"], ["up"], mode=mode,
                              coordinate_transformation_mode=coordinates),
             helper.make_node("Add", ["up", "b_out"], ["sum"]),
             _conv("c", "sum", "c_out", w, rng, 21, 21),
             helper.make_node("Resize", ["c_out", "", "", "sizes"], ["down"], mode=mode,
                              coordinate_transformation_mode=coordinates),
             _conv("d", "down", "d_out", w, rng, 21, 5),
             helper.make_node("GlobalAveragePool", ["d_out"], ["y"]),
             helper.make_node("Resize", ["c_out", "", "channels"], ["wide"], mode="nearest")]
    model = make_model(nodes, [tensor("x", [1, 3, 16, 14])],
                       [tensor("y", [1, 5, 1, 1]), tensor("wide", [1, 42, 16, 14])], w,
                       opset=17)
    blocked = cso.onnx.load(model)
    resizes = [type(step.run) for step in blocked.steps if step.ops == ("Resize",)]
    assert resizes.count(BlockedResize) == 2 and len(resizes) == 3
    assert [type(step.run) for step in blocked.steps].count(Reorder) == 1   # c_out's, for wide
    x = rng.standard_normal((1, 3, 16, 14)).astype(np.float32)
    expected = cso.onnx.load(model, blocked=False).run(None, {"x": x})
    for found, want in zip(blocked.run(None, {"x": x}), expected):
        np.testing.assert_allclose(found, want, rtol=1e-5, atol=1e-5)
    for found, want in zip(pickle.loads(pickle.dumps(blocked)).run(None, {"x": x}),
                           blocked.run(None, {"x": x})):
        np.testing.assert_array_equal(found, want)
    if onnxruntime is not None:
        from bench.models import onnxruntime_session
        session = onnxruntime_session(model, 1)
        for found, want in zip(blocked.run(None, {"x": x}), session.run(None, {"x": x})):
            np.testing.assert_allclose(found, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pixels", [(1, 1), (3, 5), (7, 7)])
def test_the_blocked_kernels(dtype, pixels):
    """The reorder, the global pools (to NCHW and to blocks; pixels not a multiple of the four
    a step sums; a NaN kept by the max), the affine map and the gate, against NumPy on the
    tensor. (The blocked pools: test_onnx_kernels.)"""
    from cso.onnx import kernels
    rng = np.random.default_rng(5)
    lanes = block_size(dtype)
    x = rng.standard_normal((2, 13) + pixels).astype(dtype)
    x[1, 12, 0, 0] = np.nan
    blocked = cso.Blocked.from_nchw(x).data
    out = np.full(x.shape, 7, dtype)
    np.testing.assert_array_equal(unblock_into(blocked, out), x)
    for kind, reduce in (("average", np.mean), ("max", np.max)):
        expected = reduce(x, axis=(2, 3), keepdims=True)
        nchw = kernels.blocked_global_pool(kind, blocked, np.full((2, 13, 1, 1), 7, dtype), 2)
        np.testing.assert_allclose(nchw, expected, rtol=1e-5, atol=1e-6)
        padded = np.full((2, blocked.shape[1], 1, 1, lanes), 7, dtype)
        as_blocks = kernels.blocked_global_pool(kind, blocked, padded, 2)
        np.testing.assert_allclose(cso.Blocked(as_blocks, 13).to_nchw(), expected, rtol=1e-5,
                                   atol=1e-6)
        assert np.isfinite(as_blocks[0, -1, ..., 13 % lanes:]).all()   # padding lanes written
    scale, shift = rng.standard_normal((2, blocked.shape[1] * lanes)).astype(dtype)
    finite = np.nan_to_num(x)
    for relu in (False, True):
        mapped = kernels.blocked_affine(cso.Blocked.from_nchw(finite).data,
                                        np.empty_like(blocked), scale, shift, relu, 2)
        expected = finite * scale[:13, None, None] + shift[:13, None, None]
        np.testing.assert_allclose(cso.Blocked(mapped, 13).to_nchw(),
                                   np.maximum(expected, 0) if relu else expected, rtol=1e-6)
    gate = cso.Blocked.from_nchw(rng.standard_normal((2, 13, 1, 1)).astype(dtype)).data
    scaled = kernels.blocked_gate(blocked, gate, np.empty_like(blocked), 2)
    np.testing.assert_array_equal(cso.Blocked(scaled, 13).to_nchw(),
                                  x * cso.Blocked(gate, 13).to_nchw())


@pytest.mark.parametrize("at", ["start", "end"])
def test_the_blocked_kernels_stay_inside_their_arrays(at):
    """Every blocked kernel, its input and output each flush against an inaccessible page
    (windows over every edge, padded lanes)."""
    from cso.onnx import kernels
    x = np.random.default_rng(6).standard_normal((2, 13, 7, 9)).astype(np.float32)
    blocked = cso.Blocked.from_nchw(x).data
    n, blocks, h, w, lanes = blocked.shape
    values = np.ones(blocks * lanes, np.float32)
    gate = np.ones((n, blocks, 1, 1, lanes), np.float32)
    calls = [((n, 13, h, w), unblock_into),
             ((n, 13, 1, 1), lambda x, out: kernels.blocked_global_pool("max", x, out, 2)),
             ((n, blocks, 1, 1, lanes),
              lambda x, out: kernels.blocked_global_pool("average", x, out, 2)),
             (blocked.shape, lambda x, out: kernels.blocked_affine(x, out, values, values,
                                                                   True, 2)),
             (blocked.shape, lambda x, out: kernels.blocked_gate(x, gate, out, 2))]
    for kind, bounds in (("max", None), ("average", ((-1, 8), (-2, 10)))):
        calls.append(((n, blocks, 4, 5, lanes), lambda x, out, kind=kind, bounds=bounds:
                      kernels.pool(kind, x, out, (3, 3), (2, 2), (1, 1), (1, 2), bounds, 2)))
    failure = calls_stay_inside(calls, blocked, at)
    assert failure is None, f"arrays flush at their {at}: {failure}"


def test_groups_merged_onto_blocks_keep_a_model_blocked():
    """A grouped convolution of half a block a group, in pairs, runs blocked in a model where
    the host's record merges its groups onto blocks (``cso.layouts.merges_in_whole``: on
    planes up to ``merged_groups_max_plane`` outputs), so its neighbours' values stay blocked;
    in odd numbers (a merge padded with a zero group, which reads blocks only) it reads NCHW.
    Either way the blocked run matches the NCHW one."""
    rng = np.random.default_rng(5)
    half = max(LANES // 2, 2)
    w = {}
    nodes = [
        _conv("stem", "x", "s", w, rng, 3, 6 * half),
        helper.make_node("Relu", ["s"], ["s_relu"]),
        _conv("pairs", "s_relu", "p", w, rng, 6 * half, 6 * half, group=6),
        helper.make_node("Relu", ["p"], ["p_relu"]),
        _conv("dense", "p_relu", "d", w, rng, 6 * half, 6 * half),
        helper.make_node("GlobalAveragePool", ["d"], ["y1"]),          # reads blocks
        _conv("odd", "d", "o", w, rng, 6 * half, 3 * half, kernel=1),
        _conv("odd_groups", "o", "q", w, rng, 3 * half, 3 * half, group=3),
        helper.make_node("GlobalAveragePool", ["q"], ["y2"]),
    ]
    model = make_model(nodes, [tensor("x", [1, 3, 12, 12])],
                       [tensor("y1", [1, 6 * half, 1, 1]), tensor("y2", [1, 3 * half, 1, 1])],
                       w, opset=17)
    blocked = cso.onnx.load(model)
    plain = cso.onnx.load(model, blocked=False)
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    for _ in range(2):
        for got, expected in zip(blocked.run(None, {"x": x}), plain.run(None, {"x": x})):
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    convs = {step.run.node.name: step.run.blocked for step in blocked.steps
             if isinstance(step.run, ConvStep)}
    merges = cso.layouts.merges_in_whole((6 * half, half, 3, 3), 6, (1, 6 * half, 12, 12),
                                         np.float32, (1, 1), ((1, 1), (1, 1)), (1, 1))
    assert merges == (cso.host_machine().tuning.merged_groups_max_plane >= 144)
    assert convs["pairs"] == convs["stem"] == merges and convs["dense"]
    assert not convs["odd_groups"]
    assert not cso.layouts.merges_in_whole((3 * half, half, 3, 3), 3, (1, 3 * half, 12, 12),
                                           np.float32, (1, 1), ((1, 1), (1, 1)), (1, 1))


@pytest.mark.parametrize("scale_shape", [(), (1, 2 * LANES, 1, 1)])
def test_a_scale_by_a_constant_between_blocked_convolutions(scale_shape):
    """A Mul by a constant (a scalar, or per channel) after an activation (so not folded
    into the convolution before it) on blocked values is an affine step on the blocks, not a
    squeeze-excitation gate (NF-RegNet's activation gains: the gate's run took it and
    wanted a second input)."""
    rng = np.random.default_rng(7)
    w = {"gain": rng.uniform(0.5, 2, scale_shape).astype(np.float32)}
    nodes = [
        _conv("stem", "x", "s", w, rng, 3, 2 * LANES),
        helper.make_node("Sigmoid", ["s"], ["s_act"]),
        helper.make_node("Mul", ["s_act", "gain"], ["scaled"]),
        _conv("next", "scaled", "n", w, rng, 2 * LANES, 2 * LANES),
        helper.make_node("GlobalAveragePool", ["n"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [1, 3, 10, 10])], [tensor("y", [1, 2 * LANES, 1, 1])],
                       w, opset=17)
    blocked = cso.onnx.load(model)
    plain = cso.onnx.load(model, blocked=False)
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(blocked(x), plain(x), rtol=2e-5, atol=2e-5)
    assert any(isinstance(step.run, BlockedAffine) for step in blocked.steps)
    assert all(isinstance(step.run, ConvStep) and step.run.blocked for step in blocked.steps
               if isinstance(step.run, ConvStep))
