"""cso.onnx end to end: the nine light models against onnxruntime (their own constant weights
and random ones), what the loader fuses and frees, its load-time errors, feeds and threads."""
import weakref

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import cso  # noqa: E402
import cso.onnx  # noqa: E402
from cso.onnx import UnsupportedModel  # noqa: E402
from cso.onnx import model as model_module  # noqa: E402
from cso.onnx.conv import ConvStep  # noqa: E402

from bench.models import (MODELS, model_path, onnxruntime_session, random_weights,  # noqa: E402
                          relative_error)

from .onnx_models import make_model, tensor  # noqa: E402

TOLERANCE = 1e-4   # max |cso - onnxruntime| / max |onnxruntime|


def assert_matches_onnxruntime(proto, feeds, model=None):
    model = model or cso.onnx.load(proto)
    ours = model.run(None, feeds)
    theirs = onnxruntime_session(proto, 1).run(None, feeds)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert relative_error(a, b) <= TOLERANCE
    return model


@pytest.mark.parametrize("weights", ["constant", "random"])
@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_onnxruntime(rng, name, weights):
    proto = onnx.load(model_path(name))
    if weights == "random":
        proto = random_weights(proto, seed=int(rng.integers(1 << 30)))
    elif proto.graph.node[-1].op_type == "Softmax":
        # all-equal weights give all-equal logits of 1e11 to 1e31, whose softmax is decided by
        # rounding alone (onnxruntime's own optimised and unoptimised runs disagree): compare
        # the logits instead
        del proto.graph.output[:]
        proto.graph.output.append(helper.make_empty_tensor_value_info(proto.graph.node[-1].input[0]))
    model = cso.onnx.load(proto)
    (input_name,) = model.input_names
    x = rng.standard_normal(model.inputs[input_name][0]).astype(np.float32)
    assert_matches_onnxruntime(proto, {input_name: x}, model)
    labels = [step.label for step in model.steps]
    assert sum("Conv" in label.split("+") for label in labels) == sum(
        node.op_type == "Conv" for node in proto.graph.node)
    # every BatchNormalization and Scale layer (Mul, Add by constants) is fused: into a Conv,
    # or into one affine step with the Relu after it
    assert not {"BatchNormalization", "Mul", "Add", "Add+Relu"} & set(labels)


def conv_chain(rng, tail, conv_attrs=None, weight_shape=(6, 4, 3, 3), x_shape=(2, 4, 9, 11),
               extra_outputs=()):
    """Conv (random weight and bias) followed by ``tail``: a list of (op_type, constant inputs
    {name: array}, attrs); returns (model, feeds)."""
    k = weight_shape[0]
    inits = {"w": rng.standard_normal(weight_shape).astype(np.float32),
             "b": rng.standard_normal(k).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y0"], **(conv_attrs or {}))]
    for i, (op, constants, attrs) in enumerate(tail):
        inits.update(constants)
        nodes.append(helper.make_node(op, [f"y{i}"] + list(constants), [f"y{i + 1}"], **attrs))
    outputs = [helper.make_empty_tensor_value_info(f"y{len(tail)}")]
    outputs += [helper.make_empty_tensor_value_info(name) for name in extra_outputs]
    model = make_model(nodes, [tensor("x", list(x_shape))], outputs, inits)
    feed_shape = [1 if isinstance(d, str) else d for d in x_shape]
    return model, {"x": rng.standard_normal(feed_shape).astype(np.float32)}


def batchnorm(rng, k, prefix="bn"):
    params = {f"{prefix}_s": rng.uniform(0.5, 2, k), f"{prefix}_b": rng.standard_normal(k),
              f"{prefix}_m": rng.standard_normal(k), f"{prefix}_v": rng.uniform(0.5, 2, k)}
    return ("BatchNormalization", {n: v.astype(np.float32) for n, v in params.items()},
            {"epsilon": 1e-3})


def test_conv_batchnorm_scale_relu_fold_into_one_step(rng):
    k = 6
    tail = [batchnorm(rng, k), ("Mul", {"m": rng.uniform(0.5, 2, (k, 1, 1)).astype(np.float32)}, {}),
            ("Add", {"a": rng.standard_normal((1, k, 1, 1)).astype(np.float32)}, {}),
            ("Relu", {}, {})]
    model, feeds = conv_chain(rng, tail, {"strides": [2, 1], "pads": [1, 0, 2, 1]})
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv+BatchNormalization+Mul+Add+Relu"]


def test_broadcast_that_is_not_per_channel_is_not_folded(rng):
    # a (K,) operand broadcasts along W, not along channels: left to the Mul operator
    model, feeds = conv_chain(rng, [("Mul", {"m": rng.standard_normal(9).astype(np.float32)}, {})],
                              x_shape=(1, 4, 9, 11), weight_shape=(6, 4, 3, 3))
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv", "Mul"]


def test_conv_output_read_twice_is_not_fused(rng):
    model, feeds = conv_chain(rng, [("Relu", {}, {})], extra_outputs=["y0"])
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv", "Relu"]


@pytest.mark.parametrize("attrs", [
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"auto_pad": "VALID", "dilations": [2, 1]},
    {"pads": [0, 2, 1, 0], "dilations": [1, 2]},
    {"group": 2, "pads": [1, 1, 1, 1]},
])
def test_conv_attributes(rng, attrs):
    shape = (6, 2, 3, 3) if attrs.get("group") == 2 else (6, 4, 3, 3)
    model, feeds = conv_chain(rng, [], attrs, weight_shape=shape, x_shape=(2, 4, 10, 9))
    assert_matches_onnxruntime(model, feeds)


