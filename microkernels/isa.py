"""Instruction-set facts: which vector ISA the host has and what it offers the micro-kernels.

This is the only module that knows instruction sets. Everything downstream gets plain numbers
(vector bytes, register count) or an ``Isa`` by name.
"""
import os
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
    # (target triple, LLVM CPU, features) to compile its kernels on another host, for checking
    cross_target: tuple = ()
    # itemsize -> LLVM intrinsic permuting the lanes of one vector by a run-time index vector,
    # where the ISA has one but no two-source permute (a two-source one serves as well)
    one_source_permute: tuple = ()

    def lanes(self, itemsize):
        return self.vector_bytes // itemsize

    def permute(self, itemsize):
        """The two-source permute intrinsic's name for ``itemsize`` elements, or None."""
        return dict(self.two_source_permute).get(itemsize)

    def lane_permute(self, itemsize):
        """(intrinsic name, its source count) of a run-time permute of ``itemsize`` elements,
        or None."""
        if self.permute(itemsize):
            return self.permute(itemsize), 2
        name = dict(self.one_source_permute).get(itemsize)
        return (name, 1) if name else None


# Most capable first; "generic" needs nothing and is the always-working fallback: plain LLVM
# vectors that any target lowers (to SSE, NEON, or scalar code).
ISAS = {
    "avx512": Isa("avx512", 64, 32, ("avx512f", "avx512vl", "fma"),
                  ((4, "llvm.x86.avx512.vpermi2var.ps.512"), (8, "llvm.x86.avx512.vpermi2var.pd.512"))),
    "avx2": Isa("avx2", 32, 16, ("avx2", "fma"), one_source_permute=((4, "llvm.x86.avx2.permps"),)),
    "neon": Isa("neon", 16, 32, ("neon",), (),   # aarch64: 32 registers of 128 bits
                ("aarch64-unknown-linux-gnu", "generic", "+neon")),
    "generic": Isa("generic", 16, 16, ()),
}
# AArch64's Linux and macOS ABIs include Advanced SIMD (NEON): it is there even where the OS
# does not list it (as under qemu's user mode)
BASELINE_FEATURES = {"aarch64": ("neon",), "arm64": ("neon",)}


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
    baseline = BASELINE_FEATURES.get(llvm.get_process_triple().split("-")[0], ())
    enabled = {name for name, on in llvm.get_host_cpu_features().items() if on}
    return frozenset(enabled | set(baseline))


@compiled_once
def host_target():
    """(process triple, CPU name, LLVM feature string) of this host, read once: LLVM builds
    the feature string anew on every call (0.3 ms; a model's load asks for it per kernel)."""
    host_features()   # initialises the native target
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


def host_isa():
    return select_isa(host_features())


# host features with which an FMA takes a lane mask at no cost: AVX-512's mask registers, on
# its vectors and (VL) on AVX2's
MASKED_FMA_FEATURES = ("avx512f", "avx512vl")


def masked_fma():
    """Whether this host's vector FMAs take a lane mask at no cost (kernels of any x86 ISA
    compiled here use its mask registers); elsewhere a mask is a blend after each FMA."""
    return all(f in host_features() for f in MASKED_FMA_FEATURES)


ISA_ENV = "CSO_ISA"


def default_isa():
    """The ISA kernels are compiled for when a call names none: ``$CSO_ISA`` (e.g. ``avx2`` on an
    AVX-512 host, to measure what AVX2 machines get; it must be one this CPU runs), else the
    host's best."""
    name = os.environ.get(ISA_ENV, "").strip()
    if not name:
        return host_isa()
    isa = get_isa(name)
    if isa not in supported_isas():
        raise ValueError(f"{ISA_ENV}={name!r} is not supported by this CPU; supported: "
                         f"{[i.name for i in supported_isas()]}")
    return isa


def supported_isas():
    """Every ISA this host can run, best first."""
    features = host_features()
    return [isa for isa in ISAS.values() if all(f in features for f in isa.required_features)]


def get_isa(name):
    try:
        return ISAS[name]
    except KeyError:
        raise ValueError(f"unknown ISA {name!r}; known: {sorted(ISAS)}") from None
