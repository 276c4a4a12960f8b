"""Micro-kernels: ISA detection, KernelSpec, the llvmlite IR generator and its JIT."""
from .ir_gen import ACCUMULATE, BIAS, RELU
from .isa import ISAS, Isa, default_isa, get_isa, host_isa, select_isa, supported_isas
from .jit import CompiledKernel, compile
from .reference import reference_kernel
from .spec import DepthwiseSpec, KernelSpec

__all__ = ["ACCUMULATE", "BIAS", "RELU", "ISAS", "Isa", "default_isa", "get_isa", "host_isa",
           "select_isa",
           "supported_isas", "CompiledKernel", "compile", "reference_kernel", "KernelSpec", "DepthwiseSpec"]
