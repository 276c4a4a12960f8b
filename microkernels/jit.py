"""JIT-compile generated functions for the host, each in a module of its own.

The convolution loop nests call micro-kernels and packing helpers compiled here through their
addresses (``native_function``): a kernel compiles in about 0.1 s and its object code is kept by
the persistent cache, while the loop nests (compiled here too) stay generic over the
micro-tile. ``compile(spec)`` wraps a kernel for calls from Python (tests,
inspection, ``python -m microkernels.dump``). Each module owns its execution engine and target
machine (sharing one target machine between engines crashed after the first engine was freed).
Every LLVM call runs under the compile lock and no module is ever freed (``microkernels.once``):
several threads may compile at once, and a freed engine unmaps code another thread may run.
"""
import ctypes
from functools import lru_cache

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from . import cache
from .ir_gen import BIAS, define_kernel
from .reference import stored_windows
from .isa import get_isa, host_features
from .once import COMPILE_LOCK, compiled_once

_live = []   # every JitModule made: never freed (see the module's docstring)


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


class JitModule:
    """Code for the host in an MCJIT engine of its own (with its own target machine, see
    above): LLVM IR text verified, optimised and compiled (``object_code`` then holds the
    result), or ``object_code`` saved from such a compilation and loaded as it is.
    ``.address(name)``, ``.function(name, restype, *argtypes)`` (a ctypes function that keeps
    this module alive), and ``.ir`` (optimised) and ``.asm``, made on first use from the IR text
    (``source``: a function returning it, for a module loaded from its object code)."""

    def __init__(self, ir_text=None, object_code=None, source=None):
        self._source = source or (lambda: ir_text)
        self._optimized = None
        with COMPILE_LOCK:
            self._target_machine = host_target_machine()
            if object_code is None:
                ref = llvm.parse_assembly(ir_text)
                ref.verify()
                optimize(ref, self._target_machine)
                compiled = []
                self._engine = llvm.create_mcjit_compiler(ref, self._target_machine)
                self._engine.set_object_cache(lambda module, data: compiled.append(bytes(data)))
                self._engine.finalize_object()
                object_code = compiled[0]
            else:
                empty = llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"')
                self._engine = llvm.create_mcjit_compiler(empty, self._target_machine)
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
                self._engine.finalize_object()
            self.object_code = object_code
            _live.append(self)

    def _optimized_text(self, emit):
        with COMPILE_LOCK:
            if self._optimized is None:
                self._optimized = llvm.parse_assembly(self._source())
                optimize(self._optimized, self._target_machine)
            return emit(self._optimized)

    @property
    def ir(self):
        return self._optimized_text(str)

    @property
    def asm(self):
        return self._optimized_text(self._target_machine.emit_assembly)

    def address(self, name):
        return self._engine.get_function_address(name)

    def function(self, name, restype, *argtypes):
        function = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(name))
        function.module = self   # the engine owns the code
        return function


class NativeFunction:
    """The function ``define(module, *args)`` defines in a new module, compiled for the host:
    ``.name``, ``.address`` and the ``.module`` (a ``JitModule``) that owns its code. Its
    object code is kept in the persistent cache under the generator's name and ``args`` (the
    cache's directory is per source hash, so the IR is only generated to compile it)."""

    def __init__(self, define, *args):
        self._define, self._args = define, args
        path = cache.native_path(define.__module__, define.__qualname__, *args)
        saved = cache.load_native(path)
        if saved is not None:
            self.name, object_code = saved
            self.module = JitModule(object_code=object_code, source=lambda: self._ir()[0])
        else:
            text, self.name = self._ir()
            self.module = JitModule(text)
            cache.save_native(path, (self.name, self.module.object_code))
        self.address = self.module.address(self.name)

    def _ir(self):
        """(the module's IR text, the defined function's name)"""
        module = ir.Module(name=f"{self._define.__name__}{self._args}")
        module.triple = llvm.get_process_triple()
        name = self._define(module, *self._args).name
        return str(module), name


def cross_assembly(spec):
    """The assembly of kernel ``spec`` compiled for its ISA's own target (``Isa.cross_target``)
    whatever the host: NEON kernels' code is checked on x86 machines."""
    triple, cpu, features = get_isa(spec.isa).cross_target
    module = ir.Module(name=spec.name)
    module.triple = triple
    define_kernel(module, spec)
    with COMPILE_LOCK:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        machine = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features,
                                                                        opt=3)
        ref = llvm.parse_assembly(str(module))
        try:
            ref.verify()
            optimize(ref, machine)
            return machine.emit_assembly(ref)
        finally:   # freed under the lock too: a module's disposal touches LLVM's context
            ref.close()
            machine.close()