def test_affine_chain_without_conv_and_residual_sum_relu(rng):
    """DenseNet's pre-activation (BatchNormalization, Mul, Add, Relu on a block's input) in one
    step, and ResNet's Sum + Relu in one buffer."""
    k = 4
    _, bn_inits, bn_attrs = batchnorm(rng, k)
    inits = dict(bn_inits, m=rng.uniform(0.5, 2, (k, 1, 1)).astype(np.float32),
                 a=rng.standard_normal((k, 1, 1)).astype(np.float32),
                 w=rng.standard_normal((k, k, 3, 3)).astype(np.float32))
    nodes = [helper.make_node("BatchNormalization", ["x"] + list(bn_inits), ["t0"], **bn_attrs),
             helper.make_node("Mul", ["t0", "m"], ["t1"]),
             helper.make_node("Add", ["a", "t1"], ["t2"]),
             helper.make_node("Relu", ["t2"], ["t3"]),
             helper.make_node("Conv", ["t3", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["c", "x", "t3"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, k, 7, 6])], [tensor("y", None)], inits)
    loaded = assert_matches_onnxruntime(model, {"x": rng.standard_normal((2, k, 7, 6)).astype(np.float32)})
    assert [s.label for s in loaded.steps] == ["BatchNormalization+Mul+Add+Relu", "Conv", "Sum+Relu"]


