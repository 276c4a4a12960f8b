"""Small ONNX graphs built by hand for the tests, and one-node models of an operator checked
against onnxruntime and the onnx reference evaluator (the nine light models, their
random-weight copies, onnxruntime sessions and the error measure come from
``bench.models``)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from bench.models import onnxruntime_session
from cso.onnx.node import Node
from cso.onnx.ops import CAPTURES_CONSTANTS, OPERATORS

try:
    import onnxruntime
except ImportError:
    onnxruntime = None


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


def _model(op, inputs, outputs, attrs, opset, feeds, constants):
    node = helper.make_node(op, inputs, outputs, name=f"my_{op.lower()}", **attrs)
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for name, a in feeds.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs if name],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8 if opset <= 18 else 9)


def build(op, attrs=None, opset=13, inputs=("x",), outputs=("y",), constants=None):
    """Our operator for a one-node model."""
    constants = constants or {}
    model = _model(op, list(inputs), list(outputs), attrs or {}, opset, {}, constants)
    return OPERATORS[op](Node.from_proto(model.graph.node[0], opset), constants)


def check(op, feeds, attrs=None, opset=13, inputs=None, outputs=("y",), constants=None,
          engines=("ort", "reference"), rtol=1e-6, atol=1e-6, exact=False):
    """Run ``op`` ourselves and on each engine; assert equal values (``exact``: bit for bit),
    shapes and dtypes of the named outputs; return our outputs. Our run gets None for the
    constants an operator that captures them keeps, as a model's step does."""
    constants = constants or {}
    inputs = list(feeds) + list(constants) if inputs is None else list(inputs)
    model = _model(op, inputs, list(outputs), attrs or {}, opset, feeds, constants)
    run = OPERATORS[op](Node.from_proto(model.graph.node[0], opset), constants)
    captures = op in CAPTURES_CONSTANTS
    args = [feeds[name] if name in feeds
            else None if not name or (captures and index > 0) else constants[name]
            for index, name in enumerate(inputs)]
    snapshot = [None if a is None else np.array(a, copy=True) for a in args]
    ours = run(*args)
    for before, after in zip(snapshot, args):   # no operator writes into its inputs
        if before is not None:
            np.testing.assert_array_equal(after, before)
    assert len(ours) == len(outputs)
    named = [y for y, name in zip(ours, outputs) if name]
    for engine in engines:
        if engine == "ort":
            if onnxruntime is None:
                continue
            expected = onnxruntime_session(model, 1).run(None, feeds)
        else:
            expected = ReferenceEvaluator(model).run(None, feeds)
        for got, want in zip(named, expected, strict=True):
            want = np.asarray(want)
            assert isinstance(got, np.ndarray), engine
            assert got.dtype == want.dtype, (engine, got.dtype, want.dtype)
            assert got.shape == want.shape, (engine, got.shape, want.shape)
            if exact or want.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want, err_msg=engine)
            else:
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=engine)
    return ours
