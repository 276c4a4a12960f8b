"""Call a micro-kernel from numba-compiled code: the kernel's IR is emitted into numba's own
module through ``numba.extending.intrinsic`` (no ctypes, so the caller stays cacheable and LLVM
may inline the kernel)."""
from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .ir_gen import FUNCTION_TYPE, define_kernel


@lru_cache(maxsize=None)
def kernel_intrinsic(spec):
    """A numba intrinsic ``ukernel(k, a, lda, b, c, ldc, nwin_used, nf_used, bias, flags)``
    with the kernel's own arguments: the four pointers are addresses (``arr.ctypes.data`` plus
    a byte offset), so one call site serves packed tiles and unpacked inputs alike. Addresses are
    the caller's responsibility: this is raw pointer arithmetic, exactly as in the kernel."""

    @intrinsic
    def ukernel(typingctx, k, a, lda, b, c, ldc, nwin_used, nf_used, bias, flags):
        if not all(isinstance(t, types.Integer) for t in (k, a, lda, b, c, ldc, nwin_used, nf_used,
                                                           bias, flags)):
            return None
        sig = types.void(*([types.intp] * 10))

        def codegen(context, builder, signature, args):
            fn = define_kernel(builder.module, spec)
            call_args = [builder.inttoptr(v, ty) if isinstance(ty, ir.PointerType) else v
                         for v, ty in zip(args, FUNCTION_TYPE.args)]
            builder.call(fn, call_args)
            return context.get_dummy_value()

        return sig, codegen

    return ukernel