def residual_block(rng, shortcut_also_reshaped=False):
    """ResNet's pattern: r = Relu(Conv(x)); y = Relu(BN(Conv(Relu(Conv(r)))) + r);
    z = Relu(Conv(y) + Conv(y)) (a sum of two convolutions), optionally with r also read by a
    Reshape (a view of it)."""
    k = 4
    _, bn_inits, bn_attrs = batchnorm(rng, k)
    inits = dict(bn_inits, **{f"w{i}": (rng.standard_normal((k, k, 3, 3)) / 6).astype(np.float32)
                              for i in range(5)})
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w4"], ["c4"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c4"], ["t"]),
             helper.make_node("Conv", ["t", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1"] + list(bn_inits), ["b1"], **bn_attrs),
             helper.make_node("Add", ["b1", "r"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["y"]),
             helper.make_node("Conv", ["y", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["y", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["c2", "c3"], ["s2"]),
             helper.make_node("Relu", ["s2"], ["z"])]
    outputs = [tensor("z", None)]
    if shortcut_also_reshaped:
        inits["shape"] = np.array([0, -1], np.int64)
        nodes.append(helper.make_node("Reshape", ["r", "shape"], ["flat"]))
        outputs.append(tensor("flat", None))
    model = make_model(nodes, [tensor("x", [2, k, 6, 7])], outputs, inits)
    return model, {"x": rng.standard_normal((2, k, 6, 7)).astype(np.float32)}


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("also_reshaped", [False, True])
def test_residual_sums_are_added_in_the_convolution_store(rng, also_reshaped, blocked):
    """Fused the same with values NCHW or blocked; blocked, r, t and y are (ending in y's
    reorder for the NCHW-writing convolutions that read it, and r's for the Reshape)."""
    model, feeds = residual_block(rng, also_reshaped)
    loaded = assert_matches_onnxruntime(model, feeds, cso.onnx.load(model, blocked=blocked))
    expected = ["Conv+Relu", "Conv+Relu", "Conv+BatchNormalization+Add+Relu", "Conv",
                "Conv+Sum+Relu"]
    if blocked:
        expected.insert(3, "Reorder")
        if also_reshaped:
            expected.insert(1, "Reorder")
    assert [s.label for s in loaded.steps if s.label != "Reshape"] == expected
    residual_steps = [s for s in loaded.steps if "Add" in s.label or "Sum" in s.label]
    # the shortcut r is summed in its own array unless a view of it (the Reshape) may live on
    # (blocked, the Reshape reads r's reorder, a copy)
    assert [s.run.in_place for s in residual_steps] == [blocked or not also_reshaped, True]
    for _ in range(2):   # reused arrays: a second run gives the same answer
        assert_matches_onnxruntime(model, feeds, loaded)


@pytest.mark.parametrize("channels, groups", [(1, 1), (3, 3)])
def test_residual_after_a_depthwise_convolution_stays_a_sum(rng, channels, groups):
    """Depthwise plans (one input channel per group, groups=1 included) cannot add in their
    store: the Add runs on its own."""
    inits = {"w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=groups),
             helper.make_node("Add", ["c", "x"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, channels, 5, 6])], [tensor("y", None)], inits)
    loaded = assert_matches_onnxruntime(
        model, {"x": rng.standard_normal((1, channels, 5, 6)).astype(np.float32)})
    assert [s.label for s in loaded.steps] == ["Conv", "Add"]


def in_threads(count, work):
    """``work(i)`` on ``count`` threads started together; {i: its result}, after checking that
    none raised (an exception in a thread is reported here, not lost)."""
    import threading
    barrier, results, errors = threading.Barrier(count), {}, []

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as err:
            errors.append(err)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    return results


def test_concurrent_loads_and_runs_agree(rng):
    """Threads loading models at once, then running one model at once: each run's reused
    arrays are its own (an in-place residual included), every result the same."""
    model, _ = residual_block(rng)
    inputs = [rng.standard_normal((2, 4, 6, 7)).astype(np.float32) for _ in range(4)]
    loaded = in_threads(4, lambda i: cso.onnx.load(model))
    expected = [loaded[0](x) for x in inputs]
    results = in_threads(8, lambda i: [loaded[0](inputs[i % 4]) for _ in range(5)])
    for i, outs in results.items():
        for out in outs:
            np.testing.assert_array_equal(out, expected[i % 4])
    assert all(np.array_equal(m(inputs[0]), expected[0]) for m in loaded.values())


def test_residual_that_is_the_input_or_a_graph_input_is_copied_not_overwritten(rng):
    inits = {"w": rng.standard_normal((3, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 4, 4])], [tensor("y", None)], inits)
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    before = x.copy()
    loaded = assert_matches_onnxruntime(model, {"x": x})
    assert [s.label for s in loaded.steps] == ["Conv+Add"] and not loaded.steps[0].run.in_place
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("attrs, c_shape, label", [
    ({"transB": 1}, (5,), "Gemm+Relu"),
    ({"alpha": 0.5, "beta": 2.0}, (1, 5), "Gemm+Relu"),
    ({"transB": 1, "beta": 0.0}, (), "Gemm+Relu"),
    ({}, None, "Gemm+Relu"),
    ({"transB": 1}, (3, 5), "Gemm"),          # C per element: NumPy's Gemm, then Relu
    ({"transA": 1}, (5,), "Gemm"),
])
def test_gemm_with_constant_b_runs_as_a_convolution(rng, attrs, c_shape, label):
    m, k, n = 3, 7, 5
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    inits = {"b": rng.standard_normal((n, k) if attrs.get("transB") else (k, n)).astype(np.float32)}
    inputs = ["a", "b"]
    if c_shape is not None:
        inits["c"] = rng.standard_normal(c_shape).astype(np.float32)
        inputs.append("c")
    nodes = [helper.make_node("Gemm", inputs, ["g"], **attrs), helper.make_node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [tensor("a", list(a_shape))], [tensor("y", None)], inits)
    loaded = assert_matches_onnxruntime(model, {"a": rng.standard_normal(a_shape).astype(np.float32)})
    assert loaded.steps[0].label == label


def test_gemm_of_another_dtype_than_its_b_is_refused(rng):
    """A float64 A against a float32 constant B: an error naming the node, not a cast."""
    b = rng.standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["a", "b"], ["y"], name="my_gemm")]
    model = make_model(nodes, [tensor("a", [2, 4], onnx.TensorProto.DOUBLE)],
                       [tensor("y", None, onnx.TensorProto.DOUBLE)], {"b": b})
    with pytest.raises(cso.onnx.UnsupportedModel, match=r"'my_gemm'.*float64.*float32"):
        cso.onnx.load(model)


