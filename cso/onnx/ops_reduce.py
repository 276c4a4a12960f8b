"""The Reduce* operators in NumPy: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp.

Their axes are an attribute before the opset that moved them to an input (13 for ReduceSum, 18
for the others), and an optional input from it on, constant or made at run time; negative axes
count from the end; no axes means all of them, or with ``noop_with_empty_axes=1`` (from that
same opset on) none: the operation is then elementwise (the input itself for a sum, |x| for
ReduceL1 and ReduceL2). A reduction over no elements gives the
operation's identity (0 for a sum, 1 for a product, -inf for a max, inf for a min, NaN for a
mean). The output keeps the input's dtype (NumPy would sum small integers in int64 and average
them in float64).

A ReduceMean, ReduceSum or ReduceMax over exactly the spatial axes (2, 3) of a 4-D
C-contiguous float tensor (the dynamo exporter's global pools and squeeze-excitation pools)
runs the compiled global pool (``kernels.global_pool``), a job that a recorded run replays,
into ``out=`` or an array from ``buffers=`` as the pools do; NaN propagates as in NumPy.
"""
import numpy as np

from .. import get_num_threads
from . import kernels
from .registry import (axes_in, captured, input_name, int_attr, int_list_attr, int_values,
                       operator, output, written)


def _sum(x, axes, keepdims):
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(x, axes, keepdims):
    count = int(np.prod([x.shape[a] for a in axes]))
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.divide(_sum(x, axes, keepdims), x.dtype.type(count))
    if count == 0:
        raise _Empty()
    total = _sum(x, axes, keepdims)
    return np.sign(total) * (np.abs(total) // count)     # integers: truncated, as C's


def _extreme(function, identity):
    def reduce(x, axes, keepdims):
        if 0 in (x.shape[a] for a in axes):
            if x.dtype.kind == "f":
                initial = identity * np.inf
            elif x.dtype.kind in "iu":
                info = np.iinfo(x.dtype)
                initial = info.min if identity < 0 else info.max
            else:
                initial = identity < 0        # bool: False for a max, True for a min
            return function(x, axis=axes, keepdims=keepdims, initial=initial)
        return function(x, axis=axes, keepdims=keepdims)
    return reduce


def _prod(x, axes, keepdims):
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l1(x, axes, keepdims):
    return _sum(np.abs(x), axes, keepdims)


def _sum_square(x, axes, keepdims):
    return _sum(np.square(x), axes, keepdims)


def _l2(x, axes, keepdims):
    return np.sqrt(_sum_square(x, axes, keepdims))


def _log_sum(x, axes, keepdims):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(_sum(x, axes, keepdims))


def _log_sum_exp(x, axes, keepdims):
    """log(sum(exp(x))), stable: exp of x less its maximum, which is added back."""
    if 0 in (x.shape[a] for a in axes):
        return np.full(np.sum(x, axis=axes, keepdims=keepdims).shape, -np.inf, x.dtype)
    top = np.max(x, axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, x.dtype.type(0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = _sum(np.exp(x - top), axes, keepdims)
        return np.log(total) + (top if keepdims else np.squeeze(top, axis=axes))


class _Empty(Exception):
    pass


# op type -> the kind of ``kernels.global_pool`` that runs it over the spatial axes
POOLED = {"ReduceMean": "average", "ReduceSum": "sum", "ReduceMax": "max"}

# op type -> (reduction(x, axes tuple, keepdims), opset that made axes an input, floats only)
REDUCTIONS = {
    "ReduceSum": (_sum, 13, False),
    "ReduceMean": (_mean, 18, False),
    "ReduceMax": (_extreme(np.max, -1), 18, False),
    "ReduceMin": (_extreme(np.min, 1), 18, False),
    "ReduceProd": (_prod, 18, False),
    "ReduceL1": (_l1, 18, False),
    "ReduceL2": (_l2, 18, False),
    "ReduceSumSquare": (_sum_square, 18, False),
    "ReduceLogSum": (_log_sum, 18, True),
    "ReduceLogSumExp": (_log_sum_exp, 18, True),
}


def _over_planes(x, reduced):
    """Whether reducing ``x`` over the axes ``reduced`` is a global pool's job: the spatial
    axes of a 4-D C-contiguous float tensor (not empty: NumPy gives the identities)."""
    return (x.ndim == 4 and sorted(reduced) == [2, 3] and x.size != 0
            and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous)


@operator(*REDUCTIONS, captures_constants=True, takes_out=True)
def _build_reduce(node, constants):
    reduction, axes_input, floats_only = REDUCTIONS[node.op_type]
    pooled = POOLED.get(node.op_type)
    keepdims = int_attr(node, "keepdims", 1, (0, 1))
    if node.opset < axes_input:
        node.only("axes", "keepdims")
        fixed = int_list_attr(node, "axes", [])
        noop = False
        if input_name(node, 1):
            raise node.error(f"input 1 (axes) is an attribute before opset {axes_input}")
    else:
        node.only("keepdims", "noop_with_empty_axes")
        noop = int_attr(node, "noop_with_empty_axes", 0, (0, 1))
        fixed = captured(node, constants, 1)
        if fixed is not None:
            fixed = int_values(node, fixed, "axes")
        elif not input_name(node, 1):
            fixed = []
    if len(node.outputs) != 1:
        raise node.error(f"expected one output, got {len(node.outputs)}")

    def run(x, axes=None, out=None, buffers=None):
        given = fixed if fixed is not None else int_values(node, axes, "axes")
        if x.dtype.kind not in "fiub" or (floats_only and x.dtype.kind != "f"):
            raise node.error(f"input of dtype {x.dtype} is not supported")
        if given:
            reduced = tuple(axes_in(node, given, max(x.ndim, 1))) if x.ndim else ()
        else:
            # no axes: all of them, or with noop_with_empty_axes none (a ReduceL2 is then |x|,
            # a ReduceSumSquare x * x: the engines agree)
            reduced = () if noop else tuple(range(x.ndim))
        if pooled and _over_planes(x, reduced):
            y = output(node, x.shape[:2] + (1, 1) * keepdims, x.dtype, out, buffers)
            return (kernels.global_pool(pooled, x, y, get_num_threads()),)
        try:
            y = np.asarray(reduction(x, reduced, bool(keepdims)), dtype=x.dtype)
        except _Empty:
            raise node.error(f"the integer mean of no elements (axes {list(given)} of shape "
                             f"{x.shape})") from None
        return (written(node, y, out),)
    # axes made at run time are values, not addresses: a replay would pool whatever axes the
    # recorded run had
    run.jobs_only = fixed is not None
    return run
