"""Call generated functions from numba-compiled code through their addresses.

Micro-kernels and packing helpers are compiled apart (``jit.native_function``: about 0.1 s each,
their object code kept by the persistent cache); a compiled loop nest receives their addresses
at run time, so one loop nest serves every micro-tile and is compiled once per dtype. Pointer
arguments are passed as integer addresses (``arr.ctypes.data`` plus a byte offset), so one call
site serves any array; addresses are the caller's responsibility, exactly as in C.
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .once import compiled_once


@compiled_once
def caller(function_type):
    """``call(address, *args)``: calls the function of LLVM type ``function_type`` (void, with
    pointer and 64-bit integer arguments) at integer ``address``, the pointers passed as
    addresses. Every argument is cast to a 64-bit integer."""
    arity = len(function_type.args)

    @intrinsic
    def call(typingctx, address, *args):
        if len(args) != arity or not all(isinstance(t, types.Integer)
                                         for t in (address, *args)):
            return None

        def codegen(context, builder, signature, values):
            target, packed = values
            function = builder.inttoptr(target, function_type.as_pointer())
            builder.call(function, [builder.inttoptr(v, ty) if isinstance(ty, ir.PointerType) else v
                                    for v, ty in ((builder.extract_value(packed, i), ty)
                                                  for i, ty in enumerate(function_type.args))])
            return context.get_dummy_value()

        return types.void(types.intp, types.StarArgTuple.from_types([types.intp] * arity)), codegen

    return call


@intrinsic
def address_as_pointer(typingctx, address):
    """An integer address as a ``voidptr`` (for ``numba.carray`` in compiled entry points)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, values):
        return builder.inttoptr(values[0], ir.PointerType())

    return types.voidptr(address), codegen