def test_values_are_freed_after_their_last_use(rng):
    model = cso.onnx.load(random_weights(onnx.load(model_path("squeezenet"))))
    produced = [name for step in model.steps for name in step.outputs if name]
    freed = [name for step in model.steps for name in step.frees]
    assert sorted(freed) == sorted(set(produced + model.input_names) - set(model.output_names))
    for index, step in enumerate(model.steps):   # freed where last read (or made), not earlier
        for name in step.frees:
            assert name in step.inputs + step.outputs
            assert not any(name in later.inputs for later in model.steps[index + 1:])


def test_batches_and_input_shapes(rng):
    model, _ = conv_chain(rng, [("Relu", {}, {})], x_shape=("n", 4, 9, 11))
    with pytest.raises(ValueError, match="open dimensions"):
        cso.onnx.load(make_model(list(model.graph.node), [tensor("x", [1, 4, "h", 11])],
                                 list(model.graph.output), {i.name: onnx.numpy_helper.to_array(i)
                                                            for i in model.graph.initializer}))
    loaded = cso.onnx.load(model)   # an open batch dimension loads as 1, runs any batch
    assert loaded.inputs["x"][0] == (1, 4, 9, 11)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 4, 9, 11)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)
    assert cso.onnx.load(model, input_shapes={"x": (5, 4, 9, 11)}).inputs["x"][0] == (5, 4, 9, 11)


def test_feeds_are_checked(rng):
    model, feeds = conv_chain(rng, [])
    loaded = cso.onnx.load(model)
    np.testing.assert_array_equal(loaded(feeds["x"]), loaded.run(None, feeds)[0])
    with pytest.raises(ValueError, match=r"missing \['x'\], unknown \['z'\]"):
        loaded.run(None, {"z": feeds["x"]})
    with pytest.raises(TypeError, match="input 'x' must have dtype float32, got float64"):
        loaded.run(None, {"x": feeds["x"].astype(np.float64)})
    with pytest.raises(ValueError, match=r"input 'x' must have shape \(batch, 4, 9, 11\)"):
        loaded.run(None, {"x": feeds["x"][:, :, :5]})
    with pytest.raises(TypeError, match="must be a numpy.ndarray"):
        loaded.run(None, {"x": feeds["x"].tolist()})
    with pytest.raises(ValueError, match=r"output_names \['x'\] are not outputs"):
        loaded.run(["x"], feeds)


