"""Shapes and tensors: the operators that move, select and make elements (and the shape
arithmetic around them), in NumPy, many returning views of their input; Transpose copies with
a compiled kernel where it can."""
import numpy as np

from .. import get_num_threads
from . import kernels
from .registry import (axes_in, axis_in, captured, constant, input_name, int_attr, int_input,
                       int_list_attr, int_values, operator, output, refuse_outputs,
                       require_input, written)


@operator("Concat")
def _build_concat(node, constants):
    node.only("axis")
    axis = node.attr("axis")
    if not isinstance(axis, int):
        raise node.error(f"attribute axis={axis!r}: expected an integer")
    return lambda *xs: (np.concatenate(xs, axis=axis),)


@operator("Constant")
def _build_constant(node, constants):
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    node.only(*kinds)
    if len(node.attrs) != 1:
        raise node.error(f"expected exactly one of {list(kinds)}, got {sorted(node.attrs)}")
    (name, value), = node.attrs.items()
    value = np.array(value, dtype=kinds[name])
    value.flags.writeable = False          # the same array is every run's output
    return lambda: (value,)


@operator("ConstantOfShape")
def _build_constant_of_shape(node, constants):
    node.only("value")
    value = node.attr("value", np.zeros(1, np.float32))
    if not isinstance(value, np.ndarray) or value.size != 1:
        raise node.error(f"attribute value={value!r}: expected a one-element tensor")

    def run(shape):
        return (np.full(tuple(int(d) for d in shape), value.reshape(()), value.dtype),)
    return run


@operator("Dropout", captures_constants=True)
def _build_dropout(node, constants):
    node.only("ratio", "seed")
    training = constant(node, constants, 2, "training_mode", required=False)
    if training is not None and bool(training):
        raise node.error("training_mode=True is not supported (inference only)")
    want_mask = len(node.outputs) > 1 and bool(node.outputs[1])
    if want_mask and node.opset < 12:
        # before opset 12 the engines disagree: onnxruntime's mask is all 0, the reference's 1
        refuse_outputs(node, 1, "mask before opset 12")
    omitted = (None,) * (len(node.outputs) - 1)

    def run(x, ratio=None, training_mode=None):
        # inference keeps every element: the mask is all true
        return (x, np.ones(x.shape, bool)) if want_mask else (x,) + omitted
    return run


@operator("Flatten")
def _build_flatten(node, constants):
    node.only("axis")
    axis = node.attr("axis", 1)

    def run(x):
        if not -x.ndim <= axis <= x.ndim:
            raise node.error(f"axis={axis} is out of range for input of shape {x.shape}")
        split = axis % x.ndim if axis != x.ndim else axis
        return (x.reshape(int(np.prod(x.shape[:split])), int(np.prod(x.shape[split:]))),)
    return run


@operator("Reshape", captures_constants=True)
def _build_reshape(node, constants):
    """Reshape to a shape that is a constant (checked at load) or made at run time (the
    dynamo exporter computes the batch's), checked when it comes."""
    node.only("allowzero")
    require_input(node, 1, "shape")
    allow_zero = node.attr("allowzero", 0)

    def checked(shape):
        shape = int_values(node, shape, "shape")
        if shape.count(-1) > 1 or min(shape, default=0) < -1:
            raise node.error(f"shape {shape}: at most one -1 and no other negative dimension")
        if allow_zero and 0 in shape and -1 in shape:
            raise node.error(f"shape {shape} with allowzero=1 has both 0 and -1")
        return shape

    known = captured(node, constants, 1)
    known = None if known is None else checked(known)

    def run(x, shape=None):
        target = list(known if shape is None else checked(shape))
        if not allow_zero:
            for i, d in enumerate(target):   # 0 copies the input's dimension
                if d == 0:
                    if i >= x.ndim:
                        raise node.error(f"shape {target} copies dimension {i} of a "
                                         f"{x.ndim}-D input")
                    target[i] = x.shape[i]
        try:
            return (x.reshape(target),)
        except ValueError:
            raise node.error(f"input of shape {x.shape} cannot take shape {target}") from None
    return run


