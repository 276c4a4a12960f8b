"""KernelSpec: what a micro-kernel computes and where it runs. Its name is its cache key."""
import re
from dataclasses import dataclass

import numpy as np

from .isa import get_isa

DTYPES = {"f32": np.dtype(np.float32), "f64": np.dtype(np.float64)}
_NAME = re.compile(r"^(f32|f64)_conv_ukernel_(\d+)x(\d+)(_slab|_bslab)?__(\w+)$")
SLABS = {"": "", "vector": "_slab", "broadcast": "_bslab"}   # slab mode -> name suffix


class _DtypeIsa:
    """What every kernel spec has: a ``dtype`` ("f32" or "f64") and an ``isa`` name, checked,
    and a ``name`` that is its cache key."""

    def _check_dtype(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"{type(self).__name__} dtype must be one of {sorted(DTYPES)}, "
                             f"got {self.dtype!r}")

    @property
    def np_dtype(self):
        return DTYPES[self.dtype]

    @property
    def lanes(self):
        return get_isa(self.isa).lanes(DTYPES[self.dtype].itemsize)

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class KernelSpec(_DtypeIsa):
    """An ``nf`` x ``nwin`` outer-product tile: ``nf`` broadcast values by ``nwin`` vector
    lanes (windows by filters, or filters by windows when filters are in vectors) for one dtype
    and ISA. A ``slab`` kernel reads one operand in place from a padded input slab, its rows
    by an offset table: ``"vector"``, the vector operand (windows on a virtual row whose padding
    columns it never stores), or ``"broadcast"``, the broadcast operand (filters in vectors,
    windows consecutive on one slab row); see ``ir_gen``."""
    dtype: str   # "f32" or "f64"
    nf: int
    nwin: int
    isa: str
    slab: str = ""   # "", "vector" or "broadcast"

    def __post_init__(self):
        self._check_dtype()
        if self.slab not in SLABS:
            raise ValueError(f"KernelSpec slab must be one of {sorted(SLABS)}, got {self.slab!r}")
        lanes = self.lanes
        if self.nf < 1 or self.nwin < 1 or self.nwin % lanes:
            raise ValueError(f"KernelSpec needs nf >= 1 and nwin a positive multiple of the "
                             f"{lanes} vector lanes, got nf={self.nf}, nwin={self.nwin}")

    @property
    def vectors(self):
        """Vectors per window row of the tile."""
        return self.nwin // self.lanes

    @property
    def name(self):
        return f"{self.dtype}_conv_ukernel_{self.nf}x{self.nwin}{SLABS[self.slab]}__{self.isa}"

    @classmethod
    def parse(cls, name):
        m = _NAME.match(name)
        if not m:
            raise ValueError(f"not a kernel name: {name!r} "
                             "(expected e.g. 'f32_conv_ukernel_8x32__avx512')")
        dtype, nf, nwin, slab, isa = m.groups()
        mode = {suffix: mode for mode, suffix in SLABS.items()}[slab or ""]
        return cls(dtype, int(nf), int(nwin), isa, mode)

    @classmethod
    def for_dtype(cls, dtype, nf, nwin, isa, slab=""):
        return cls(short_dtype(dtype), nf, nwin, isa, slab)


def short_dtype(dtype):
    """"f32" or "f64" for a NumPy dtype; TypeError for others."""
    for short, dt in DTYPES.items():
        if dt == np.dtype(dtype):
            return short
    raise TypeError(f"no micro-kernel for dtype {np.dtype(dtype)}; supported: float32, float64")


@dataclass(frozen=True)
class DepthwiseSpec(_DtypeIsa):
    """A depthwise micro-kernel (``microkernels.depthwise``): one output channel computed
    along the virtual rows of a padded slab, ``vectors`` vectors (accumulators) per block, for
    one dtype and ISA."""
    dtype: str   # "f32" or "f64"
    vectors: int
    isa: str

    def __post_init__(self):
        self._check_dtype()
        if self.vectors < 1:
            raise ValueError(f"DepthwiseSpec needs vectors >= 1, got {self.vectors}")

    @property
    def name(self):
        return f"{self.dtype}_dw_ukernel_{self.vectors}v__{self.isa}"
