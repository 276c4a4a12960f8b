"""Normalisation: BatchNormalization (inference), LRN and LayerNormalization (compiled kernels,
LayerNormalization NumPy's when its Scale or B is made at run time)."""
import numpy as np

from .. import get_num_threads
from . import kernels
from .registry import (DTYPES, axis_in, captured, constant, floats, input_name, int_attr,
                       kernel_input, operator, output, refuse_outputs, require_input,
                       written)


@operator("BatchNormalization", captures_constants=True)
def _build_batch_normalization(node, constants):
    node.only("epsilon", "momentum", "spatial", "training_mode")
    if node.attr("spatial", 1) != 1:
        raise node.error("spatial=0 (statistics per activation) is not supported")
    if node.attr("training_mode", 0) != 0:
        raise node.error("training_mode=1 is not supported (inference only)")
    refuse_outputs(node, 1, "training mode's running or saved statistics")
    scale, bias, mean, var = (
        constant(node, constants, i, what).astype(np.float64)
        for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1))
    # y = x * mul + add, with mul and add from the statistics in float64 once
    mul = scale / np.sqrt(var + node.attr("epsilon", 1e-5))
    add = bias - mean * mul
    if not mul.ndim == add.ndim == 1:
        raise node.error(f"scale, B, mean and var must be 1-D (got shapes {mul.shape}, "
                         f"{add.shape})")
    shaped = {}            # (dtype, ndim) -> mul, add as (C, 1, ...) in the input's dtype
    omitted = (None,) * (len(node.outputs) - 1)

    def run(x, *statistics):
        key = (x.dtype, x.ndim)
        if key not in shaped:
            shape = (-1,) + (1,) * (x.ndim - 2)
            shaped[key] = tuple(v.astype(x.dtype).reshape(shape) for v in (mul, add))
        m, a = shaped[key]
        y = np.multiply(x, m)
        return (np.add(y, a, out=y),) + omitted
    return run


@operator("LRN", takes_out=True)
def _build_lrn(node, constants):
    node.only("alpha", "beta", "bias", "size")
    size = node.attr("size")
    if not isinstance(size, int) or size < 1:
        raise node.error(f"attribute size={size!r}: expected a positive integer")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)

    def run(x, out=None, buffers=None):
        if x.ndim < 3:
            raise node.error(f"input of shape {x.shape}: LRN needs a tensor (N, C, ...)")
        x = kernel_input(node, x, floats_only=True)
        out = output(node, x.shape, x.dtype, out, buffers)
        return (kernels.lrn(x, out, size, alpha, beta, bias, get_num_threads()),)
    return run


@operator("LayerNormalization", captures_constants=True, takes_out=True)
def _build_layer_normalization(node, constants):
    """LayerNormalization over the axes from ``axis`` on; with constant Scale and B (an
    exporter's) a float32 or float64 input runs the compiled kernel (``kernels.layer_norm``,
    a job that a recorded run replays), its statistics in float64 whatever ``stash_type``
    (at least as accurate as the specification's); else NumPy, in the stash type."""
    node.only("axis", "epsilon", "stash_type")
    axis = int_attr(node, "axis", -1)
    epsilon = node.attr("epsilon", 1e-5)
    if not isinstance(epsilon, float):
        raise node.error(f"attribute epsilon={epsilon!r}: expected a float")
    stash = int_attr(node, "stash_type", 1, (1, 11))   # float32 or float64 statistics
    stash = DTYPES[stash]
    refuse_outputs(node, 1, "Mean and InvStdDev")
    require_input(node, 1, "Scale")
    fixed = [captured(node, constants, i) for i in (1, 2)]
    compiled = fixed[0] is not None and (fixed[1] is not None or not input_name(node, 2))
    rows = {}   # normalised shape -> Scale and B over it, float64 rows (the kernel's)
    omitted = (None,) * (len(node.outputs) - 1)

    def affine_rows(shape):
        if shape not in rows:
            bias = 0.0 if fixed[1] is None else fixed[1]
            try:   # broadcast unidirectionally, as the specification's
                rows[shape] = tuple(np.broadcast_to(np.asarray(v, np.float64), shape).ravel()
                                    for v in (fixed[0], bias))
            except ValueError:
                raise node.error(f"Scale {fixed[0].shape} or B {np.shape(bias)} does not "
                                 f"broadcast to the normalised shape {shape}") from None
        return rows[shape]

    def run(x, scale=None, bias=None, out=None, buffers=None):
        floats(node, x)
        first = axis_in(node, axis, x.ndim)
        if compiled and x.dtype in (np.float32, np.float64):
            y = output(node, x.shape, x.dtype, out, buffers)
            return (kernels.layer_norm(x, y, *affine_rows(x.shape[first:]), epsilon,
                                       get_num_threads()),) + omitted
        scale = fixed[0] if fixed[0] is not None else scale
        bias = fixed[1] if fixed[1] is not None else bias
        axes = tuple(range(first, x.ndim))
        # the statistics (and the normalisation) in the stash type, as the specification's
        # function: x cast to it, then the result back to x's dtype
        xs = x.astype(stash, copy=False)
        mean = np.mean(xs, axis=axes, keepdims=True)
        centred = np.subtract(xs, mean)
        variance = np.mean(np.square(centred), axis=axes, keepdims=True)
        variance += stash.type(epsilon)
        centred /= np.sqrt(variance)
        y = centred.astype(x.dtype, copy=False)
        # Scale and B in x's dtype, broadcast (unidirectionally) over the normalised axes
        try:
            y = np.multiply(y, scale, out=y if y is not x else None)
            if bias is not None:
                y = np.add(y, bias, out=y)
        except ValueError:
            raise node.error(f"Scale {scale.shape} or B "
                             f"{None if bias is None else bias.shape} does not broadcast to "
                             f"the input's shape {x.shape}") from None
        return (written(node, y, out),) + omitted
    return run