@operator("Transpose", takes_out=True)
def _build_transpose(node, constants):
    """Transpose: a C-contiguous input of a dtype the kernels have code for is copied by
    ``kernels.permute`` (a job a recorded run replays) when it has code for the permutation;
    else NumPy's view."""
    node.only("perm")
    perm = node.attr("perm")
    if perm is not None and sorted(perm) != list(range(len(perm))):
        raise node.error(f"perm={perm!r} is not a permutation")

    def run(x, out=None, buffers=None):
        order = list(range(x.ndim))[::-1] if perm is None else perm
        if len(order) != x.ndim:
            raise node.error(f"perm={perm!r} for an input of shape {x.shape}")
        if (x.flags.c_contiguous and kernels.compiles(x.dtype)
                and kernels.permutable(x.shape, order)):
            y = output(node, tuple(x.shape[axis] for axis in order), x.dtype, out, buffers)
            return (kernels.permute(x, y, order, get_num_threads()),)
        return (written(node, np.transpose(x, order), out),)
    run.jobs_only = True
    return run


@operator("Unsqueeze", captures_constants=True)
def _build_unsqueeze(node, constants):
    """Unsqueeze: axes an attribute (before opset 13) or an input, constant or made at run
    time."""
    if node.opset < 13:
        node.only("axes")
        if node.attr("axes") is None:
            raise node.error("attribute axes is missing")
        known = int_list_attr(node, "axes")
    else:
        node.only()
        require_input(node, 1, "axes")
        known = captured(node, constants, 1)
        known = None if known is None else int_values(node, known, "axes", ndim=None)

    def run(x, axes=None):
        axes = known if axes is None else int_values(node, axes, "axes", ndim=None)
        rank = x.ndim + len(axes)
        return (np.expand_dims(x, tuple(axes_in(node, axes, rank) if axes else ())),)
    if known is not None and (not known or len(set(known)) != len(known)):
        raise node.error(f"axes={known!r}: expected distinct axes")
    return run


# --- shape arithmetic and indexing ---------------------------------------------------------

@operator("Shape")
def _build_shape(node, constants):
    if node.opset >= 15:
        node.only("end", "start")
    else:
        node.only()
    start, end = int_attr(node, "start", 0), node.attr("end")
    if end is not None:
        end = int_attr(node, "end", 0)

    def run(x):
        # negative start / end count from the end; both are clamped to [0, rank]
        rank = x.ndim
        first = min(max(start + rank if start < 0 else start, 0), rank)
        last = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
        return (np.array(x.shape[first:last], np.int64),)
    return run


@operator("Size")
def _build_size(node, constants):
    node.only()
    return lambda x: (np.array(x.size, np.int64),)


@operator("Squeeze", captures_constants=True)
def _build_squeeze(node, constants):
    if node.opset < 13:
        node.only("axes")
        fixed = int_list_attr(node, "axes")
        if input_name(node, 1):
            raise node.error("input 1 (axes) is an attribute before opset 13")
    else:
        node.only()
        fixed = captured(node, constants, 1)
        if fixed is not None:
            fixed = int_values(node, fixed, "axes")

    def run(x, axes=None):
        given = fixed
        if given is None and axes is not None:
            given = int_values(node, axes, "axes")
        if given is None:     # every axis of length 1
            return (x.reshape([d for d in x.shape if d != 1]),)
        squeezed = axes_in(node, given, x.ndim)
        if any(x.shape[a] != 1 for a in squeezed):
            raise node.error(f"axes {given} of shape {x.shape}: each must have length 1")
        return (x.reshape([d for a, d in enumerate(x.shape) if a not in squeezed]),)
    return run


def _gather_attribute(node, constants, name):
    """A Gather's or GatherND's integer attribute ``name`` (default 0, the only one it takes)
    and ``indices(given)``: its indices, captured at load when constant, else ``given`` (the
    input), checked to be integers."""
    node.only(name)
    value = int_attr(node, name, 0)
    require_input(node, 1, "indices")
    fixed = captured(node, constants, 1)

    def indices(given):
        found = fixed if fixed is not None else given
        if found.dtype.kind not in "iu":
            raise node.error(f"indices of dtype {found.dtype}: expected integers")
        return found
    return value, indices