def test_blas_runs_on_cso_threads(rng, monkeypatch):
    """The model's NumPy parts (here a Gemm of two inputs, which NumPy runs) use BLAS on
    cso.get_num_threads() threads: in the run that records the program, and in the later
    runs, where they follow its replay."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not threadpoolctl.threadpool_info():
        pytest.skip("NumPy's BLAS is not visible to threadpoolctl")
    nodes = [helper.make_node("Gemm", ["x", "b"], ["y"], transB=1)]
    model = cso.onnx.load(make_model(nodes, [tensor("x", [2, 8]), tensor("b", [3, 8])],
                                     [tensor("y", None)]))
    seen = []
    step = model.steps[0]
    run = step.run
    monkeypatch.setattr(step, "run", lambda *a: seen.append(
        {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"})
        or run(*a))
    before = cso.get_num_threads()
    try:
        for threads in (1, 2):
            cso.set_num_threads(threads)
            for _ in range(2):
                seen.clear()
                model.run(None, {"x": np.ones((2, 8), np.float32),
                                 "b": np.ones((3, 8), np.float32)})
                assert seen == [{threads}]
    finally:
        cso.set_num_threads(before)


@pytest.mark.parametrize("case, message", [
    ("unknown_op", r"node 'n0' \(Einsum\): operator Einsum is not supported"),
    ("conv_weight_not_constant", r"\(Conv\): the weight must be a constant"),
    ("conv_1d", r"\(Conv\): only 2-D convolutions"),
    ("conv_unknown_attribute", r"\(Conv\): attribute\(s\) \['foo'\] not supported"),
    ("conv_pads_and_auto_pad", r"\(Conv\): pads \[1, 1, 1, 1\] given with auto_pad 'SAME_UPPER'"),
    ("other_domain", r"com.microsoft.FusedConv\): operators of domain 'com.microsoft'"),
])
def test_load_time_errors(rng, case, message):
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    inputs, inits = [tensor("x", [1, 3, 8, 8])], {"w": w}
    node = {
        "unknown_op": helper.make_node("Einsum", ["x"], ["y"], name="n0", equation="ij->ji"),
        "conv_weight_not_constant": helper.make_node("Conv", ["x", "x"], ["y"]),
        "conv_1d": helper.make_node("Conv", ["x", "w1"], ["y"]),
        "conv_unknown_attribute": helper.make_node("Conv", ["x", "w"], ["y"], foo=1),
        "conv_pads_and_auto_pad": helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER",
                                                   pads=[1, 1, 1, 1]),
        "other_domain": helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft"),
    }[case]
    if case == "conv_1d":
        inits["w1"] = w[:, :, 0]
    with pytest.raises(UnsupportedModel, match=message):
        cso.onnx.load(make_model([node], inputs, [tensor("y", None)], inits))


def test_load_takes_a_path_and_rejects_other_things(tmp_path, rng):
    model, feeds = conv_chain(rng, [])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    np.testing.assert_array_equal(cso.onnx.load(path)(feeds["x"]), cso.onnx.load(model)(feeds["x"]))
    with pytest.raises(TypeError, match="model must be a path or an onnx.ModelProto"):
        cso.onnx.load(42)



def test_a_loaded_constant_lives_until_its_step_packed_it(tmp_path, rng, monkeypatch):
    """Loading from a path, neither the proto nor the graph's constants outlive their use: when
    the load's first run reaches the second convolution, the first one's weight, packed, is
    gone (VGG-19 peaked at the proto, its constants and the packed filters at once)."""
    model, feeds = conv_chain(rng, [("Conv", {"w2": rng.standard_normal((5, 6, 1, 1)).astype(
        np.float32)}, {})])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    weights, alive_at_second = {}, []
    read = model_module.read

    def read_and_watch(proto, shapes, path=None):
        graph = read(proto, shapes, path)
        weights.update((name, weakref.ref(graph.constants[name])) for name in ("w", "w2"))
        return graph

    call = ConvStep.__call__

    def watched_call(step, x, *args, **kwargs):
        if step.node.inputs[1] == "w2" and step.conv is None:
            alive_at_second.append(weights["w"]() is not None)
        return call(step, x, *args, **kwargs)
    monkeypatch.setattr(model_module, "read", read_and_watch)
    monkeypatch.setattr(ConvStep, "__call__", watched_call)
    loaded = cso.onnx.load(path)
    assert alive_at_second == [False]
    assert weights["w2"]() is None   # packed too, once the load returned
    np.testing.assert_array_equal(loaded(feeds["x"]), cso.onnx.load(model)(feeds["x"]))

def dense_block(rng, layers=3, k=3, concat_is_output=False, conv_is_output=False,
                every_feature=False):
    """DenseNet's pattern: each layer's input is the Concat of the block input and every
    earlier layer's output (a Concat of the previous Concat and a Conv, or with
    ``every_feature``, as torchvision exports it, of a 1x1 Conv's of the input, s, and every
    Conv so far), and each Concat is also read by the next layer's BatchNormalization, Relu
    and Conv; then a Conv of the last Concat (with ``every_feature``, a GlobalAveragePool,
    which reads it blocked). Optionally the last Concat, or the first Conv, is also a graph
    output."""
    inits, nodes, channels, previous, features = {}, [], k, "x", []
    if every_feature:
        inits["w_s"] = (rng.standard_normal((k, k, 1, 1)) / 4).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", "w_s"], ["s"]))
        previous, features = "s", ["s"]
    for i in range(layers):
        _, bn_inits, bn_attrs = batchnorm(rng, channels, prefix=f"bn{i}")
        inits.update(bn_inits)
        inits[f"w{i}"] = (rng.standard_normal((k, channels, 3, 3)) / 4).astype(np.float32)
        nodes += [helper.make_node("BatchNormalization", [previous] + list(bn_inits), [f"b{i}"],
                                   **bn_attrs),
                  helper.make_node("Relu", [f"b{i}"], [f"r{i}"]),
                  helper.make_node("Conv", [f"r{i}", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Concat", features + [f"c{i}"] if every_feature
                                   else [previous, f"c{i}"], [f"cat{i}"], axis=1)]
        previous, channels = f"cat{i}", channels + k
        features.append(f"c{i}")
    if every_feature:
        nodes.append(helper.make_node("GlobalAveragePool", [previous], ["y"]))
    else:
        inits["w_out"] = (rng.standard_normal((2, channels, 1, 1)) / 4).astype(np.float32)
        nodes.append(helper.make_node("Conv", [previous, "w_out"], ["y"]))
    outputs = [tensor("y", None)] + ([tensor(previous, None)] if concat_is_output else []) + \
        ([tensor("c0", None)] if conv_is_output else [])
    return make_model(nodes, [tensor("x", ["N", k, 6, 7])], outputs, inits)


@pytest.mark.parametrize("concat_is_output, conv_is_output", [(False, False), (True, False),
                                                               (False, True)])
def test_concat_inputs_are_made_in_the_concat_array(rng, monkeypatch, concat_is_output,
                                                    conv_is_output):
    from cso.onnx import concat
    in_place = []   # per Concat input at batch 1: found in its channels already

    def same_memory(a, b, check=concat._same_memory):
        in_place.append(check(a, b))
        return in_place[-1]
    monkeypatch.setattr(concat, "_same_memory", same_memory)
    model = dense_block(rng, concat_is_output=concat_is_output, conv_is_output=conv_is_output)
    loaded = cso.onnx.load(model)
    # each value is made in its Concat's channels; cat0 and cat1 in cat2's first ones
    expected = {"c0": ("cat0", 3, 6), "cat0": ("cat1", 0, 6), "c1": ("cat1", 6, 9),
                "cat1": ("cat2", 0, 9), "c2": ("cat2", 9, 12)}
    if concat_is_output:   # the caller keeps cat2: nothing is made in it
        del expected["cat1"], expected["c2"]
    if conv_is_output:
        del expected["c0"]
    assert {name: (s.concat, s.first, s.stop) for name, s in loaded.slots.items()} == expected
    for batch in (1, 2, 1):   # slices at batch 1, copies at 2; reused arrays the second time
        x = rng.standard_normal((batch, 3, 6, 7)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)   # (a replay: no Concat step runs)
        in_place.clear()
        loaded.time_by_operator({"x": x})   # step by step
        # at batch 1 every placed value is found in its channels; at 2 the Concats copy all
        assert in_place.count(True) == (len(expected) if batch == 1 else 0)


@pytest.mark.parametrize("outputs, expected, found", [
    ((False, False), {"cat0": ("cat2", 0, 6), "cat1": ("cat2", 0, 9), "s": ("cat2", 0, 3),
                      "c0": ("cat2", 3, 6), "c1": ("cat2", 6, 9), "c2": ("cat2", 9, 12)},
     2 + 3 + 4),
    # the caller keeps cat2: cat1 is the last Concat made of reused arrays
    ((True, False), {"s": ("cat1", 0, 3), "c0": ("cat1", 3, 6), "c1": ("cat1", 6, 9)}, 3),
    # c0 is made in an array of its own: each Concat copies it
    ((False, True), {"cat0": ("cat2", 0, 6), "cat1": ("cat2", 0, 9), "s": ("cat2", 0, 3),
                     "c1": ("cat2", 6, 9), "c2": ("cat2", 9, 12)}, 1 + 2 + 3)])
@pytest.mark.parametrize("blocked", [False, True])
def test_concats_of_every_feature_are_the_last_ones_leading_channels(rng, monkeypatch, outputs,
                                                                    expected, found, blocked):
    """torchvision's DenseNet: each Concat reads every feature so far; each is made as the
    leading channels of the last one's array, where every feature is made (blocked too, when
    the features are whole blocks)."""
    from cso.layouts import block_size
    from cso.onnx import concat
    in_place = []   # per Concat input at batch 1: found in its channels already

    def same_memory(a, b, check=concat._same_memory):
        in_place.append(check(a, b))
        return in_place[-1]
    monkeypatch.setattr(concat, "_same_memory", same_memory)
    k = block_size(np.float32) if blocked else 3
    model = dense_block(rng, k=k, concat_is_output=outputs[0], conv_is_output=outputs[1],
                        every_feature=True)
    loaded = cso.onnx.load(model, blocked=blocked)
    held = blocked and not any(outputs)   # (a graph output is NCHW, so is every value it ties)
    assert [s.run.blocked for s in loaded.steps if isinstance(s.run, ConvStep)] == [held] * 4
    scale = k if held else 1   # slots in blocks
    assert {name: (s.concat, s.first, s.stop) for name, s in loaded.slots.items()} == {
        name: (whole, first * k // 3 // scale, stop * k // 3 // scale)
        for name, (whole, first, stop) in expected.items()}
    for batch in (1, 2, 1):
        x = rng.standard_normal((batch, k, 6, 7)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)
        in_place.clear()
        loaded.time_by_operator({"x": x})
        assert in_place.count(True) == (found if batch == 1 else 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_concat_step_copies_into_out_or_buffers_and_checks_shapes(rng, threads):
    from cso.buffers import Buffers
    from cso.onnx.concat import ConcatStep
    xs = [rng.standard_normal((3, c, 5, 7)).astype(np.float32) for c in (2, 17, 1)]
    xs[1] = xs[1][:, ::-1]   # not C-contiguous: copied by NumPy
    expected = np.concatenate(xs, axis=1)
    before = cso.get_num_threads()
    cso.set_num_threads(threads)
    try:
        (made,) = ConcatStep()(*xs, buffers=Buffers())
        np.testing.assert_array_equal(made, expected)
        out = np.full((3, 20, 5, 7), np.nan, np.float32)
        assert ConcatStep()(*xs, out=out)[0] is out
        np.testing.assert_array_equal(out, expected)
        for wrong in ([xs[0], xs[2][:, :, :4]], [xs[0], xs[2].astype(np.float64)]):
            with pytest.raises(ValueError, match="Concat along the channels of"):
                ConcatStep()(*wrong, buffers=Buffers())
        with pytest.raises(ValueError, match="into"):
            ConcatStep()(*xs, out=out[:, :19])
    finally:
        cso.set_num_threads(before)


@pytest.mark.parametrize("shape, axis", [((2, 3, 5), 1), ((2, 3, 5), -2), ((2, 3, 4, 5), 2),
                                         ((6,), 0), ((2, 3), -1)])
def test_concat_step_along_any_axis(rng, shape, axis):
    """Along the channels (axis 1 of two or more dimensions, however spelled) compiled copies
    into an array from the buffers or ``out``; along another axis NumPy's, into ``out`` when
    given: the values of ``np.concatenate`` either way."""
    from cso.buffers import Buffers
    from cso.onnx.concat import ConcatStep
    sizes = (2, 1, 3)
    xs = []
    for size in sizes:
        part = list(shape)
        part[axis] = size
        xs.append(rng.standard_normal(part).astype(np.float32))
    expected = np.concatenate(xs, axis=axis)
    step = ConcatStep(axis)
    (made,) = step(*xs, buffers=Buffers())
    np.testing.assert_array_equal(made, expected)
    out = np.full(expected.shape, np.nan, np.float32)
    assert step(*xs, out=out)[0] is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(step(*xs)[0], expected)


def test_concat_input_read_in_place_by_a_residual_is_copied(rng):
    """A value a convolution adds into in place is not made in a Concat's array (the sum
    would overwrite the Concat's channels)."""
    inits = {f"w{i}": (rng.standard_normal((3, 3, 3, 3)) / 4).astype(np.float32)
             for i in range(3)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "a"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 5, 6])], [tensor("y", None),
                                                           tensor("cat", None)], inits)
    loaded = assert_matches_onnxruntime(
        model, {"x": rng.standard_normal((1, 3, 5, 6)).astype(np.float32)})
    assert loaded.slots == {}


