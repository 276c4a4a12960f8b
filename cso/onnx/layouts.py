"""Channel-blocked values between a model's steps (``cso.layouts``): which values a model holds
blocked, and the reorders to NCHW where a step needs it.

A blocked value is an array of the data of a ``cso.Blocked`` (N, ceil(C/L), H, W, L): the
convolutions read and write it directly (``ConvStep.blocked``: a blocked plan, ``csa.analyze(...,
layout="blocked")``), with no reorder or packing between them. The values are decided in
groups: the inputs and output of an elementwise step (an activation, a sum of one shape, a
squeeze-excitation gate, a per-channel affine chain) share their layout, as do a pool's or a
Resize's input and output, a Concat's along the channels of whole blocks (its blocks are its
inputs' one after the other), a depthwise convolution's input and output and a residual
convolution's sum and output. A group is blocked when

- every value of it is a 4-D float tensor of known shape, none the graph's input or output;
- every step making one of them can write it blocked: a convolution with a blocked plan
  (``csa.layout.blocked_fits``), a global pool (from any layout), or the group's other steps;
- no Concat of partial blocks reads one of them (its inputs are made in its NCHW array:
  ``concat``);
- and a step outside the group reads one of them blocked: a convolution whose output is
  blocked, or a global pool. (So a group read by NCHW steps alone stays NCHW.)

A blocked convolution reads an NCHW input as it is (blocks of one channel: the stem's three).
Any other step that reads a blocked value reads an NCHW copy (a ``Reorder`` step after the
value's maker), and a global pool writes NCHW or blocked as its readers take it.
"""
import numpy as np

from .. import get_num_threads
from ..layouts import block_size, has_blocked_plan, merges_in_whole, unblock_into
from . import kernels
from .conv import ConvStep
from .graph import ActivationStep, AffineStep, Operator, Step, sum_relu

# operators applied to each element alone (their other inputs, if any, constants captured)
ELEMENTWISE = {"Relu", "Sigmoid", "Tanh", "Erf", "HardSwish", "HardSigmoid", "LeakyRelu",
               "Gelu", "Clip", "Identity"}
GLOBAL_POOLS = {"GlobalAveragePool": "average", "GlobalMaxPool": "max"}
POOLS = {"MaxPool", "AveragePool"}
RESIZES = {"Resize", "Upsample"}


def place(steps, graph):
    """``steps`` with their values' layouts decided (see the module's docstring), and {value:
    lanes} of the values held blocked: blocked convolutions set, pools, gates and affine
    steps on blocked values replaced by their blocked runs, a ``Reorder`` step after each
    blocked value some step reads as NCHW."""
    dtypes = {dtype for _, dtype in graph.inputs.values() if dtype.kind == "f"}
    if len(dtypes) != 1 or not dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}:
        return steps, {}   # (the kernels' dtypes, one for the model)
    dtype = dtypes.pop()
    lanes = block_size(dtype)
    shapes = graph.shapes
    data = [[name for name in step.inputs if name and name not in graph.constants]
            for step in steps]
    kinds = [_kind(step, names, shapes, dtype, lanes) for step, names in zip(steps, data)]
    groups = _Groups()
    for step, names, kind in zip(steps, data, kinds):
        if kind == "tied":
            groups.join(names + step.outputs)
        elif kind == "conv" and (step.run.residual or step.run.depthwise):
            groups.join(names[1:] + step.outputs if step.run.residual else names + step.outputs)
    made_by = {name: index for index, step in enumerate(steps) for name in step.outputs}
    readers = {}
    for index, names in enumerate(data):
        for name in names:
            readers.setdefault(name, []).append(index)

    def possible(name):
        shape = shapes.get(name)
        maker = made_by.get(name)
        return (shape is not None and len(shape) == 4 and name not in graph.outputs
                and maker is not None and kinds[maker] != "nchw"
                and all(steps[r].ops != ("Concat",) or kinds[r] == "tied"
                        for r in readers.get(name, ())))

    members = groups.members(made_by)
    blocked = {root for root, names in members.items() if all(map(possible, names))}

    def reads_blocked(index, name):
        """Whether step ``index`` reads value ``name`` (of a blocked group) as it is."""
        kind = kinds[index]
        if kind == "pool":
            return True
        if kind == "conv":
            return groups.find(steps[index].outputs[0]) in blocked
        return kind == "tied" and groups.find(name) == groups.find(steps[index].outputs[0])

    changed = True
    while changed:   # drop the groups no step outside them reads blocked, until none
        changed = False
        for root in list(blocked):
            outside = [(r, name) for name in members[root] for r in readers.get(name, ())
                       if groups.find(steps[r].outputs[0]) != root]
            if not any(reads_blocked(r, name) for r, name in outside):
                blocked.discard(root)
                changed = True
    return _apply(steps, data, kinds, groups, blocked, readers, shapes, reads_blocked, lanes)


