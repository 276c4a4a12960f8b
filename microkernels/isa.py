"""Instruction-set facts: which vector ISA the host has and what it offers the micro-kernels.

This is the only module that knows instruction sets. Everything downstream gets plain numbers
(vector bytes, register count) or an ``Isa`` by name.
"""
from dataclasses import dataclass
import llvmlite.binding as llvm

from .once import compiled_once


@dataclass(frozen=True)
class Isa:
    name: str
    vector_bytes: int        # width of one vector register
    vector_registers: int    # architectural vector registers the register budget may use
    required_features: tuple  # LLVM host features that must all be present
    # itemsize -> LLVM intrinsic permuting the lanes of two vectors by a run-time index vector
    # (a vector at any element offset from two aligned loads), where the ISA has one
    two_source_permute: tuple = ()

    def lanes(self, itemsize):
        return self.vector_bytes // itemsize

    def permute(self, itemsize):
        """The two-source permute intrinsic's name for ``itemsize`` elements, or None."""
        return dict(self.two_source_permute).get(itemsize)


# Most capable first; "generic" needs nothing and is the always-working fallback: plain LLVM
# vectors that any target lowers (to SSE, NEON, or scalar code).
ISAS = {
    "avx512": Isa("avx512", 64, 32, ("avx512f", "avx512vl", "fma"),
                  ((4, "llvm.x86.avx512.vpermi2var.ps.512"), (8, "llvm.x86.avx512.vpermi2var.pd.512"))),
    "avx2": Isa("avx2", 32, 16, ("avx2", "fma")),
    "generic": Isa("generic", 16, 16, ()),
}


def select_isa(features):
    """The best ISA whose required features are all in ``features`` (a set of enabled names)."""
    for isa in ISAS.values():
        if all(f in features for f in isa.required_features):
            return isa
    raise AssertionError("the generic ISA requires nothing")


@compiled_once
def host_features():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return frozenset(name for name, on in llvm.get_host_cpu_features().items() if on)


def host_isa():
    return select_isa(host_features())


def supported_isas():
    """Every ISA this host can run, best first."""
    features = host_features()
    return [isa for isa in ISAS.values() if all(f in features for f in isa.required_features)]


def get_isa(name):
    try:
        return ISAS[name]
    except KeyError:
        raise ValueError(f"unknown ISA {name!r}; known: {sorted(ISAS)}") from None