@operator("Gather", captures_constants=True)
def _build_gather(node, constants):
    axis, checked = _gather_attribute(node, constants, "axis")

    def run(data, indices=None):
        indices = checked(indices)
        a = axis_in(node, axis, data.ndim)
        n = data.shape[a]
        if indices.size and (indices.max() >= n or indices.min() < -n):
            raise node.error(f"indices out of range [{-n}, {n - 1}] (axis {axis} of shape "
                             f"{data.shape})")
        # negative indices count from the end, as NumPy's
        return (np.asarray(np.take(data, indices, axis=a)),)
    return run


@operator("GatherND", captures_constants=True)
def _build_gather_nd(node, constants):
    """GatherND (opsets 11-13; ``batch_dims`` from 12): each row of the last axis of
    ``indices`` picks an element or slice of ``data`` after its first ``batch_dims`` axes,
    which the two share; negative indices count from the end."""
    batch_dims, checked = _gather_attribute(node, constants, "batch_dims")

    def run(data, indices=None):
        indices = checked(indices)
        depth = indices.shape[-1] if indices.ndim else 0
        if (indices.ndim < 1 or not 0 <= batch_dims < min(data.ndim, indices.ndim)
                or batch_dims + depth > data.ndim
                or data.shape[:batch_dims] != indices.shape[:batch_dims]):
            raise node.error(f"indices of shape {indices.shape} with batch_dims={batch_dims} "
                             f"do not index data of shape {data.shape}")
        dims = np.array(data.shape[batch_dims:batch_dims + depth], np.int64)
        picked = np.where(indices < 0, indices + dims, indices).astype(np.int64)
        if picked.size and (picked.min() < 0 or np.any(picked >= dims)):
            raise node.error(f"indices out of range for data of shape {data.shape}")
        batch = int(np.prod(data.shape[:batch_dims], dtype=np.int64))
        rows = picked.reshape(batch, -1, depth)
        flat = data.reshape((batch,) + data.shape[batch_dims:])
        found = flat[(np.arange(batch)[:, None],) + tuple(rows[..., j] for j in range(depth))]
        return (found.reshape(indices.shape[:-1] + data.shape[batch_dims + depth:]),)
    return run