def _apply(steps, data, kinds, groups, blocked, readers, shapes, reads_blocked, lanes):
    """The steps with the layouts ``blocked`` (group roots) decided set and the reorders, and
    {value: ``lanes``} of the blocked values."""
    is_blocked = {name for index, step in enumerate(steps) for name in step.outputs
                  if name and groups.find(name) in blocked}
    result = []
    for index, (step, kind) in enumerate(zip(steps, kinds)):
        if kind == "conv":
            step.run.blocked = step.outputs[0] in is_blocked
        elif kind == "pool" and data[index][0] in is_blocked:
            step.run = BlockedGlobalPool(GLOBAL_POOLS[step.ops[0]], step.run,
                                         step.outputs[0] in is_blocked,
                                         shapes[step.outputs[0]][1])
        elif kind == "tied" and step.outputs[0] in is_blocked:
            step.run = _blocked_run(step, shapes[step.outputs[0]][1])
        result.append(step)
        for name in step.outputs:
            nchw = [r for r in readers.get(name, ()) if name in is_blocked
                    and not reads_blocked(r, name)]
            if nchw:
                copy = f"{name}/nchw"
                result.append(Step(("Reorder",), Reorder(shapes[name][1]), [name], [copy],
                                   buffered=True))
                for r in nchw:
                    steps[r].inputs[:] = [copy if n == name else n for n in steps[r].inputs]
    return result, dict.fromkeys(is_blocked, lanes)


def _blocked_run(step, channels):
    """The run of a "tied" step on blocked values of ``channels`` channels: its blocked
    kernel's (a gate, a pool, an affine chain, a Resize), or its own (elementwise, a sum, a
    Concat along the blocks). A Mul by a constant is an affine step, not a gate."""
    if isinstance(step.run, AffineStep):
        return BlockedAffine(step.run)
    if step.ops == ("Mul",):
        return BlockedGate(step.run)
    if step.ops[0] in POOLS:
        return BlockedPool(step.run)
    if step.ops[0] in RESIZES:
        return BlockedResize(step.run, channels)
    return step.run


def _kind(step, names, shapes, dtype, lanes):
    """How step ``step`` (reading the values ``names``) meets the layouts: "conv" (a
    convolution with a blocked plan), "pool" (a global pool, from and to any layout), "tied"
    (its values and output in one layout), or "nchw"."""
    run = step.run
    if isinstance(run, ConvStep):
        return "conv" if _conv_fits(run, shapes.get(names[0] if names else ""), dtype) else "nchw"
    if not step.outputs[0] or any(step.outputs[1:]):   # (a MaxPool's Indices: not made)
        return "nchw"
    if isinstance(run, (ActivationStep, AffineStep)) or (run is sum_relu
                                                         and _one_shape(names, shapes)):
        return "tied"
    if not isinstance(run, Operator):
        return "nchw"
    op = run.node.op_type
    if op in GLOBAL_POOLS and len(names) == 1:
        return "pool"
    if op in ELEMENTWISE | POOLS and len(names) == 1 and step.inputs[0] == names[0]:
        return "tied"
    if op == "Add" and len(names) == 2 and _one_shape(names, shapes):
        return "tied"
    if op == "Mul" and len(names) == 2 and _gate(names, shapes):
        return "tied"
    if op == "Concat" and _whole_blocks(run.node, names, step.inputs, shapes, lanes):
        return "tied"
    if op in RESIZES and names == step.inputs[:1] and _planes_alone(names[0], step.outputs[0],
                                                                     shapes):
        return "tied"
    return "nchw"


def _conv_fits(run, shape, dtype):
    """Whether the convolution ``run`` (a ConvStep) of input ``shape`` has a blocked plan: its
    own, or that of its groups merged onto blocks in whole merges (``Conv2d._merged``; a
    merge padded with zero groups reads blocks only, not the NCHW planes of a model's input)."""
    if shape is None or len(shape) != 4 or run.channel_shuffle > 1:
        return False
    return (has_blocked_plan(run.weight_shape, run.groups, dtype)
            or merges_in_whole(run.weight_shape, run.groups, shape, dtype, run.stride,
                               run.padding_for(shape), run.dilation))


def _whole_blocks(node, names, inputs, shapes, lanes):
    """Whether a Concat ``node`` of ``inputs`` (``names`` of them not constants) joins 4-D
    values along the channels, each of whole blocks of ``lanes``: its blocked output is its
    inputs' blocks one after the other (``concat.plan``)."""
    found = [shapes.get(name) for name in inputs]
    return (node.attr("axis") in (1, -3) and names == inputs
            and all(shape is not None and len(shape) == 4 and shape[1] % lanes == 0
                    for shape in found))


def _planes_alone(x, y, shapes):
    """Whether 4-D ``y`` has 4-D ``x``'s images and channels (a Resize of its planes)."""
    a, b = shapes.get(x), shapes.get(y)
    return a is not None and b is not None and len(a) == len(b) == 4 and a[:2] == b[:2]


def _one_shape(names, shapes):
    found = {shapes.get(name) for name in names}
    return len(found) == 1 and None not in found and len(next(iter(found))) == 4


