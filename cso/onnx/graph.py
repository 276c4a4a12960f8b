"""From an ONNX graph to the steps a model runs: constants folded, each Conv made a ``ConvStep``
with the affine operators and Relu after it fused in, per-channel affine chains and residual
sums fused into one NumPy step each, every other node an operator of ``ops``."""
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .conv import ConvStep
from .node import Node, UnsupportedModel
from .ops import OPERATORS

AFFINE = ("BatchNormalization", "Mul", "Add")


@dataclass
class Step:
    label: str                 # the operators it runs, e.g. "Conv+BatchNormalization+Relu"
    run: Callable              # run(*inputs) -> tuple of outputs
    inputs: list[str]
    outputs: list[str]
    frees: list[str] = field(default_factory=list)   # values last used here, dropped after it


@dataclass
class Graph:
    nodes: list[Node]
    constants: dict            # name -> ndarray, known at load time
    inputs: dict               # name -> (shape with None for unknown dims, dtype)
    outputs: list[str]
    ranks: dict                # name -> (rank, channels) where shape inference knows them


def read(proto):
    """The Graph of an ``onnx.ModelProto``."""
    from onnx import helper, numpy_helper, shape_inference
    opsets = {o.domain: o.version for o in proto.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 0))
    if not opset:
        raise UnsupportedModel("the model imports no version of the default ONNX domain")
    graph = proto.graph
    if graph.sparse_initializer:
        raise UnsupportedModel("sparse initializers are not supported")
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = {}
    for value in graph.input:
        if value.name in constants:
            continue   # an initializer listed as an input (ONNX before IR 4): a constant
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        inputs[value.name] = (dims, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    nodes = [Node.from_proto(p, opset) for p in graph.node]
    ranks = {}
    inferred = shape_inference.infer_shapes(proto).graph
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and len(dims) > 1 and dims[1].dim_value:
            ranks[value.name] = (len(dims), dims[1].dim_value)
    return Graph(nodes, constants, inputs, [o.name for o in graph.output], ranks)


def operator(node, constants):
    """The run function of a node that has no fused form."""
    build = OPERATORS.get(node.op_type)
    if build is None:
        raise node.error(f"operator {node.op_type} is not supported (supported: Conv, "
                         f"{', '.join(sorted(OPERATORS))})")
    return build(node, constants)


def fold_constants(graph):
    """Evaluate, at load time, every node whose inputs are all constants; return the others."""
    known = set(graph.constants) | set(graph.inputs)
    remaining = []
    for node in graph.nodes:
        missing = [name for name in node.inputs if name and name not in known]
        if missing:
            raise node.error(f"input(s) {missing} are produced by no earlier node (the graph "
                             f"must be in topological order)")
        known.update(node.outputs)
        if node.op_type != "Conv" and all(not name or name in graph.constants
                                          for name in node.inputs):
            run = operator(node, graph.constants)
            values = run(*(graph.constants.get(name) for name in node.inputs))
            graph.constants.update((n, v) for n, v in zip(node.outputs, values) if n)
        else:
            remaining.append(node)
    graph.nodes = remaining


def per_channel(value, channels):
    """``value``'s broadcast over an (N, ``channels``, H, W) tensor as a (channels,) float64
    vector, or None if it is not one value per channel (or does not keep the shape)."""
    if value is None or value.ndim > 4:
        return None
    shape = (1,) * (4 - value.ndim) + value.shape
    if shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,))


def affine_of(node, graph, data, channels):
    """(scale, shift) per channel if ``node`` computes ``data * scale + shift`` with constant
    per-channel operands and one output, else None."""
    if node.op_type not in AFFINE or len([n for n in node.outputs if n]) != 1:
        return None
    if node.op_type == "BatchNormalization":
        node.only("epsilon", "momentum", "spatial", "training_mode")
        if node.attr("spatial", 1) != 1 or node.attr("training_mode", 0) != 0:
            return None   # left to the operator, which says what it does not support
        params = [graph.constants.get(n) for n in node.inputs[1:5]]
        if node.inputs[0] != data or len(params) != 4 or any(
                p is None or p.shape != (channels,) for p in params):
            return None
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        factor = scale / np.sqrt(var + node.attr("epsilon", 1e-5))
        return factor, bias - mean * factor
    if len(node.inputs) != 2 or data not in node.inputs:
        return None
    other = per_channel(graph.constants.get(node.inputs[1 - node.inputs.index(data)]), channels)
    if other is None:
        return None
    ones, zeros = np.ones(channels), np.zeros(channels)
    return (other, zeros) if node.op_type == "Mul" else (ones, other)


