"""Concat along the channels without the copy: the steps that make its inputs write them
straight into their channels of its output array.

A batch-1 NCHW array's channel slice is contiguous, so a convolution can store into it as into
an array of its own, and so can another Concat (DenseNet's concatenations grow one layer at a
time: each is the next one's first input, and all of a dense block's then live in one array,
copied once instead of once per layer). A Concat of every feature so far (torchvision's
DenseNet export) is the leading channels of the block's last Concat: it copies nothing, where
each feature was copied once per later layer. ``plan`` picks the inputs that can be made in
place; the model, at run time, hands their steps ``out=`` their slice (``Model._placed``) when
the batch is 1, and the Concat step copies only what is not already there. At other batch
sizes the slices are strided, and everything runs as without this.
"""
from dataclasses import dataclass

import numpy as np

from .. import get_num_threads
from ..jobs import data_address
from . import kernels
from .conv import ConvStep


@dataclass(frozen=True)
class Slot:
    """Where a value is made: channels [first, stop) of the Concat output ``concat``, whose
    shape after the batch dimension is ``shape`` (of a blocked output: blocks [first, stop)
    of it, (blocks, H, W, lanes))."""
    concat: str
    first: int
    stop: int
    shape: tuple


class ConcatStep:
    """Concat along ``axis``. Along the channels (axis 1 of tensors of two or more dimensions)
    in ``out=`` (its array, some inputs possibly made in it already) when the model has one
    for it, else in an array from ``buffers=``, the copies compiled jobs on the model's
    threads; along another axis (or given neither) with NumPy, into ``out=`` if given."""

    jobs_only = True   # on C-contiguous inputs (see ``cso.onnx.program``)

    def __init__(self, axis=1):
        self.axis = axis

    def __call__(self, *xs, out=None, buffers=None):
        rank = xs[0].ndim
        if (out is None and buffers is None) or rank < 2 or self.axis not in (1, 1 - rank):
            y = np.concatenate(xs, axis=self.axis)
            if out is None:
                return (y,)
            np.copyto(out, y)
            return (out,)
        shape = (xs[0].shape[0], sum(x.shape[1] for x in xs)) + xs[0].shape[2:]
        if out is None:
            out = buffers.get(shape, xs[0].dtype)
        if (out.shape != shape or any(x.dtype != out.dtype or x.ndim != rank
                                      or x.shape[:1] + x.shape[2:] != shape[:1] + shape[2:]
                                      for x in xs)):
            raise ValueError(f"Concat along the channels of {[x.shape for x in xs]} (dtypes "
                             f"{[str(x.dtype) for x in xs]}) into {out.shape} {out.dtype}")
        for x, slot in _slots(xs, out):
            if _same_memory(x, slot):
                continue
            if x.flags.c_contiguous:
                kernels.copy(x, slot, get_num_threads())
            else:
                np.copyto(slot, x)
        return (out,)

    def made_in_place(self, xs, out):
        """Whether every one of ``xs`` is in its channels of ``out`` already (nothing to copy)."""
        return all(_same_memory(x, slot) for x, slot in _slots(xs, out))


def _slots(xs, out):
    """Each of ``xs`` with its channels of ``out``."""
    first = 0
    for x in xs:
        yield x, out[:, first:first + x.shape[1]]
        first += x.shape[1]


def _same_memory(a, b):
    return a.shape == b.shape and a.strides == b.strides and data_address(a) == data_address(b)


def _channel_concat(step, node_axis, shapes):
    """Whether ``step`` is a Concat of 4-D tensors along the channels, of known shapes."""
    out_shape = shapes.get(step.outputs[0])
    return (step.ops == ("Concat",) and out_shape is not None and len(out_shape) == 4
            and node_axis in (1, -3) and all(len(shapes.get(name, ())) == 4
                                             for name in step.inputs))


def _array_shape(shape, lanes):
    """A Concat's array's shape after the batch dimension, of NCHW ``shape``: (C, H, W), or
    blocked of ``lanes`` (blocks, H, W, lanes)."""
    return tuple(shape) if lanes is None else (shape[0] // lanes,) + tuple(shape[1:]) + (lanes,)


def _prefixes(concats, blocked):
    """{Concat output: the output of the Concat with the most inputs whose inputs start with
    all of its inputs, in one layout}: DenseNet's Concat of every feature so far, the last
    one's leading channels, a view of its array at batch 1 (no copy)."""
    found = {}
    for step in concats:
        count = len(step.inputs)
        longer = [other for other in concats if len(other.inputs) > count
                  and other.inputs[:count] == step.inputs
                  and blocked.get(other.outputs[0]) == blocked.get(step.outputs[0])]
        if longer:
            found[step.outputs[0]] = max(longer, key=lambda other: len(other.inputs)).outputs[0]
    return found


def plan(steps, graph, axes, blocked):
    """{value: Slot} for the values made in their Concat's array, the Concat steps replaced
    by ``ConcatStep``s (``axes``: id of a Concat step -> its axis attribute; a Concat of
    shapes unknown at load, or along another axis, is placed in nothing). A Concat of
    ``blocked`` values ({value: lanes}, ``cso.onnx.layouts``) joins their blocks, whole
    ones: its slots are ranges of blocks of its blocked array. A value is placed
    when a step that takes ``out=`` (a convolution, a planned Concat) makes it, the Concat
    reads it once, no step writes into it (a convolution adding into its residual in place),
    and neither it nor the Concat is a graph output (the caller keeps those; a slot's array
    is a reused buffer). Other steps may read it: they read their slice of the array. A
    Concat whose inputs lead a longer one's (``_prefixes``) is made as that one's leading
    channels, its inputs placed there."""
    readers = {}
    for step in steps:
        for name in step.inputs:
            readers.setdefault(name, []).append(step)
    made_by = {name: step for step in steps for name in step.outputs}
    written = {step.inputs[1] for step in steps
               if isinstance(step.run, ConvStep) and step.run.in_place}
    slots, shapes = {}, {}   # shapes: a channel Concat's array's after the batch dimension
    for step in steps:
        if id(step) not in axes:
            continue
        concat = step.outputs[0]
        step.run = ConcatStep(1 if concat in blocked else axes[id(step)])
        step.takes_out = True
        step.buffered = concat not in graph.outputs
        if _channel_concat(step, axes[id(step)], graph.shapes):
            shapes[concat] = _array_shape(graph.shapes[concat][1:], blocked.get(concat))
    prefixes = {concat: whole for concat, whole in _prefixes(
        [step for step in steps if step.outputs[0] in shapes], blocked).items()
        if concat not in written and concat not in graph.outputs and whole not in graph.outputs}
    for step in steps:
        concat = step.outputs[0]
        if concat not in shapes or concat in prefixes:
            continue
        lanes = blocked.get(concat, 1)
        first = 0
        for name in step.inputs:
            stop = first + graph.shapes[name][1]
            producer = made_by.get(name)
            placeable = (producer is not None and producer.takes_out
                         and step.inputs.count(name) == 1 and name not in written
                         and name not in graph.outputs and concat not in graph.outputs
                         and readers[name].count(step) == 1)
            if placeable:
                slots[name] = Slot(concat, first // lanes, stop // lanes, shapes[concat])
            first = stop
    for concat, whole in prefixes.items():
        stop = graph.shapes[concat][1] // blocked.get(concat, 1)
        slots[concat] = Slot(whole, 0, stop, shapes[whole])
    return slots
