"""Small ONNX graphs built by hand for the tests (the nine light models, their random-weight
copies, onnxruntime sessions and the error measure come from ``bench.models``)."""
from onnx import TensorProto, helper, numpy_helper


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