def shuffle_unit(rng, pool="AveragePool", pool_attrs=None, conv_read_twice=False):
    """ShuffleNet's strided unit: Concat(Conv(x) with no Relu, a pool of Relu(x)), then
    Relu, then a Conv; optionally the first Conv's output is also a graph output."""
    inits = {"w0": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
             "w1": (rng.standard_normal((2, 8, 1, 1)) / 4).astype(np.float32)}
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(pool, ["r"], ["p"], **dict(attrs, **(pool_attrs or {}))),
             helper.make_node("Concat", ["a", "p"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["cat_relu"]),
             helper.make_node("Conv", ["cat_relu", "w1"], ["y"])]
    outputs = [tensor("y", None)] + ([tensor("a", None)] if conv_read_twice else [])
    return make_model(nodes, [tensor("x", ["N", 3, 9, 10])], outputs, inits)


@pytest.mark.parametrize("pool", ["AveragePool", "MaxPool"])
def test_relu_after_concat_is_taken_by_its_inputs_and_pool_made_in_place(rng, monkeypatch,
                                                                         pool):
    """The Relu after the Concat goes into the Conv that makes its first input (the pool's
    input is >= 0 already), and the pool makes its output in the Concat's channels: no Relu
    step, and nothing copied at batch 1."""
    from cso.onnx import concat
    in_place = []

    def same_memory(a, b, check=concat._same_memory):
        in_place.append(check(a, b))
        return in_place[-1]
    monkeypatch.setattr(concat, "_same_memory", same_memory)
    model = shuffle_unit(rng, pool)
    loaded = cso.onnx.load(model)
    assert [s.label for s in loaded.steps] == ["Conv+Relu", "Relu", pool, "Concat", "Conv"]
    assert {name: (s.concat, s.first, s.stop) for name, s in loaded.slots.items()} == {
        "a": ("cat", 0, 5), "p": ("cat", 5, 8)}
    for batch in (1, 3, 1):   # made in place at batch 1, copied at 3
        x = rng.standard_normal((batch, 3, 9, 10)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)   # (the second batch 1: a replay)
        in_place.clear()
        loaded.time_by_operator({"x": x})   # step by step
        assert in_place == [batch == 1] * 2


