"""From an ONNX graph to the steps a model runs: constants folded, each Conv made a ``ConvStep``
with the affine operators and Relu after it fused in, per-channel affine chains and residual
sums fused into one NumPy step each, every other node an operator of ``ops``. What fuses is
decided by the operator types' roles in ``fusion.ROLES`` and the graph's structure."""
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import Activation, activate, get_num_threads
from . import concat, fusion, kernels
from .conv import ConvStep, gemm_as_conv, matmul_as_conv, matmul_bias
from .node import Node, UnsupportedModel
from .ops import CAPTURES_CONSTANTS, OPERATORS, TAKES_OUT


@dataclass
class Step:
    ops: tuple[str, ...]       # the operators it runs, e.g. ("Conv", "BatchNormalization", "Relu")
    run: Callable              # run(*inputs) -> tuple of outputs
    inputs: list[str]
    outputs: list[str]
    buffered: bool = False     # run takes ``buffers=`` (a ``Buffers``) for its output array
    takes_out: bool = False    # run takes ``out=``, an array to make its output in
    frees: list[str] = field(default_factory=list)   # values last used here, dropped after it

    @property
    def label(self):
        """The operators it runs as printed, e.g. "Conv+BatchNormalization+Relu"."""
        return "+".join(self.ops)


@dataclass
class Graph:
    nodes: list[Node]
    constants: dict            # name -> ndarray, known at load time
    inputs: dict               # name -> (shape with None for unknown dims, dtype)
    outputs: list[str]
    shapes: dict               # name -> shape (at the loaded batch), where inference knows it


def read(proto, input_shapes, path=None):
    """The Graph of an ``onnx.ModelProto`` whose inputs get ``input_shapes`` {name: shape}.
    ``path``: the file the proto was read from without its external data, which is read here
    (``external_array``)."""
    from onnx import checker, helper, numpy_helper
    from onnx.external_data_helper import uses_external_data
    graph = proto.graph
    if not graph.output:
        raise UnsupportedModel("the model has no outputs (an empty or truncated file?)")
    opsets = {o.domain: o.version for o in proto.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 0))
    if not opset:
        raise UnsupportedModel("the model imports no version of the default ONNX domain")
    if graph.sparse_initializer:
        raise UnsupportedModel("sparse initializers are not supported")
    try:
        constants = {t.name: external_array(t, path) if path and uses_external_data(t)
                     else numpy_helper.to_array(t) for t in graph.initializer}
    except checker.ValidationError as err:   # external data that onnx.load did not read
        raise UnsupportedModel(f"an initializer's data is not in the model ({err}): load it "
                               f"from its path, with its external data file beside it") from None
    inputs = {}
    for value in graph.input:
        if value.name not in constants:   # else an initializer listed as an input (IR < 4)
            elem_type = value.type.tensor_type.elem_type
            inputs[value.name] = (tuple(input_shapes[value.name]),
                                  np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    nodes = [Node.from_proto(p, opset) for p in graph.node]
    made = set(constants) | set(inputs) | {name for node in nodes for name in node.outputs}
    unmade = [value.name for value in graph.output if value.name not in made]
    if unmade:
        raise UnsupportedModel(f"output(s) {unmade} are made by no node, input or initializer")
    return Graph(nodes, constants, inputs, [o.name for o in graph.output],
                 _shapes(proto, inputs, constants))


def external_array(tensor, path):
    """The values of ``tensor``, an initializer of the model file ``path`` held in an external
    data file beside it (the dynamo exporter's ``model.onnx.data``), read straight into an
    array: ``onnx.load`` copies them into the proto, from which ``numpy_helper.to_array``
    copies them again (ResNeXt-50 peaked at both)."""
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo
    info = ExternalDataInfo(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    where = os.path.normpath(info.location)
    if dtype.kind not in "fiub" or os.path.isabs(where) or where.startswith(os.pardir):
        return numpy_helper.to_array(tensor, os.path.dirname(path))   # (onnx's checks)
    count = int(np.prod(tensor.dims, dtype=np.int64))
    try:
        with open(os.path.join(os.path.dirname(path), where), "rb") as f:
            f.seek(info.offset or 0)
            values = np.fromfile(f, dtype.newbyteorder("<"), count)
    except OSError as err:
        raise UnsupportedModel(f"{path}: its weights cannot be read: {err}") from None
    if values.size != count:
        raise UnsupportedModel(f"{path}: its weights cannot be read: {tensor.name} has "
                               f"{values.size} of its {count} values in {info.location}")
    return values.astype(dtype, copy=False).reshape(tuple(tensor.dims))


def _shapes(proto, inputs, constants):
    """{name: shape} of the values ONNX shape inference can tell, inferred on a copy
    of the graph that carries only the small constants (a shape for Reshape, say): the large
    ones enter as typed inputs, not copied."""
    from onnx import helper, shape_inference
    graph = proto.graph
    small = [t for t in graph.initializer if constants[t.name].size <= 64]
    large = [helper.make_tensor_value_info(t.name, t.data_type, t.dims)
             for t in graph.initializer if constants[t.name].size > 64]
    typed = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)
             for name, (shape, dtype) in inputs.items()]
    light = helper.make_model(helper.make_graph(graph.node, "shapes", typed + large, graph.output,
                                                small), opset_imports=proto.opset_import)
    light.ir_version = max(proto.ir_version, 4)   # initializers need not be inputs
    inferred = shape_inference.infer_shapes(light).graph
    shapes = {}
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