class AffineStep:
    """``x * scale + shift`` per channel of an NCHW tensor, then Relu if fused: one pass for a
    chain such as BatchNormalization, Mul, Add, Relu that has no Conv before it."""

    def __init__(self, channels):
        self.scale, self.shift = np.ones(channels), np.zeros(channels)
        self.relu = False

    def fold_affine(self, scale, shift):
        self.scale, self.shift = self.scale * scale, self.shift * scale + shift

    def __call__(self, x):
        shape = (1, -1, 1, 1)
        out = np.multiply(x, self.scale.astype(x.dtype).reshape(shape))
        out += self.shift.astype(x.dtype).reshape(shape)
        if self.relu:
            np.maximum(out, 0, out=out)
        return (out,)


def sum_relu(*terms):
    """Add or Sum, then Relu in the same buffer."""
    out = np.add(terms[0], terms[1]) if len(terms) > 1 else np.array(terms[0])
    for term in terms[2:]:
        out = out + term
    np.maximum(out, 0, out=out)
    return (out,)


class Fuser:
    """Walks the folded graph once, fusing each head node with the single-consumer chain after
    it."""

    def __init__(self, graph):
        self.graph = graph
        self.consumers = defaultdict(list)
        for node in graph.nodes:
            for name in set(node.inputs):
                if name:
                    self.consumers[name].append(node)
        self.fused = set()   # ids of the nodes already part of a step

    def only_consumer(self, name):
        """The node that alone reads ``name`` (not a graph output), or None."""
        users = self.consumers.get(name, [])
        if len(users) == 1 and name not in self.graph.outputs:
            return users[0]
        return None

    def fuse_chain(self, head, out, channels, labels, node=None):
        """Fold into ``head`` the affine operators, then a Relu, that read ``out`` (from
        ``node``, else from ``out``'s only consumer), each the only reader of the one before;
        return the chain's output name."""
        node = node or self.only_consumer(out)
        while node is not None:
            if node.op_type == "Relu" and not node.attrs:
                head.relu = True
                self.fused.add(id(node))
                labels.append("Relu")
                return node.outputs[0]
            affine = affine_of(node, self.graph, out, channels)
            if affine is None:
                return out
            head.fold_affine(*affine)
            self.fused.add(id(node))
            labels.append(node.op_type)
            out = node.outputs[0]
            node = self.only_consumer(out)
        return out

    def step(self, node):
        if node.op_type == "Conv":
            return self.conv_step(node)
        if node.op_type in AFFINE:
            data = next((n for n in node.inputs if n not in self.graph.constants), None)
            rank, channels = self.graph.ranks.get(data, (0, 0))
            if rank == 4 and affine_of(node, self.graph, data, channels) is not None:
                head, labels = AffineStep(channels), []
                out = self.fuse_chain(head, data, channels, labels, node)
                return Step("+".join(labels), head, [data], [out])
        if node.op_type in ("Add", "Sum") and not node.attrs:
            relu = self.only_consumer(node.outputs[0])
            if relu is not None and relu.op_type == "Relu" and not relu.attrs:
                self.fused.add(id(relu))
                return Step(f"{node.op_type}+Relu", sum_relu, node.inputs, relu.outputs)
        return Step(node.op_type, operator(node, self.graph.constants), node.inputs,
                    node.outputs)

    def conv_step(self, node):
        constants = self.graph.constants
        if len(node.inputs) < 2 or node.inputs[1] not in constants:
            raise node.error("the weight must be a constant of the model (an initializer or "
                             "computed from constants)")
        has_bias = len(node.inputs) > 2 and node.inputs[2]
        if has_bias and node.inputs[2] not in constants:
            raise node.error("the bias must be a constant of the model")
        head = ConvStep(node, constants[node.inputs[1]],
                        constants[node.inputs[2]] if has_bias else None)
        labels = ["Conv"]
        out = self.fuse_chain(head, node.outputs[0], head.channels, labels)
        return Step("+".join(labels), head, [node.inputs[0]], [out])


def build_steps(graph):
    """The steps that compute ``graph.outputs`` from its inputs, each value dropped after its
    last use."""
    read_names = {name for node in graph.nodes for name in node.inputs} | set(graph.outputs)
    for node in graph.nodes:   # optional outputs no one reads (Dropout's mask) are not made
        node.outputs[1:] = [name if name in read_names else "" for name in node.outputs[1:]]
    fold_constants(graph)
    fuser = Fuser(graph)
    steps = []
    for node in graph.nodes:
        if id(node) not in fuser.fused:
            fuser.fused.add(id(node))
            steps.append(fuser.step(node))
    last_use = {}   # a value no step reads (Dropout's mask, say) is dropped where it is made
    for index, step in enumerate(steps):
        for name in step.inputs + step.outputs:
            last_use[name] = index
    for name, index in last_use.items():
        if name and name not in graph.outputs and name not in graph.constants:
            steps[index].frees.append(name)
    return steps
