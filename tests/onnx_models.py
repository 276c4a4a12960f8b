"""Helpers for the ONNX tests: onnxruntime as the reference, and small graphs built by hand
(the nine light models and their random-weight copies come from ``bench.models``)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


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
