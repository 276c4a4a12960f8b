"""JIT-compile a micro-kernel on its own (for inspection, tests and ``python -m microkernels.dump``).

The convolution loop nests do not use this: they emit the same IR inline into numba-compiled code
(see ``numba_bridge``). Each compiled kernel owns its execution engine and target machine (sharing
one target machine between engines crashed after the first engine was freed).
"""
import ctypes
from functools import lru_cache

import llvmlite.binding as llvm
from llvmlite import ir

from .ir_gen import define_kernel
from .isa import host_features


def host_target_machine(opt=3):
    host_features()  # initialises the native target
    target = llvm.Target.from_triple(llvm.get_process_triple())
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features,
                                        opt=opt, codemodel="jitdefault", jit=True)


def optimize(module_ref, target_machine):
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(target_machine, tuning)
    builder.getModulePassManager().run(module_ref, builder)


class CompiledKernel:
    """A kernel compiled for the host: ``.ir`` (optimised LLVM IR), ``.asm`` and a ctypes
    ``function(k, a, lda, b, c, ldc, nwin_used, nf_used, bias, flags)`` taking raw addresses."""

    def __init__(self, spec):
        self.spec = spec
        module = ir.Module(name=spec.name)
        module.triple = llvm.get_process_triple()
        define_kernel(module, spec, linkage="external")
        self.raw_ir = str(module)
        self._target_machine = host_target_machine()
        ref = llvm.parse_assembly(self.raw_ir)
        ref.verify()
        optimize(ref, self._target_machine)
        self.ir = str(ref)
        self.asm = self._target_machine.emit_assembly(ref)
        self._engine = llvm.create_mcjit_compiler(ref, self._target_machine)
        self._engine.finalize_object()
        address = self._engine.get_function_address(spec.name)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        args = [i64, ptr, i64, ptr, ptr, i64, i64, i64, ptr, i64]
        self.function = ctypes.CFUNCTYPE(None, *args)(address)

    def __call__(self, k, a, b, c, ldc, nwin_used, nf_used, bias=None, flags=0, lda=None):
        """Run on NumPy arrays (checked for size so that a test cannot read out of bounds);
        ``lda`` defaults to a packed tile's ``nwin``."""
        spec = self.spec
        lda = spec.nwin if lda is None else lda
        for name, arr, need in (("a", a, (k - 1) * lda + spec.nwin), ("b", b, k * spec.nf)):
            if arr.dtype != spec.np_dtype or not arr.flags.c_contiguous or arr.size < need:
                raise ValueError(f"{name} must be a contiguous {spec.np_dtype} array of at least "
                                 f"{need} elements, got {arr.dtype} of shape {arr.shape}")
        if not (1 <= nf_used <= spec.nf and 1 <= nwin_used <= spec.nwin):
            raise ValueError(f"need 1 <= nf_used <= {spec.nf} and 1 <= nwin_used <= {spec.nwin}")
        if c.dtype != spec.np_dtype or c.size < (nf_used - 1) * ldc + nwin_used:
            raise ValueError(f"c too small for {nf_used} rows of stride {ldc}")
        bias_addr = 0 if bias is None else bias.ctypes.data
        self.function(k, a.ctypes.data, lda, b.ctypes.data, c.ctypes.data, ldc, nwin_used, nf_used,
                      bias_addr, flags)


@lru_cache(maxsize=64)
def compile(spec):  # noqa: A001 - the public name the architecture asks for
    return CompiledKernel(spec)
