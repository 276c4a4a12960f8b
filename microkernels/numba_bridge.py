"""numba-compiled code and generated functions, both ways.

Micro-kernels and packing helpers are compiled apart (``jit.native_function``: about 0.1 s each,
their object code kept by the persistent cache); a compiled loop nest receives their addresses
at run time, so one loop nest serves every micro-tile and is compiled once per dtype. Pointer
arguments are passed as integer addresses (``arr.ctypes.data`` plus a byte offset), so one call
site serves any array; addresses are the caller's responsibility, exactly as in C.

The other way, ``c_entry`` keeps a numba-compiled C entry's object code in the same cache, and
a later process loads it with llvmlite alone, without starting numba's compiler.
"""
import builtins
import ctypes

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import cache
from .jit import JitModule
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


class CEntry:
    """A numba-compiled C function ``void entry(int64 *args, int64 part)``: ``.address``, and
    ``.call(args_address, part)`` through ctypes (which releases the GIL for the call)."""

    def __init__(self, address, owner):
        self.address = address
        self._owner = owner   # what keeps the code mapped
        self.call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(address)


@compiled_once
def c_entry(key, build):
    """The C entry ``build()`` compiles with ``numba.cfunc`` (signature ``void(int64*,
    int64)``), ``key`` naming everything it is built from. Its object code is kept in the
    persistent cache, and a later process loads it with llvmlite alone, after giving LLVM the
    symbols numba's code calls into (numba's C helpers and runtime): numba's compiler, whose
    first use costs about 0.15 s of set-up, is only started to compile."""
    path = cache.native_path("c_entry", key)
    saved = cache.load_native(path)
    if saved is not None:
        symbol, needs, object_code = saved
        _give_llvm_numba_symbols()
        if all(llvm.address_of_symbol(name) for name in needs):   # else LLVM would abort
            module = JitModule(object_code=object_code)
            return CEntry(module.address(symbol), module)
    function = build()
    library = function._library
    declared = llvm.parse_assembly(library.get_llvm_str())
    needs = sorted(v.name for v in (*declared.functions, *declared.global_variables)
                   if v.is_declaration and not v.name.startswith("llvm."))
    cache.save_native(path, (function.native_name, needs,
                             library.serialize_using_object_code()[2][0]))
    return CEntry(function.address, function)


@compiled_once
def _give_llvm_numba_symbols():
    """What numba adds to LLVM's symbol table before it runs code it compiled (as
    ``numba.core.base._load_global_helpers`` and ``numba.core.runtime.nrt`` do): its C helpers
    as ``numba_*``, its runtime's as ``NRT_*``, None and the built-in exceptions."""
    from numba import _dynfunc, _helperlib
    from numba.core.runtime import _nrt_python

    llvm.add_symbol("_Py_NoneStruct", id(None))
    for helpers in (_helperlib.c_helpers, _dynfunc.c_helpers):
        for name, address in helpers.items():
            llvm.add_symbol("numba_" + name, address)
    for name, address in _nrt_python.c_helpers.items():
        llvm.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            llvm.add_symbol("PyExc_" + value.__name__, id(value))