@pytest.mark.parametrize("case", ["conv read twice", "dilated max pool", "average of any sign"])
def test_relu_after_concat_stays_when_its_inputs_cannot_take_it(rng, case):
    """The Relu stays a step when the Conv's output is read elsewhere too (the Relu would
    change it there), or when the pool's output may be negative: a dilated max pool (whose
    window may miss the image: a -inf), an average of values of any sign."""
    model = shuffle_unit(rng, "MaxPool" if case == "dilated max pool" else "AveragePool",
                         {"dilations": [2, 2], "pads": [2] * 4} if case == "dilated max pool" else None,
                         conv_read_twice=case == "conv read twice")
    if case == "average of any sign":   # the pool reads x, not Relu(x)
        model.graph.node[2].input[0] = "x"
    x = rng.standard_normal((1, 3, 9, 10)).astype(np.float32)
    labels = [s.label for s in assert_matches_onnxruntime(model, {"x": x}).steps]
    assert labels[labels.index("Concat"):] == ["Concat", "Relu", "Conv"]
    assert labels[0] == "Conv"


def test_relu_of_a_value_already_relud_is_dropped(rng):
    tail = [("Relu", {}, {}), ("MaxPool", {}, {"kernel_shape": [2, 2]}), ("Relu", {}, {}),
            ("Conv", {"w1": rng.standard_normal((2, 6, 1, 1)).astype(np.float32)}, {})]
    model, feeds = conv_chain(rng, tail)
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv+Relu", "MaxPool", "Conv"]


