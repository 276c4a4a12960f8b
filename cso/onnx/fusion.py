"""What the loader fuses, per ONNX operator type: the table ``ROLES`` that the fusion pass
(``graph.Fuser``) reads, so that an operator or activation joins fusion in one entry here.

A fused step is led by a head (a Conv, a Gemm with a constant B, a per-channel affine chain
with no head before it, a sum) and runs the nodes after it that its store can apply: the
per-channel affine maps folded into a head's filters and bias, a sum's other term added in a
convolution's store, an activation applied as the store writes. Each store applies the
activations it has code for (``STORES``); a value >= 0 needs no Relu, which is then dropped.

A new activation is a ``Role(activation=StoreActivation(...))`` entry in ``ROLES``; its node runs
as its operator (registered in ``ops``) where nothing takes it. The entry's ``stores`` are
those with code for it: ``"conv"`` takes every ``cso.Activation`` (``cso.Conv2d(activation=)``),
``"affine"`` (``kernels.affine``) and ``"sum"`` (``graph.sum_relu``) Relu only. The chains of
``COMPOSITES`` (SiLU, HardSwish, GELU as exporters write them) are taken by the conv store as
well, as one activation.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .ops_activation import constant_activation

# the stores that apply activations, by the steps that use them
STORES = {
    "conv": "cso.Conv2d(activation=...), for Conv, Gemm and MatMul (conv.ConvStep, "
            "conv.GemmStep, conv.MatMulStep)",
    "affine": "kernels.affine, for a per-channel affine chain (graph.AffineStep)",
    "sum": "graph.sum_relu, for an Add or Sum",
}


@dataclass(frozen=True)
class Head:
    """An operator whose step fuses the nodes after it, each the only reader of the one
    before."""
    store: str               # the key of STORES its step applies an activation in
    affine: bool = False     # folds the per-channel affine maps after it
    residual: bool = False   # adds the other term of a sum after it in its store


@dataclass(frozen=True)
class StoreActivation:
    """An elementwise operator a step can apply as it stores its output."""
    stores: frozenset        # the keys of STORES whose store applies it
    nonnegative: bool = False   # its outputs are >= 0 (or NaN): a Relu after it is dropped
    identity_on_nonnegative: bool = False   # f(x) = x for x >= 0: dropped after a value >= 0
    # (node, constants) -> the cso.Activation a node of its type computes, or None when a
    # store cannot apply it (a Relu with attributes, a Clip with bounds made at run time: left
    # to the operator)
    of: Callable = constant_activation


@dataclass(frozen=True)
class Role:
    """What one operator type is to fusion: any of these roles, or none."""
    head: Optional[Head] = None
    # (node, data, constants, channels) -> (scale, shift) per channel when the node computes
    # ``data * scale + shift`` with constant operands, else None
    affine: Optional[Callable] = None
    activation: Optional[StoreActivation] = None
    residual: bool = False   # a sum: its other term added in a head's store, or a sum step
    # node -> whether its outputs are >= 0 when its inputs are
    keeps_sign: Optional[Callable] = None


def per_channel(value, channels):
    """``value``'s broadcast over an (N, ``channels``, H, W) tensor as a (channels,) float64
    vector, or None if it is not one value per channel (or does not keep the shape)."""
    if value is None or value.ndim > 4:
        return None
    shape = (1,) * (4 - value.ndim) + value.shape
    if shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,))


def _batch_normalization(node, data, constants, channels):
    node.only("epsilon", "momentum", "spatial", "training_mode")
    if node.attr("spatial", 1) != 1 or node.attr("training_mode", 0) != 0:
        return None   # left to the operator, which says what it does not support
    params = [constants.get(n) for n in node.inputs[1:5]]
    if node.inputs[0] != data or len(params) != 4 or any(
            p is None or p.shape != (channels,) for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    factor = scale / np.sqrt(var + node.attr("epsilon", 1e-5))
    return factor, bias - mean * factor


def _other_operand(node, data, constants, channels):
    """The constant per-channel operand of a binary node that reads ``data``, or None."""
    if len(node.inputs) != 2 or data not in node.inputs:
        return None
    return per_channel(constants.get(node.inputs[1 - node.inputs.index(data)]), channels)


def _scale(node, data, constants, channels):
    other = _other_operand(node, data, constants, channels)
    return None if other is None else (other, np.zeros(channels))


def _shift(node, data, constants, channels):
    other = _other_operand(node, data, constants, channels)
    return None if other is None else (np.ones(channels), other)


def _always(node):
    return True


def _undilated(node):
    """A max pool's every window holds an element of the image (pads < kernel, checked by the
    operator) unless dilated past it."""
    return node.attr("dilations", [1, 1]) == [1, 1]


RELU = StoreActivation(frozenset({"conv", "affine", "sum"}), nonnegative=True,
                       identity_on_nonnegative=True)
CONV = frozenset({"conv"})

ROLES = {
    "Conv": Role(head=Head("conv", affine=True, residual=True)),
    "Gemm": Role(head=Head("conv")),   # with a constant B: a 1x1 convolution (conv.gemm_as_conv)
    # with a constant B: a 1x1 convolution on channels last, its bias Add in the store too
    # (conv.matmul_as_conv)
    "MatMul": Role(head=Head("conv")),
    "BatchNormalization": Role(affine=_batch_normalization),
    "Mul": Role(affine=_scale),
    "Add": Role(affine=_shift, residual=True),
    "Sum": Role(residual=True),
    "Relu": Role(activation=RELU),
    "Clip": Role(activation=StoreActivation(CONV)),
    "LeakyRelu": Role(activation=StoreActivation(CONV)),
    "Sigmoid": Role(activation=StoreActivation(CONV, nonnegative=True)),
    "HardSigmoid": Role(activation=StoreActivation(CONV, nonnegative=True)),
    "HardSwish": Role(activation=StoreActivation(CONV)),
    "Tanh": Role(activation=StoreActivation(CONV)),
    "Gelu": Role(activation=StoreActivation(CONV)),
    "MaxPool": Role(keeps_sign=_undilated),
    "AveragePool": Role(keeps_sign=_always),
    "GlobalAveragePool": Role(keeps_sign=_always),
    "GlobalMaxPool": Role(keeps_sign=_always),
    "Concat": Role(keeps_sign=_always),
}

# chains of elementwise nodes that exporters write for one activation of the chain's input x,
# each node the only reader of the one before; a node is (op type, its attributes, its other
# operand: "x", a constant scalar, or none); a chain runs as one compiled activation step, or
# in a convolution's store (``COMPOSITE_STORES``)
COMPOSITES = {
    "silu": [("Sigmoid", {}, None), ("Mul", {}, "x")],
    "hardswish": [("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, None), ("Mul", {}, "x")],
    "gelu": [("Div", {}, math.sqrt(2)), ("Erf", {}, None), ("Add", {}, 1.0), ("Mul", {}, "x"),
             ("Mul", {}, 0.5)],
}

COMPOSITE_STORES = CONV   # the stores that apply a chain's activation

# the heads that are no operator: a per-channel affine chain with no head before it, a sum
AFFINE_CHAIN = Head("affine", affine=True)
SUM = Head("sum")

_NONE = Role()


def role(op_type):
    """The Role of ``op_type`` (one with no part in fusion when the table has none)."""
    return ROLES.get(op_type, _NONE)


def activation_of(node, constants):
    """(the StoreActivation ``node`` is, the ``cso.Activation`` it computes) (``constants``:
    the graph's), or None."""
    activation = role(node.op_type).activation
    computed = activation and activation.of(node, constants)
    return None if computed is None else (activation, computed)


def affine_of(node, data, constants, channels):
    """(scale, shift) per channel if ``node`` computes ``data * scale + shift`` with constant
    per-channel operands and one output, else None."""
    affine = role(node.op_type).affine
    if affine is None or len([n for n in node.outputs if n]) != 1:
        return None
    return affine(node, data, constants, channels)


def keeps_sign(node):
    """Whether ``node``'s outputs are >= 0 when its inputs are."""
    check = role(node.op_type).keeps_sign
    return check is not None and check(node)


def composite_of(node, only_consumer, constants):
    """(the activation kind, the chain's nodes) of the ``COMPOSITES`` chain that starts at
    ``node``, or None. ``only_consumer(name)`` is the node that alone reads a value (None when
    several do, or it is a graph output)."""
    x = node.inputs[0] if node.inputs else ""
    for kind, chain in COMPOSITES.items():
        nodes, current, previous = [], node, x
        for op_type, attrs, operand in chain:
            if (current is None or current.op_type != op_type
                    or not _operands_match(current, previous, operand, x, constants)
                    or not _attrs_match(current, attrs)):
                break
            nodes.append(current)
            previous = current.outputs[0]
            if len(nodes) < len(chain):
                current = only_consumer(previous)
        else:
            return kind, nodes
    return None


def _operands_match(node, previous, operand, x, constants):
    """Whether ``node`` reads ``previous`` (first, for a Div) and ``operand`` besides."""
    inputs = list(node.inputs)
    if len([o for o in node.outputs if o]) != 1 or previous not in inputs:
        return False
    if operand is None:
        return inputs == [previous]
    if len(inputs) != 2 or (node.op_type == "Div" and inputs[0] != previous):
        return False
    other = inputs[1] if inputs[0] == previous and inputs[1] != previous else inputs[0]
    if operand == "x":
        return other == x and previous != x
    value = constants.get(other)
    return (value is not None and value.size == 1 and value.dtype.kind == "f"
            and abs(float(value.reshape(())) - operand) <= 1e-6 * abs(operand))


def _attrs_match(node, attrs):
    """Whether ``node`` has exactly the attributes ``attrs`` (floats as ONNX keeps them, in
    float32: within 1e-6)."""
    return set(node.attrs) == set(attrs) and all(
        isinstance(node.attrs[name], float) and math.isclose(node.attrs[name], value,
                                                             rel_tol=1e-6)
        for name, value in attrs.items())