def operator(node, constants):
    """The run function of a node that has no fused form."""
    if node.op_type not in OPERATORS:
        raise node.error(f"operator {node.op_type} is not supported (supported: Conv, "
                         f"{', '.join(sorted(OPERATORS))})")
    return Operator(node, constants)


class Operator:
    """An operator of ``ops`` for ``node``, callable as its run function. The run function is a
    closure, which does not pickle: an Operator pickles as its node and the constants the node
    reads, and is built again from them when loaded."""

    def __init__(self, node, constants):
        self.node = node
        self.constants = {name: constants[name] for name in node.inputs if name in constants}
        self.run = OPERATORS[node.op_type](node, constants)

    def __call__(self, *inputs, **options):
        return self.run(*inputs, **options)

    @property
    def jobs_only(self):
        """Whether a call given ``buffers`` or ``out`` does nothing but run compiled kernels
        whose arguments depend on its arrays' addresses and shapes alone (see
        ``cso.onnx.program``): an operator that takes ``out=``, unless its run says otherwise
        (a Clip whose bounds are inputs made at run time)."""
        return self.node.op_type in TAKES_OUT and getattr(self.run, "jobs_only", True)

    def __reduce__(self):
        return Operator, (self.node, self.constants)


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


class AffineStep:
    """``x * scale + shift`` per channel of an NCHW tensor, then Relu if fused: one pass for a
    chain such as BatchNormalization, Mul, Add, Relu that has no Conv before it."""

    jobs_only = True   # a call runs the compiled kernel alone (see ``cso.onnx.program``)

    def __init__(self, node, channels):
        self.node = node   # the chain's first, named in errors
        self.scale, self.shift = np.ones(channels), np.zeros(channels)
        self.activation = None   # Relu, if fused (the only one kernels.affine applies)
        self._cast = {}   # dtype -> (scale, shift) in it

    def fold_affine(self, scale, shift):
        self.scale, self.shift = self.scale * scale, self.shift * scale + shift

    def __call__(self, x, buffers=None):
        if x.dtype.kind != "f" or not kernels.compiles(x.dtype):
            raise self.node.error(f"input of dtype {x.dtype} is not supported: float32, float64")
        cast = self._cast.get(x.dtype)
        if cast is None:   # scale and shift in the input's dtype, once
            cast = self._cast[x.dtype] = tuple(v.astype(x.dtype) for v in (self.scale,
                                                                          self.shift))
        x = np.ascontiguousarray(x)
        out = buffers.get(x.shape, x.dtype) if buffers else np.empty_like(x)
        return (kernels.affine(x, out, *cast, self.activation is not None,
                               get_num_threads()),)


class ActivationStep:
    """A chain of elementwise nodes that computes one activation of its input (``fusion.
    COMPOSITES``: SiLU as Sigmoid and Mul, GELU as Div, Erf, Add, Mul, Mul) as one compiled
    pass (``cso.activate``)."""

    jobs_only = True   # a call runs the compiled kernel alone (see ``cso.onnx.program``)

    def __init__(self, node, kind):
        self.node = node   # the chain's first, named in errors
        self.activation = Activation(kind)

    def __call__(self, x, buffers=None, out=None):
        if x.dtype not in (np.float32, np.float64):
            raise self.node.error(f"input of dtype {x.dtype} is not supported: float32, float64")
        if out is None:
            out = buffers.get(x.shape, x.dtype) if buffers else np.empty_like(x)
        return (activate(x, self.activation, out),)


