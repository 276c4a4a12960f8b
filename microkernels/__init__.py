"""Micro-kernels: ISA detection, kernel specs, the llvmlite IR generators, their JIT and Python
wrappers. Names are imported on first use, so that ``microkernels.dtypes`` costs nothing to
import (``csa`` reads it)."""
from importlib import import_module

_EXPORTS = {
    "ir": ("ACCUMULATE", "BIAS", "ACTIVATE"),
    "isa": ("ISAS", "Isa", "default_isa", "get_isa", "host_isa", "select_isa", "supported_isas"),
    "spec": ("KernelSpec", "DepthwiseSpec", "BlockedDepthwiseSpec", "TransposeSpec", "RowCopySpec", "TapCopySpec",
             "ActivationSpec", "ACTIVATIONS", "parse_name"),
    "wrappers": ("compile",),
    "reference": ("reference_kernel",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_MODULE_OF[name]}", __name__), name)
