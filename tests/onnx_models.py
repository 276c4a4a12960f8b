"""Helpers for the ONNX tests: the light models shipped inside the onnx package, a copy of one
with random weights, onnxruntime as the reference, and small graphs built by hand."""
import os

import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light_model(name):
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        f"light_{name}.onnx")
    return onnx.load(path)


def _random_value(consumers, uses, shape, dtype, rng):
    """Random weights scaled so that activations stay of order one through a deep network:
    He-scaled filters, positive BatchNormalization scales and variances, small shifts."""
    node, index = uses[0]
    if node.op_type == "Unsqueeze":   # a Scale layer's operand: what reads the Unsqueeze decides
        return _random_value(consumers, consumers[node.output[0]], shape, dtype, rng)
    if (node.op_type, index) in (("Conv", 1), ("Gemm", 1)):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(dtype)
    if (node.op_type, index) in (("BatchNormalization", 1), ("BatchNormalization", 4)) or \
            node.op_type == "Mul":
        return rng.uniform(0.5, 1.5, shape).astype(dtype)
    return (0.1 * rng.standard_normal(shape)).astype(dtype)


def randomized(model, rng):
    """A copy of ``model`` whose ConstantOfShape weights (every light model builds its weights
    so, all one value, which would hide layout bugs) are random initializers."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    kept = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            fill = numpy_helper.to_array(node.attribute[0].t)
            value = _random_value(consumers, consumers[node.output[0]],
                                  tuple(shapes[node.input[0]]), fill.dtype, rng)
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return model


def onnxruntime_outputs(model, feeds):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def relative_error(actual, expected):
    """max |actual - expected| / max |expected|, after checking shape and dtype."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    scale = np.abs(expected.astype(np.float64)).max()
    return np.abs(actual.astype(np.float64) - expected).max() / scale


def tensor(name, shape, elem_type=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(nodes, inputs, outputs, initializers=(), opset=13):
    """A model of ``nodes``; ``inputs``/``outputs`` are value infos, ``initializers`` a dict
    {name: array}."""
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(v, n) for n, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model
