"""Call generated functions from numba-compiled code: their IR is emitted into numba's own
module through ``numba.extending.intrinsic`` (no ctypes: LLVM may inline them).

Pointer arguments are passed as integer addresses (``arr.ctypes.data`` plus a byte offset), so
one call site serves any array; addresses are the caller's responsibility, exactly as in C.
"""
from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import depthwise, ir_gen, row_copy, transpose


def _signature_and_codegen(arg_types, define, function_type):
    """An intrinsic's typing result: integers for every argument of ``function_type``
    (addresses for the pointers), calling the function ``define(module)`` returns."""
    if not all(isinstance(t, types.Integer) for t in arg_types):
        return None

    def codegen(context, builder, signature, values):
        fn = define(builder.module)
        builder.call(fn, [builder.inttoptr(v, ty) if isinstance(ty, ir.PointerType) else v
                          for v, ty in zip(values, function_type.args)])
        return context.get_dummy_value()

    return types.void(*([types.intp] * len(arg_types))), codegen


@lru_cache(maxsize=None)
def kernel_intrinsic(spec):
    """``ukernel(k, a, lda, b, ldb, c, ldc, nwin_used, nf_used, bias, flags, a_rows, col0, width,
    gap)``: the micro-kernel (the last four matter to slab kernels only)."""

    @intrinsic
    def ukernel(typingctx, k, a, lda, b, ldb, c, ldc, nwin_used, nf_used, bias, flags, a_rows, col0,
                width, gap):
        return _signature_and_codegen((k, a, lda, b, ldb, c, ldc, nwin_used, nf_used, bias, flags,
                                       a_rows, col0, width, gap),
                                      lambda module: ir_gen.define_kernel(module, spec),
                                      ir_gen.FUNCTION_TYPE)

    return ukernel


@lru_cache(maxsize=None)
def depthwise_intrinsic(spec):
    """``dw_kernel(taps, slab, offsets, weights, out, positions, width, q, bias, flags)``: the
    depthwise micro-kernel (see ``microkernels.depthwise``)."""

    @intrinsic
    def dw_kernel(typingctx, taps, slab, offsets, weights, out, positions, width, q, bias, flags):
        return _signature_and_codegen((taps, slab, offsets, weights, out, positions, width, q,
                                       bias, flags),
                                      lambda module: depthwise.define_depthwise(module, spec),
                                      depthwise.FUNCTION_TYPE)

    return dw_kernel


@lru_cache(maxsize=None)
def row_copy_intrinsic(spec, width):
    """``copy_rows(dst, dst_step, src, src_step, count, stride, j0, j1, lo, hi)``: packed rows
    of ``width`` values in ``spec``'s dtype and vectors (see ``microkernels.row_copy``)."""

    @intrinsic
    def copy_rows(typingctx, dst, dst_step, src, src_step, count, stride, j0, j1, lo, hi):
        return _signature_and_codegen((dst, dst_step, src, src_step, count, stride, j0, j1, lo, hi),
                                      lambda module: row_copy.define_row_copy(module, spec, width),
                                      row_copy.FUNCTION_TYPE)

    return copy_rows


@lru_cache(maxsize=None)
def tap_copy_intrinsic(spec, width):
    """``copy_taps(dst, dst_step, tap_step, src, src_step, count, taps, stride, j0, j1, end, lo,
    hi)``: the packed rows of every tap of a filter row from one read of the input (see
    ``microkernels.row_copy.define_tap_copy``)."""

    @intrinsic
    def copy_taps(typingctx, dst, dst_step, tap_step, src, src_step, count, taps, stride, j0, j1,
                  end, lo, hi):
        return _signature_and_codegen((dst, dst_step, tap_step, src, src_step, count, taps, stride,
                                       j0, j1, end, lo, hi),
                                      lambda module: row_copy.define_tap_copy(module, spec, width),
                                      row_copy.TAP_FUNCTION_TYPE)

    return copy_taps


@lru_cache(maxsize=None)
def transpose_intrinsic(spec):
    """``transpose_block(src, lds, dst, ldd, rows, cols, bias, flags)``: a lanes x lanes block
    transposed with the epilogue (see ``microkernels.transpose``)."""

    @intrinsic
    def transpose_block(typingctx, src, lds, dst, ldd, rows, cols, bias, flags):
        return _signature_and_codegen((src, lds, dst, ldd, rows, cols, bias, flags),
                                      lambda module: transpose.define_transpose(module, spec),
                                      transpose.FUNCTION_TYPE)

    return transpose_block


@intrinsic
def address_as_pointer(typingctx, address):
    """An integer address as a ``voidptr`` (for ``numba.carray`` in compiled entry points)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, values):
        return builder.inttoptr(values[0], ir.PointerType())

    return types.voidptr(address), codegen
