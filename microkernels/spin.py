"""A bounded spin-wait for the thread pool (``cso.threads``): waking a blocked thread costs tens
to hundreds of microseconds on a VM, which a millisecond convolution split over two threads
cannot afford, so threads poll a shared word a while before blocking.

``spin_wait(word, seen, rounds)`` returns 1 as soon as the int64 at address ``word`` differs
from ``seen``, 0 after ``rounds`` polls (each with a pause hint on x86) without a change. It is
called through ctypes, which releases the GIL for the wait.
"""
import ctypes
from functools import lru_cache

import llvmlite.binding as llvm
from llvmlite import ir

from .jit import host_target_machine, optimize

I64 = ir.IntType(64)


def _spin_module(triple):
    module = ir.Module(name="spin_wait")
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(I64, [ir.PointerType(), I64, I64]), "spin_wait")
    word, seen, rounds = fn.args
    entry, loop, changed, wait, done = (fn.append_basic_block(n) for n in
                                        ("entry", "loop", "changed", "wait", "done"))
    bld = ir.IRBuilder(entry)
    bld.branch(loop)
    bld.position_at_end(loop)
    i = bld.phi(I64)
    now = bld.load_atomic(word, "acquire", 8, typ=I64)   # atomic: a plain load would be hoisted
    bld.cbranch(bld.icmp_signed("!=", now, seen), changed, wait)
    bld.position_at_end(wait)
    if triple.startswith(("x86_64", "i686", "i386")):
        pause = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        bld.call(pause, [])
    i_next = bld.add(i, ir.Constant(I64, 1))
    bld.cbranch(bld.icmp_signed("<", i_next, rounds), loop, done)
    i.add_incoming(ir.Constant(I64, 0), entry)
    i.add_incoming(i_next, wait)
    bld.position_at_end(changed)
    bld.ret(ir.Constant(I64, 1))
    bld.position_at_end(done)
    bld.ret(ir.Constant(I64, 0))
    return str(module)


class _SpinWait:
    def __init__(self):
        self._target_machine = host_target_machine()   # its own, as every engine here
        ref = llvm.parse_assembly(_spin_module(llvm.get_process_triple()))
        ref.verify()
        optimize(ref, self._target_machine)
        self._engine = llvm.create_mcjit_compiler(ref, self._target_machine)
        self._engine.finalize_object()
        self.function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64)(
            self._engine.get_function_address("spin_wait"))


@lru_cache(maxsize=None)
def _compiled():
    return _SpinWait()


def spin_wait(word, seen, rounds):
    """Poll ``word`` (a 1-element int64 NumPy array) until it differs from ``seen`` (True) or
    ``rounds`` polls have passed (False)."""
    return bool(_compiled().function(word.ctypes.data, seen, rounds))
