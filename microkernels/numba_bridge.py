"""Call a micro-kernel from numba-compiled code: the kernel's IR is emitted into numba's own
module through ``numba.extending.intrinsic`` (no ctypes, so the caller stays cacheable and LLVM
may inline the kernel)."""
from functools import lru_cache

from numba import types
from numba.np.numpy_support import from_dtype
from numba.extending import intrinsic

from .ir_gen import define_kernel


def _element_pointer(context, builder, array_type, array, offset):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [offset], source_etype=context.get_data_type(array_type.dtype))


@lru_cache(maxsize=None)
def kernel_intrinsic(spec):
    """A numba intrinsic ``ukernel(k, a, a_off, lda, b, b_off, c, c_off, ldc, nwin_used, nf_used,
    bias, bias_off, flags)`` running ``spec``'s kernel on elements of 1-D or N-D arrays starting
    at the given flat element offsets. Offsets are the caller's responsibility: this is raw
    pointer arithmetic, exactly as in the kernel itself."""

    @intrinsic
    def ukernel(typingctx, k, a, a_off, lda, b, b_off, c, c_off, ldc, nwin_used, nf_used, bias, bias_off,
                flags):
        arrays = (a, b, c, bias)
        if not all(isinstance(t, types.Array) and t.dtype == from_dtype(spec.np_dtype)
                   for t in arrays):
            return None
        sig = types.void(types.intp, a, types.intp, types.intp, b, types.intp, c, types.intp,
                         types.intp, types.intp, types.intp, bias, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            (k_, a_, a_off_, lda_, b_, b_off_, c_, c_off_, ldc_, nwin_, nf_, bias_, bias_off_,
             flags_) = args
            fn = define_kernel(builder.module, spec)
            arg_types = signature.args
            ptrs = [_element_pointer(context, builder, arg_types[i], arr, off)
                    for i, arr, off in ((1, a_, a_off_), (4, b_, b_off_), (6, c_, c_off_),
                                        (11, bias_, bias_off_))]
            builder.call(fn, [k_, ptrs[0], lda_, ptrs[1], ptrs[2], ldc_, nwin_, nf_, ptrs[3], flags_])
            return context.get_dummy_value()

        return sig, codegen

    return ukernel
