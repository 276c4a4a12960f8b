"""JIT-compile generated functions for the host, each in a module of its own.

The convolution loop nests call micro-kernels and packing helpers compiled here through their
addresses (``native_function``): each kernel's object code is kept by the persistent cache,
while the loop nests (compiled here too) stay generic over the micro-tile;
``microkernels.wrappers`` wraps kernels for calls from Python. Each module owns its execution
engine and target machine (sharing one target machine between engines crashed after the first
engine was freed). Every LLVM call runs under the compile lock and no module is ever freed
(``microkernels.once``): several threads may compile at once, and a freed engine unmaps code
another thread may run.
"""
import ctypes
import struct
import sys

import llvmlite.binding as llvm
from llvmlite import ir

from . import cache
from .isa import get_isa, host_target
from .once import COMPILE_LOCK, compiled_once

_live = []   # every JitModule made: never freed (see the module's docstring)


def host_target_machine(opt=3):
    triple, cpu, features = host_target()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=opt, codemodel="jitdefault", jit=True)


def optimize(module_ref, target_machine):
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(target_machine, tuning)
    builder.getModulePassManager().run(module_ref, builder)


def undefined_symbols(object_code):
    """The names of the symbols a relocatable ELF64 object (``object_code``) takes from outside
    it, or None for any other format (not read here)."""
    data = bytes(object_code)
    if data[:5] != b"\x7fELF\x02" or data[5] not in (1, 2):
        return None
    order = "<" if data[5] == 1 else ">"
    (offset,), (size, count) = struct.unpack_from(order + "Q", data, 0x28), \
        struct.unpack_from(order + "HH", data, 0x3A)
    # (type, offset, size, link, entry size) of each section
    sections = [struct.unpack_from(order + "4xI16xQQI12xQ", data, offset + i * size)
                for i in range(count)]
    names = set()
    for kind, at, nbytes, link, step in sections:
        if kind != 2 or not step:   # SHT_SYMTAB
            continue
        strings = sections[link][1]
        for entry in range(at, at + nbytes, step):
            name, index = struct.unpack_from(order + "I2xH", data, entry)
            if name and index == 0:   # SHN_UNDEF
                start = strings + name
                names.add(data[start:data.index(b"\0", start)].decode())
    return sorted(names)


class UnresolvedSymbols(LookupError):
    """Object code that takes symbols this process does not define (or whose symbols cannot be
    read): it is not loaded."""


class JitModule:
    """Code for the host in an MCJIT engine of its own (with its own target machine, see
    above): LLVM IR text verified, optimised and compiled (``object_code`` then holds the
    result), or ``object_code`` saved from such a compilation and loaded as it is.
    ``.address(name)``, ``.function(name, restype, *argtypes)`` (a ctypes function that keeps
    this module alive), and ``.ir`` (optimised) and ``.asm``, made on first use from the IR text
    (``source``: a function returning it, for a module loaded from its object code).

    ``check_symbols``: object code is loaded only if every symbol it takes from outside
    (``undefined_symbols``) resolves in this process, else ``UnresolvedSymbols`` is raised
    (MCJIT would link an unresolved one to address 0, a crash on the first call that reaches
    it): for object code not generated here (numba's)."""

    def __init__(self, ir_text=None, object_code=None, source=None, check_symbols=False):
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
                empty = llvm.parse_assembly(f'target triple = "{host_target()[0]}"')
                self._engine = llvm.create_mcjit_compiler(empty, self._target_machine)
                if check_symbols:   # (an engine makes the process's own symbols visible)
                    names = undefined_symbols(object_code)
                    missing = ["(not ELF)"] if names is None else \
                        [name for name in names if not llvm.address_of_symbol(name)]
                    if missing:
                        raise UnresolvedSymbols(", ".join(missing))
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


def cross_assembly(define, spec):
    """The assembly of the function ``define(module, spec)`` defines for kernel ``spec``,
    compiled for its ISA's own target (``Isa.cross_target``) whatever the host: NEON kernels'
    code is checked on x86 machines."""
    triple, cpu, features = get_isa(spec.isa).cross_target
    module = ir.Module(name=spec.name)
    module.triple = triple
    define(module, spec)
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
    """The function ``define(module, *args)`` defines (e.g. ``outer_product.define_kernel``,
    ``spec``), compiled once per process (or loaded from the persistent cache). Kept for the
    life of the process: compiled loop nests hold its address."""
    return NativeFunction(define, *args)


# hosts whose object files (64-bit ELF) have the symbol table JitModule's check_symbols reads
LOADS_FOREIGN_OBJECTS = sys.platform.startswith(("linux", "freebsd")) and sys.maxsize > 2 ** 32


class ForeignFunction:
    """A function compiled by other means than this package's IR (numba's ``cfunc``...), its
    object code kept in the persistent cache under ``key`` (its maker's name and arguments,
    with whatever else its code depends on: the entry directory covers only the registered
    packages' sources, llvmlite's and Python's versions). ``compile(keep)`` compiles it and
    returns (its symbol name, its address, the object owning its code, its object code or
    None); ``keep``: whether that object code will be cached (if not, the compiler may cache
    its own way). A later process loads the cached object code here when every symbol it
    takes from outside resolves (``JitModule``'s ``check_symbols``; the caller registers
    those of the foreign compiler's runtime with ``llvm.add_symbol`` first), else compiles
    it again, its own way. ``.address``, and ``.code``: the ``JitModule`` or the compiler's
    object, kept for the life of the process (memoise it: ``compiled_once``)."""

    def __init__(self, key, compile):
        path = cache.native_path(*key) if LOADS_FOREIGN_OBJECTS else None
        saved = cache.load_native(path)
        if saved is not None:
            name, object_code = saved
            try:
                self.code = JitModule(object_code=object_code, check_symbols=True)
                self.address = self.code.address(name)
            except UnresolvedSymbols:
                path = None
            else:
                if self.address:   # (else the entry does not define it: compiled again)
                    return
        name, self.address, self.code, object_code = compile(path is not None)
        if path is not None and object_code:
            cache.save_native(path, (name, bytes(object_code)))