def _slice_bounds(node, dim, start, end, step):
    """The ONNX Slice of an axis of length ``dim`` as a Python slice: negative start and end
    count from the end, then start is clamped to [0, dim] ([0, dim - 1] for a negative step)
    and end to [0, dim] ([-1, dim - 1], -1 meaning past the first element)."""
    if step == 0:
        raise node.error("steps may not be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


_SLICE_INPUTS = ("starts", "ends", "axes", "steps")


@operator("Slice", captures_constants=True)
def _build_slice(node, constants):
    if node.opset < 10:       # starts, ends and axes are attributes
        node.only("axes", "ends", "starts")
        starts, ends = int_list_attr(node, "starts"), int_list_attr(node, "ends")
        if starts is None or ends is None:
            raise node.error("attributes starts and ends are required")
        fixed = [starts, ends, int_list_attr(node, "axes"), None]
        if len(node.inputs) > 1:
            raise node.error("starts, ends and axes are attributes before opset 10")
    else:
        node.only()
        require_input(node, 1, "starts")
        require_input(node, 2, "ends")
        fixed = [captured(node, constants, i) for i in range(1, 5)]
        fixed = [None if v is None else int_values(node, v, what)
                 for v, what in zip(fixed, _SLICE_INPUTS)]
    # the inputs made at run time
    runtime = [node.opset >= 10 and fixed[i] is None and bool(input_name(node, i + 1))
               for i in range(4)]

    def run(x, *values):
        starts, ends, axes, steps = (int_values(node, values[i], what) if runtime[i] else fixed[i]
                                     for i, what in enumerate(_SLICE_INPUTS))
        if axes is None:
            axes = list(range(len(starts)))
        if steps is None:
            steps = [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise node.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                             f"must have one length")
        index = [slice(None)] * x.ndim
        for a, start, end, step in zip(axes_in(node, axes, x.ndim), starts, ends, steps):
            index[a] = _slice_bounds(node, x.shape[a], start, end, step)
        return (x[tuple(index)],)
    return run


@operator("Split", captures_constants=True)
def _build_split(node, constants):
    axis = int_attr(node, "axis", 0)
    count = len(node.outputs)
    if node.opset < 13:
        node.only("axis", "split")
        sizes = int_list_attr(node, "split")
        if input_name(node, 1):      # (or, at opset 1 alone, an input: not supported)
            raise node.error("split is an attribute before opset 13")
    else:
        if node.opset >= 18:
            node.only("axis", "num_outputs")
        else:
            node.only("axis")
        sizes = captured(node, constants, 1)
        if sizes is not None:
            sizes = int_values(node, sizes, "split")
    pieces = node.attr("num_outputs")
    if pieces is not None:
        pieces = int_attr(node, "num_outputs", 0)
        if pieces != count:
            raise node.error(f"num_outputs={pieces} for {count} outputs")
        if input_name(node, 1):
            raise node.error("num_outputs and the input split cannot be both given")
    if sizes is not None and len(sizes) != count:
        raise node.error(f"split {sizes} for {count} outputs")
    runtime_sizes = sizes is None and bool(input_name(node, 1))

    def run(x, split=None):
        a = axis_in(node, axis, x.ndim)
        dim = x.shape[a]
        lengths = sizes
        if runtime_sizes:
            lengths = int_values(node, split, "split")
            if len(lengths) != count:
                raise node.error(f"split {lengths} for {count} outputs")
        if lengths is None:
            if pieces is not None:   # opset 18: chunks of ceil(dim / n), the last smaller
                chunk = -(-dim // count)
                lengths = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
                if lengths[-1] < 0:
                    raise node.error(f"axis of length {dim} does not split into {count} "
                                     f"chunks of {chunk}")
            else:
                if dim % count:
                    raise node.error(f"axis of length {dim} does not split into {count} equal "
                                     f"parts")
                lengths = [dim // count] * count
        if sum(lengths) != dim or min(lengths, default=0) < 0:
            raise node.error(f"split {lengths} does not add up to the axis' length {dim}")
        ends = np.cumsum(lengths)
        index = [slice(None)] * x.ndim
        out = []
        for end, length in zip(ends, lengths):
            index[a] = slice(int(end) - length, int(end))
            out.append(x[tuple(index)])
        return tuple(out)
    return run


def _with_ints(what, apply):
    """The builder of an operator of ``x`` and a required integer input ``what`` (a constant or
    made at run time) whose output is ``apply(node, x, values)``."""
    def build(node, constants):
        node.only()
        values_of = int_input(node, constants, 1, what)
        return lambda x, given=None: (apply(node, x, values_of(given)),)
    return build


def _expand(node, x, target):
    try:     # bidirectional: a 1 in the shape keeps the input's dimension
        shape = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise node.error(f"input of shape {x.shape} does not broadcast with shape "
                         f"{target}") from None
    return np.broadcast_to(x, shape)       # a read-only view


def _tile(node, x, counts):
    if len(counts) != x.ndim or min(counts, default=0) < 0:
        raise node.error(f"repeats {counts}: expected {x.ndim} counts >= 0")
    return np.tile(x, counts)


operator("Expand", captures_constants=True)(_with_ints("shape", _expand))
operator("Tile", captures_constants=True)(_with_ints("repeats", _tile))


@operator("Range")
def _build_range(node, constants):
    node.only()

    def run(start, limit, delta):
        values = [np.asarray(v) for v in (start, limit, delta)]
        if any(v.size != 1 for v in values) or len({v.dtype for v in values}) != 1:
            raise node.error("start, limit and delta must be scalars of one dtype")
        start, limit, delta = (v.reshape(()) for v in values)
        dtype = start.dtype
        if dtype.kind in "iu":
            first, stop, step = int(start), int(limit), int(delta)
            if step == 0:
                raise node.error("delta may not be 0")
            count = max(-((first - stop) // step), 0)      # ceil((limit - start) / delta)
            return (np.asarray(first + np.arange(count, dtype=dtype) * dtype.type(step),
                               dtype),)
        if dtype.kind != "f":
            raise node.error(f"inputs of dtype {dtype} are not supported")
        if delta == 0:
            raise node.error("delta may not be 0")
        with np.errstate(invalid="ignore"):
            count = np.ceil((limit - start) / delta)    # in the inputs' dtype
        if not np.isfinite(count):
            raise node.error(f"start {start}, limit {limit}, delta {delta}: no finite range")
        count = max(int(count), 0)
        # output[i] = start + i * delta, in the inputs' dtype
        return (np.asarray(start + np.arange(count, dtype=dtype) * delta, dtype),)
    return run