def sum_relu(*terms, buffers=None):
    """Add or Sum, then Relu in the same buffer."""
    shape = np.broadcast_shapes(*(t.shape for t in terms))
    out = buffers.get(shape, terms[0].dtype) if buffers else np.empty(shape, terms[0].dtype)
    np.copyto(out, terms[0])
    for term in terms[1:]:
        out += term
    np.maximum(out, 0, out=out)
    return (out,)


def _batch_of(reshape, constants):
    """What a Reshape's constant shape makes of dimension 0: 0 when it copies (0) or infers
    (-1) it, else the batch it fixes; None when the shape is not a constant."""
    target = constants.get(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    if target is None or target.ndim != 1 or target.size == 0:
        return None
    first = int(target[0])
    return 0 if first == -1 or (first == 0 and not reshape.attr("allowzero", 0)) else first


def _apply(run, activation):
    """Have ``run`` (a ConvStep, GemmStep, MatMulStep or AffineStep) apply ``activation`` (a
    ``cso.Activation``) as it stores its output."""
    run.activation = activation


# the steps that can take the activation after the Concat they feed, by their store
_TAKERS = {ConvStep: "conv", AffineStep: "affine"}


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
        # id of an Add -> (run, head, ops, x, residual) of the Conv step that adds into its
        # other input, made where the Add is
        self.deferred = {}
        self.made = {}       # value -> the step that makes it (see ``note``)
        # values >= 0 (or NaN): made by an activation such as Relu, or by an operator that
        # keeps the sign (a pool, a Concat) of such values
        self.nonnegative = set()
        self.shuffles = self.channel_shuffles()   # id of a Conv -> what it reads, shuffled

    def channel_shuffles(self):
        """{id of a depthwise Conv: (value, g, (batch, first Reshape))} for each one whose
        input is ShuffleNet's channel shuffle of ``value`` (N, C, H, W): a Reshape to (N, g,
        C/g, H, W), a Transpose (0, 2, 1, 3, 4) and a Reshape back, each read by the next
        alone. The Conv reads ``value`` through the shuffle (``Conv2d(channel_shuffle=g)``)
        and the three nodes, a copy, are fused away. ``batch`` is the batch size the Reshapes
        fix (the onnx package's ShuffleNet says 1), which the Conv then requires as they
        would, or 0 when they copy or infer it."""
        made_by = {name: node for node in self.graph.nodes for name in node.outputs}
        shapes, constants = self.graph.shapes, self.graph.constants
        found = {}
        for conv in self.graph.nodes:
            chain = [conv]
            for op_type in ("Reshape", "Transpose", "Reshape"):
                node = made_by.get(chain[-1].inputs[0]) if chain[-1].inputs else None
                if (node is None or node.op_type != op_type
                        or self.only_consumer(node.outputs[0]) is not chain[-1]):
                    break
                chain.append(node)
            if conv.op_type != "Conv" or len(chain) < 4:
                continue
            back, transpose, split = chain[1:]
            source = split.inputs[0]
            shape, grouped = shapes.get(source), shapes.get(split.outputs[0])
            weight = constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
            if (shape is None or len(shape) != 4 or grouped is None or len(grouped) != 5
                    or weight is None or weight.ndim != 4 or weight.shape[1] != 1
                    or conv.attr("group", 1) != shape[1]
                    or grouped[1] < 2 or shape[1] % grouped[1]
                    or tuple(grouped) != (shape[0], grouped[1], shape[1] // grouped[1])
                    + tuple(shape[2:])
                    or shapes.get(back.outputs[0]) != shape
                    or transpose.attr("perm") != [0, 2, 1, 3, 4]):
                continue
            batches = {_batch_of(reshape, constants) for reshape in (split, back)}
            if None in batches or len(batches - {0}) > 1:
                continue
            found[id(conv)] = (source, int(grouped[1]), (max(batches), split))
            self.fused.update(id(node) for node in (back, transpose, split))
        return found

    def only_consumer(self, name):
        """The node that alone reads ``name`` (not a graph output), or None."""
        users = self.consumers.get(name, [])
        if len(users) == 1 and name not in self.graph.outputs:
            return users[0]
        return None

    def fuse_after(self, run, out, head, ops, channels=0, node=None):
        """Fold into ``run``, the step of ``head``, what reads ``out`` that it takes: the
        per-channel affine maps (from ``node``, else from ``out``'s only reader), then an
        activation, each the only reader of the one before; their op types join ``ops``.
        Return the output name of the last."""
        node = node or self.only_consumer(out)
        while head.affine and node is not None:
            affine = fusion.affine_of(node, out, self.graph.constants, channels)
            if affine is None:
                break
            run.fold_affine(*affine)
            self.fused.add(id(node))
            ops.append(node.op_type)
            out = node.outputs[0]
            node = self.only_consumer(out)
        return self.fuse_activation(run, out, head.store, ops)

    def fuse_activation(self, run, out, store, ops):
        """Fuse into ``run``, whose store is ``store``, the activation that alone reads
        ``out`` if that store applies it; return the output name."""
        activation, out = self.take_activation(out, store, ops)
        if activation is not None:
            _apply(run, activation)
        return out

    def take_activation(self, out, store, ops):
        """(the ``cso.Activation``, its output name) of the node that alone reads ``out``, or
        of the ``fusion.COMPOSITES`` chain whose nodes are all that read it, if ``store``
        applies it, the nodes then fused and their op types added to ``ops``; else (None,
        ``out``)."""
        node = self.only_consumer(out)
        found = fusion.activation_of(node, self.graph.constants) if node is not None else None
        if found is not None and store in found[0].stores:
            role, activation = found
            if role.nonnegative:
                self.nonnegative.add(node.outputs[0])
            chain = [node]
        else:
            activation, chain = self.composite_reading(out, store)
            if activation is None:
                return None, out
        self.fused.update(id(n) for n in chain)
        ops.extend(n.op_type for n in chain)
        return activation, chain[-1].outputs[0]

    def composite_reading(self, out, store):
        """(the ``cso.Activation``, the chain) of a ``fusion.COMPOSITES`` chain of ``out``
        whose nodes are all that read ``out`` (SiLU: a Sigmoid and the Mul by ``out``), if
        ``store`` applies it; else (None, None)."""
        readers = self.consumers.get(out, [])
        if store not in fusion.COMPOSITE_STORES or out in self.graph.outputs:
            return None, None
        for node in readers:
            composite = (fusion.composite_of(node, self.only_consumer, self.graph.constants)
                         if node.inputs[:1] == [out] else None)
            if composite is not None and {id(n) for n in readers} <= {
                    id(n) for n in composite[1]}:
                return Activation(composite[0]), composite[1]
        return None, None

    def note(self, step):
        """Record the outputs of ``step``, the last step made: who makes them, and whether
        an operator's are >= 0 (a fused activation's are recorded as it is fused)."""
        for name in step.outputs:
            self.made[name] = step
        if not isinstance(step.run, Operator):
            return
        node = step.run.node
        found = fusion.activation_of(node, self.graph.constants)
        data = [name for name in step.inputs if name and name not in self.graph.constants]
        if (found is not None and found[0].nonnegative) or (
                fusion.keeps_sign(node) and all(name in self.nonnegative for name in data)):
            self.nonnegative.update(name for name in step.outputs if name)

    def applied(self, found, node):
        """Whether ``node``'s activation of its input (``found``: its StoreActivation and
        ``cso.Activation``) is that input already: a value >= 0 that the activation leaves as
        it is, or a Concat's output read by ``node`` alone whose inputs are such values or are
        made by a Conv (or per-channel affine) step that takes the activation instead
        (ShuffleNet's Relu after each Concat)."""
        activation, computed = found
        data = node.inputs[0]
        if activation.identity_on_nonnegative and data in self.nonnegative:
            return True
        concat = self.made.get(data)
        if concat is None or concat.ops != ("Concat",) or self.only_consumer(data) is not node:
            return False
        takers = []
        for name in concat.inputs:
            step = self.made.get(name)
            if activation.identity_on_nonnegative and name in self.nonnegative:
                continue
            if (step is None or _TAKERS.get(type(step.run)) not in activation.stores
                    or step.run.activation is not None or step.outputs != [name]
                    or self.only_consumer(name) is not concat.run.node):
                return False
            takers.append(step)
        for step in takers:
            _apply(step.run, computed)
            step.ops += (node.op_type,)
            if activation.nonnegative:
                self.nonnegative.update(step.outputs)
        if activation.nonnegative:
            self.nonnegative.add(data)
        return True

    def alias(self, old, new, node):
        """Let the nodes after ``node`` read ``new`` for ``old`` (``node``'s output, which
        equals its input ``new``)."""
        for later in self.graph.nodes:
            later.inputs[:] = [new if name == old else name for name in later.inputs]
        readers = [n for n in self.consumers[new] if n is not node] + self.consumers.pop(old, [])
        self.consumers[new] = list({id(n): n for n in readers}.values())

    def step(self, node):
        """The step of ``node`` with what fuses into it, or None: ``node`` elided, or its step
        deferred to the sum its store adds."""
        role = fusion.role(node.op_type)
        found = fusion.activation_of(node, self.graph.constants)
        if (found is not None and node.outputs[0] not in self.graph.outputs
                and self.applied(found, node)):
            self.alias(node.outputs[0], node.inputs[0], node)
            return None
        if node.op_type == "Conv":
            return self.conv_step(node, role.head)
        if id(node) in self.deferred:
            return self.residual_step(node)
        if node.op_type == "Gemm":
            run = gemm_as_conv(node, self.graph.constants)
            if run is not None:
                ops = [node.op_type]
                out = self.fuse_after(run, node.outputs[0], role.head, ops)
                return Step(tuple(ops), run, node.inputs[:1], [out], buffered=True)
        if node.op_type == "MatMul":
            run = matmul_as_conv(node, self.graph.constants, self.graph.shapes)
            if run is not None:
                return self.matmul_step(node, run, role.head)
        if role.affine is not None:
            data = next((n for n in node.inputs if n not in self.graph.constants), None)
            shape = self.graph.shapes.get(data, ())
            channels = shape[1] if len(shape) == 4 else 0
            if channels and fusion.affine_of(node, data, self.graph.constants,
                                             channels) is not None:
                run, ops = AffineStep(node, channels), []
                out = self.fuse_after(run, data, fusion.AFFINE_CHAIN, ops, channels, node)
                return Step(tuple(ops), run, [data], [out], buffered=True)
        composite = fusion.composite_of(node, self.only_consumer, self.graph.constants)
        if composite is not None:
            kind, chain = composite
            self.fused.update(id(n) for n in chain)
            return Step(tuple(n.op_type for n in chain), ActivationStep(node, kind),
                        node.inputs[:1], chain[-1].outputs, buffered=True, takes_out=True)
        if role.residual and not node.attrs:
            ops = [node.op_type]
            activation, out = self.take_activation(node.outputs[0], fusion.SUM.store, ops)
            if activation is not None:
                return Step(tuple(ops), sum_relu, node.inputs, [out], buffered=True)
        run = operator(node, self.graph.constants)
        # inputs the operator keeps from load time are not passed (nor kept by the model)
        inputs = [name if index == 0 or node.op_type not in CAPTURES_CONSTANTS
                  or name not in self.graph.constants else "" for index, name in enumerate(node.inputs)]
        takes_out = node.op_type in TAKES_OUT
        return Step((node.op_type,), run, inputs, node.outputs, buffered=takes_out,
                    takes_out=takes_out)

    def matmul_step(self, node, run, head):
        """The step of a MatMul by a constant (``run``, a ``conv.MatMulStep``), with the bias
        Add and the activation that alone follow it."""
        ops, out = [node.op_type], node.outputs[0]
        add = self.only_consumer(out)
        bias = matmul_bias(add, out, self.graph.constants, self.graph.shapes, run.channels)
        if bias is not None:
            run.add_bias(bias)
            self.fused.add(id(add))
            ops.append(add.op_type)
            out = add.outputs[0]
        out = self.fuse_activation(run, out, head.store, ops)
        return Step(tuple(ops), run, node.inputs[:1], [out], buffered=True)

    def conv_step(self, node, head):
        constants = self.graph.constants
        if len(node.inputs) < 2 or node.inputs[1] not in constants:
            raise node.error("the weight must be a constant of the model (an initializer or "
                             "computed from constants)")
        has_bias = len(node.inputs) > 2 and node.inputs[2]
        if has_bias and node.inputs[2] not in constants:
            raise node.error("the bias must be a constant of the model")
        run = ConvStep(node, constants[node.inputs[1]],
                       constants[node.inputs[2]] if has_bias else None)
        x, run.channel_shuffle, run.shuffle_batch = self.shuffles.get(
            id(node), (node.inputs[0], 1, (0, None)))
        ops = ["ChannelShuffle", "Conv"] if run.channel_shuffle > 1 else ["Conv"]
        out = self.fuse_after(run, node.outputs[0], head, ops, run.channels)
        add = self.only_consumer(out)
        residual = self.residual_of(run, add, out) if head.residual else None
        if residual is not None:   # the step runs where the Add is, once its other input is made
            self.deferred[id(add)] = (run, head, ops, x, residual)
            return None
        return Step(tuple(ops), run, [x], [out], buffered=True, takes_out=True)

    def residual_of(self, run, add, out):
        """The other input of ``add`` if it can be added in ``run``'s store: a sum of two
        values of one shape, after a Conv with no activation yet and not depthwise."""
        if (add is None or not fusion.role(add.op_type).residual or add.attrs
                or run.activation is not None
                or id(add) in self.deferred   # a sum of two convolutions: the first adds
                or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or run.depthwise):
            return None
        other = add.inputs[1 - add.inputs.index(out)]
        shape = self.graph.shapes.get(out)
        if shape is None or self.graph.shapes.get(other) != shape or other in self.graph.constants:
            return None
        return other

    def residual_step(self, add):
        """The Conv deferred to ``add``: its output added to the residual in its store, and
        the activation after the sum."""
        run, head, ops, x, residual = self.deferred.pop(id(add))
        run.residual = True
        ops.append(add.op_type)
        # (an affine operator after the sum would scale the residual too: an activation only)
        out = self.fuse_activation(run, add.outputs[0], head.store, ops)
        return Step(tuple(ops), run, [x, residual], [out], buffered=True, takes_out=True)


def build_steps(graph, place=None):
    """The steps that compute ``graph.outputs`` from its inputs, each value dropped after its
    last use, and the values made in their Concat's array ({name: ``concat.Slot``});
    ``place(steps, graph)``, when given, decides the values' layouts over the fused steps
    and says which it holds blocked (``layouts.place``)."""
    read_names = {name for node in graph.nodes for name in node.inputs} | set(graph.outputs)
    for node in graph.nodes:   # optional outputs no one reads (Dropout's mask) are not made
        node.outputs[1:] = [name if name in read_names else "" for name in node.outputs[1:]]
    fold_constants(graph)
    fuser = Fuser(graph)
    steps, concat_axes = [], {}
    for node in graph.nodes:
        if id(node) not in fuser.fused:
            fuser.fused.add(id(node))
            step = fuser.step(node)
            if step is not None:
                steps.append(step)
                fuser.note(step)
                if node.op_type == "Concat":
                    concat_axes[id(step)] = node.attr("axis")
    steps, blocked = place(steps, graph) if place is not None else (steps, {})
    last_use = {}   # a value no step reads (Dropout's mask, say) is dropped where it is made
    for index, step in enumerate(steps):
        for name in step.inputs + step.outputs:
            last_use[name] = index
    for name, index in last_use.items():
        if name and name not in graph.outputs and name not in graph.constants:
            steps[index].frees.append(name)
    made_by = {name: step for step in steps for name in step.outputs}
    for step in steps:
        if isinstance(step.run, ConvStep) and step.run.residual:
            # the sum is made in the residual's own array when nothing else can see it: read
            # last here, not the convolution's input, made by a step whose output is an array
            # of its own (reused buffers only), and read elsewhere by convolutions and
            # reorders only (no views of it)
            x, residual = step.inputs
            producer = made_by.get(residual)
            step.run.in_place = (residual in step.frees and x != residual and producer is not None
                                 and producer.buffered and all(
                                     other is step or isinstance(other.run, ConvStep)
                                     or other.ops == ("Reorder",)
                                     for other in steps if residual in other.inputs))
    return steps, concat.plan(steps, graph, concat_axes, blocked)
