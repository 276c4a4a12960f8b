"""The element types kernels are generated for: one table, read by every layer.

Each dtype has a short name (kernel names: ``f32``), its NumPy name (``ConvSpec.dtype``, user
facing: ``float32``), its size and its LLVM scalar type. Nothing heavy is imported here: the
analysis (``csa``) reads this table without loading NumPy or llvmlite.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Dtype:
    short: str       # in kernel names
    name: str        # NumPy's name
    itemsize: int
    llvm_type: str   # the llvmlite.ir type class

    @property
    def np_dtype(self):
        import numpy as np
        return np.dtype(self.name)

    def llvm(self):
        """The LLVM scalar type (a new llvmlite.ir type)."""
        from llvmlite import ir
        return getattr(ir, self.llvm_type)()


DTYPES = {d.short: d for d in (Dtype("f32", "float32", 4, "FloatType"),
                               Dtype("f64", "float64", 8, "DoubleType"))}
NUMPY_NAMES = tuple(d.name for d in DTYPES.values())


def get_dtype(short):
    """The ``Dtype`` of short name ``short``; ValueError naming the supported ones."""
    try:
        return DTYPES[short]
    except KeyError:
        raise ValueError(f"unknown dtype {short!r}; supported: {sorted(DTYPES)}") from None


def dtype_name(dtype):
    """The short name of a NumPy dtype (or anything ``np.dtype`` takes); TypeError for dtypes
    no kernel is generated for."""
    import numpy as np
    dtype = np.dtype(dtype)
    for d in DTYPES.values():
        if d.np_dtype == dtype:
            return d.short
    raise TypeError(f"no micro-kernel for dtype {dtype}; supported: {', '.join(NUMPY_NAMES)}")
