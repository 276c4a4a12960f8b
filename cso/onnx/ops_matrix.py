"""Matrix products (Gemm, MatMul) and Softmax (a compiled kernel along the last axis)."""
import numpy as np

from .. import get_num_threads
from ..jobs import workers_asleep
from . import kernels
from .registry import input_name, kernel_input, operator, output


@operator("Gemm", captures_constants=True)
def _build_gemm(node, constants):
    node.only("alpha", "beta", "transA", "transB")
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
    const_b = constants.get(input_name(node, 1))
    const_c = constants.get(input_name(node, 2))
    if const_b is not None:
        if const_b.ndim != 2:
            raise node.error(f"B of shape {const_b.shape} must be 2-D")
        # alpha folded into B, laid out (K, N) C-contiguous: BLAS is faster on it than on a
        # transposed view (1.1x at M=1, 1.5x at M=8 for 9216 x 4096)
        const_b = np.ascontiguousarray(const_b.T if trans_b else const_b)
        if alpha != 1:
            const_b = const_b * alpha
    if const_c is not None:
        n = const_b.shape[1] if const_b is not None else None
        if const_c.ndim > 2 or (n is not None and const_c.ndim and const_c.shape[-1] not in (1, n)):
            raise node.error(f"C of shape {const_c.shape} does not broadcast to (M, {n})")
        const_c = const_c * beta if beta != 1 else const_c

    def run(a, b, c=None):
        b = const_b if const_b is not None else b
        if a.ndim != 2 or b.ndim != 2:
            raise node.error(f"A {a.shape} and B {b.shape} must be 2-D")
        a = a.T if trans_a else a
        with workers_asleep():   # NumPy's BLAS runs threads of its own
            y = a @ (const_b if const_b is not None else b.T if trans_b else b)
        if const_b is None:
            if alpha != 1:
                y *= alpha
        if beta != 0 and (const_c is not None or c is not None):
            # in place: C may broadcast to Y (unidirectional) but never enlarge it
            np.add(y, const_c if const_c is not None else c * beta, out=y)
        return (y,)
    return run


@operator("Softmax", takes_out=True)
def _build_softmax(node, constants):
    node.only("axis")
    coerce = node.opset < 13          # before opset 13: softmax over the flattened tail
    axis = node.attr("axis", 1 if coerce else -1)

    def run(x, out=None, buffers=None):
        if not -x.ndim <= axis < x.ndim:
            raise node.error(f"axis={axis} is out of range for input of shape {x.shape}")
        split = axis % x.ndim
        # rows along the last axis, or (before opset 13) the flattened tail: the kernel's
        if (coerce or split == x.ndim - 1) and x.dtype.kind == "f" and kernels.compiles(x.dtype):
            x = kernel_input(node, x, floats_only=True)
            out = output(node, x.shape, x.dtype, out, buffers)
            rows = (int(np.prod(x.shape[:split])), int(np.prod(x.shape[split:])))
            kernels.softmax(x.reshape(rows), out.reshape(rows), get_num_threads())
            return (out,)
        if not coerce:
            return (_softmax(x, axis),)
        flat = x.reshape(int(np.prod(x.shape[:split])), -1)
        return (_softmax(flat, 1).reshape(x.shape),)
    return run


def _softmax(x, axis):
    y = np.subtract(x, x.max(axis=axis, keepdims=True))
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


@operator("MatMul")
def _build_matmul(node, constants):
    node.only()

    def run(a, b):
        # numpy.matmul's semantics are ONNX's: 1-D operands promoted and the added axis
        # removed, the batch axes broadcast
        if a.ndim == 0 or b.ndim == 0:
            raise node.error(f"operands of shapes {a.shape} and {b.shape}: MatMul takes no "
                             f"scalars")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise node.error(f"operands of shapes {a.shape} and {b.shape} do not multiply")
        if b.ndim == 2 and a.ndim > 2:
            # a stack of rows times one matrix is one GEMM of all the rows: NumPy would loop
            # over the stack, and off BLAS for a strided view (a Transpose's)
            rows = np.ascontiguousarray(a).reshape(-1, a.shape[-1])
            with workers_asleep():   # NumPy's BLAS runs threads of its own
                return (np.matmul(rows, b).reshape(a.shape[:-1] + b.shape[1:]),)
        with workers_asleep():
            return (np.asarray(np.matmul(a, b)),)
    return run