def channel_shuffle_model(rng, batch_dim=0, shuffled_also_read=False, c=12, g=3):
    """ShuffleNet's unit: a grouped 1x1 Conv, the channel shuffle (Reshape, Transpose,
    Reshape) and a depthwise 3x3 Conv; optionally the shuffled value also a graph output."""
    inits = {"w0": rng.standard_normal((c, c // g, 1, 1)).astype(np.float32),
             "w1": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "b1": rng.standard_normal(c).astype(np.float32),
             "split": np.array([batch_dim, g, c // g, 6, 7], np.int64),
             "back": np.array([batch_dim, c, 6, 7], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], group=g),
             helper.make_node("Reshape", ["a", "split"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "back"], ["s"]),
             helper.make_node("Conv", ["s", "w1", "b1"], ["y"], group=c, pads=[1, 1, 1, 1])]
    outputs = [tensor("y", None)] + ([tensor("s", None)] if shuffled_also_read else [])
    model = make_model(nodes, [tensor("x", [batch_dim or "N", c, 6, 7])], outputs, inits)
    return model, {"x": rng.standard_normal((1, c, 6, 7)).astype(np.float32)}


def test_channel_shuffle_read_by_the_depthwise_conv(rng):
    """The shuffle's copy is fused away: the depthwise Conv reads the grouped Conv's output
    through it, as onnxruntime's shuffled copy, at any batch when the Reshapes copy it."""
    model, feeds = channel_shuffle_model(rng)
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv", "ChannelShuffle+Conv"]
    x3 = rng.standard_normal((3, 12, 6, 7)).astype(np.float32)
    assert relative_error(loaded.run(None, {"x": x3})[0],
                          onnxruntime_session(model, 1).run(None, {"x": x3})[0]) <= TOLERANCE


def test_channel_shuffle_left_alone_or_batch_kept(rng):
    model, feeds = channel_shuffle_model(rng, shuffled_also_read=True)
    loaded = assert_matches_onnxruntime(model, feeds)   # the shuffled value is an output
    assert [s.label for s in loaded.steps] == ["Conv", "Reshape", "Transpose", "Reshape", "Conv"]
    model, feeds = channel_shuffle_model(rng, batch_dim=1)   # the Reshapes fix the batch
    loaded = assert_matches_onnxruntime(model, feeds)
    assert [s.label for s in loaded.steps] == ["Conv", "ChannelShuffle+Conv"]
    with pytest.raises(UnsupportedModel, match=r"Reshape.*fixes the batch at 1"):
        loaded.run(None, {"x": np.zeros((2, 12, 6, 7), np.float32)})


def test_concurrent_first_runs_on_new_batch_sizes_agree(rng):
    """Threads that run one model at once on batch sizes it was not loaded for (each step
    prepares and binds those shapes under them, the shuffle-fused depthwise Conv included)
    get what one thread gets from a copy of the model."""
    model, _ = channel_shuffle_model(rng)
    shared, alone = cso.onnx.load(model), cso.onnx.load(model)
    inputs = [rng.standard_normal((2 + i % 3, 12, 6, 7)).astype(np.float32) for i in range(8)]
    results = in_threads(8, lambda i: shared(inputs[i]))
    for i, x in enumerate(inputs):
        np.testing.assert_array_equal(results[i], alone(x))