@compiled_once
def native_function(define, *args):
    """The function ``define(module, *args)`` defines (e.g. ``ir_gen.define_kernel``,
    ``spec``), compiled once per process (or loaded from the persistent cache). Kept for the
    life of the process: compiled loop nests hold its address."""
    return NativeFunction(define, *args)


class CompiledKernel:
    """A kernel compiled for the host: ``.ir`` (optimised LLVM IR), ``.asm`` and a ctypes
    ``function(k, a, lda, b, ldb, c, ldc, nwin_used, nf_used, bias, flags, a_rows, col0, width,
    gap)`` taking raw addresses."""

    def __init__(self, spec):
        self.spec = spec
        native = native_function(define_kernel, spec)
        compiled = self._compiled = native.module
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        args = [i64, ptr, i64, ptr, i64, ptr, i64, i64, i64, ptr, i64, ptr, i64, i64, i64]
        self.function = compiled.function(native.name, None, *args)

    @property
    def ir(self):
        return self._compiled.ir

    @property
    def asm(self):
        return self._compiled.asm

    def __call__(self, k, a, b, c, ldc, nwin_used, nf_used, bias=None, flags=0, lda=None, ldb=None,
                 a_rows=None, col0=0, width=None, gap=0):
        """Run on NumPy arrays, after checking every size and stride against the contract so
        that no call from Python can touch memory outside the arrays; ``lda`` and ``ldb``
        default to packed tiles' ``nwin`` and ``nf``. A slab kernel takes ``a_rows`` (int64
        element offsets of A's rows, or B's for a broadcast slab), a vector slab kernel also
        its virtual row (``col0``, ``width``, ``gap``)."""
        spec = self.spec
        lda = spec.nwin if lda is None else lda
        ldb = spec.nf if ldb is None else ldb
        if not (k >= 1 and lda >= spec.nwin and ldb >= spec.nf and 1 <= nf_used <= spec.nf and
                1 <= nwin_used <= spec.nwin):
            raise ValueError(f"need k >= 1, lda >= {spec.nwin}, ldb >= {spec.nf}, 1 <= nf_used <= "
                             f"{spec.nf}, 1 <= nwin_used <= {spec.nwin}; got k={k}, lda={lda}, "
                             f"ldb={ldb}, nf_used={nf_used}, nwin_used={nwin_used}")
        a_need, b_need, rows_addr = (k - 1) * lda + spec.nwin, (k - 1) * ldb + spec.nf, 0
        if spec.slab:
            if (not isinstance(a_rows, np.ndarray) or a_rows.dtype != np.int64
                    or not a_rows.flags.c_contiguous or a_rows.size < k or a_rows[:k].min() < 0):
                raise ValueError(f"a_rows must be a C-contiguous int64 array of at least k={k} "
                                 "non-negative offsets")
            rows_addr = a_rows.ctypes.data
        if spec.slab == "broadcast":
            b_need = int(a_rows[:k].max()) + spec.nf
        if spec.slab == "vector":
            if not (width is not None and 0 <= gap < width and 0 <= col0 < width
                    and col0 + spec.nwin <= 2 * width):
                raise ValueError(f"need 0 <= gap < width, 0 <= col0 < width, col0 + {spec.nwin} "
                                 f"<= 2*width; got col0={col0}, width={width}, gap={gap}")
            a_need = int(a_rows[:k].max()) + spec.nwin
        _, offsets = stored_windows(nwin_used, col0, width if spec.slab == "vector" else None, gap)
        if offsets.size and ldc < offsets.max() + 1:
            raise ValueError(f"need ldc >= the {offsets.max() + 1} columns a C row is stored on, "
                             f"got ldc={ldc}")
        c_need = (nf_used - 1) * ldc + (offsets.max() + 1 if offsets.size else 0)
        needs = [("a", a, a_need), ("b", b, b_need), ("c", c, c_need)]
        if flags & BIAS:
            needs.append(("bias", bias, nf_used))
        for name, arr, need in needs:
            if (not isinstance(arr, np.ndarray) or arr.dtype != spec.np_dtype
                    or not arr.flags.c_contiguous or arr.size < need):
                raise ValueError(f"{name} must be a C-contiguous {spec.np_dtype} array of at least "
                                 f"{need} elements, got {getattr(arr, 'dtype', type(arr).__name__)} "
                                 f"of shape {getattr(arr, 'shape', None)}")
        if not c.flags.writeable:
            raise ValueError("c must be writeable")
        bias_addr = bias.ctypes.data if flags & BIAS else 0
        self.function(k, a.ctypes.data, lda, b.ctypes.data, ldb, c.ctypes.data, ldc, nwin_used,
                      nf_used, bias_addr, flags, rows_addr, col0, width or 0, gap)


@lru_cache(maxsize=64)
def compile(spec):  # noqa: A001 - the public name the architecture asks for
    return CompiledKernel(spec)