def _gate(names, shapes):
    """Whether the two values are a squeeze-excitation's (N, C, H, W) and (N, C, 1, 1)."""
    a, b = (shapes.get(name) for name in names)
    if a is None or b is None or len(a) != 4 or len(b) != 4:
        return False
    return (a[:2] == b[:2]) and (b[2:] == (1, 1) or a[2:] == (1, 1)) and a != b


class _Groups:
    """Union-find of value names: the values that share a layout."""

    def __init__(self):
        self.parent = {}

    def find(self, name):
        root = self.parent.setdefault(name, name)
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[name] = root
        return root

    def join(self, names):
        names = [name for name in names if name]
        for name in names[1:]:
            self.parent[self.find(name)] = self.find(names[0])

    def members(self, made):
        """{root: [values]} of every value ``made`` names."""
        found = {}
        for name in made:
            found.setdefault(self.find(name), []).append(name)
        return found


class Reorder:
    """A blocked value as an NCHW array of its ``channels`` (a compiled job)."""

    jobs_only = True

    def __init__(self, channels):
        self.channels = channels

    def __call__(self, x, buffers=None):
        shape = (x.shape[0], self.channels) + x.shape[2:4]
        out = buffers.get(shape, x.dtype) if buffers else np.empty(shape, x.dtype)
        return (unblock_into(np.ascontiguousarray(x), out),)


class BlockedGlobalPool:
    """A global pool of a blocked value: its output blocked (N, blocks, 1, 1, L) or NCHW
    (N, C, 1, 1) (a compiled job). ``nchw_run``: the operator's own run, which pickles."""

    jobs_only = True

    def __init__(self, kind, nchw_run, blocked_out, channels):
        self.kind, self.nchw_run = kind, nchw_run
        self.blocked_out, self.channels = blocked_out, channels

    def __call__(self, x, out=None, buffers=None):
        shape = (x.shape[:2] + (1, 1, x.shape[4]) if self.blocked_out
                 else (x.shape[0], self.channels, 1, 1))
        if out is None:
            out = buffers.get(shape, x.dtype) if buffers else np.empty(shape, x.dtype)
        return (kernels.blocked_global_pool(self.kind, np.ascontiguousarray(x), out,
                                            get_num_threads()),)


class BlockedPool:
    """A MaxPool or AveragePool of a blocked value, blocked (a compiled job).
    ``nchw_run``: the operator's own run (``ops_pooling``), which pickles."""

    jobs_only = True

    def __init__(self, nchw_run):
        self.nchw_run = nchw_run

    def __call__(self, x, out=None, buffers=None):
        return self.nchw_run.run.blocked(np.ascontiguousarray(x), out, buffers)


class BlockedAffine:
    """A per-channel affine chain (``graph.AffineStep``) on a blocked value, blocked (a
    compiled job); its scale and shift padded to whole blocks."""

    jobs_only = True

    def __init__(self, nchw_run):
        self.nchw_run = nchw_run
        self._cast = {}   # (dtype, size) -> (scale, shift)

    def __call__(self, x, buffers=None):
        x = np.ascontiguousarray(x)
        scale, shift = self._padded(x.dtype, x.shape[1] * x.shape[4])
        out = buffers.get(x.shape, x.dtype) if buffers else np.empty_like(x)
        return (kernels.blocked_affine(x, out, scale, shift,
                                       self.nchw_run.activation is not None,
                                       get_num_threads()),)

    def _padded(self, dtype, size):
        """The scale and shift in ``dtype``, ``size`` values each (zeros past the channels)."""
        padded = self._cast.get((dtype, size))
        if padded is None:
            padded = tuple(np.zeros(size, dtype) for _ in range(2))
            for values, original in zip(padded, (self.nchw_run.scale, self.nchw_run.shift)):
                values[:original.size] = original
            self._cast[(dtype, size)] = padded
        return padded


class BlockedResize:
    """A Resize (or Upsample) of a blocked value's planes, blocked (NumPy, as the operator).
    ``nchw_run``: the operator's own run (``ops_spatial``), which pickles."""

    def __init__(self, nchw_run, channels):
        self.nchw_run, self.channels = nchw_run, channels

    def __call__(self, x, *values):
        return self.nchw_run.run.blocked(x, self.channels, *values)


class BlockedGate:
    """A squeeze-excitation Mul of blocked values, (N, blocks, H, W, L) by (N, blocks, 1, 1,
    L) (a compiled job). ``nchw_run``: the operator's own run."""

    jobs_only = True

    def __init__(self, nchw_run):
        self.nchw_run = nchw_run

    def __call__(self, a, b, out=None, buffers=None):
        x, gate = (a, b) if b.shape[2:4] == (1, 1) and a.shape != b.shape else (b, a)
        if out is None:
            out = buffers.get(x.shape, x.dtype) if buffers else np.empty(x.shape, x.dtype)
        return (kernels.blocked_gate(np.ascontiguousarray(x), np.ascontiguousarray(gate), out,
                                     get_num_threads()),)
