"""Kernel specs: what a generated function computes and where it runs, one frozen dataclass per
kernel family. A spec's ``name`` is its cache key and the function's symbol; ``parse`` reads a
name back (``parse_name`` any family's)."""
import re
from dataclasses import dataclass, fields

from .dtypes import DTYPES, get_dtype
from .isa import get_isa

_DTYPE = "(" + "|".join(DTYPES) + ")"
VARIANTS = {"packed": "", "slab": "_slab", "direct": "_direct"}   # KernelSpec variant -> suffix


class _Spec:
    """What every spec has: a ``dtype`` (short name, ``microkernels.dtypes``) and an ``isa``
    name, checked; a ``name``, and ``parse`` (by the family's ``_NAME`` pattern, whose groups
    are the fields in order, integers converted)."""

    def __post_init__(self):
        get_dtype(self.dtype)
        get_isa(self.isa)

    @property
    def np_dtype(self):
        return get_dtype(self.dtype).np_dtype

    @property
    def lanes(self):
        return get_isa(self.isa).lanes(get_dtype(self.dtype).itemsize)

    def __str__(self):
        return self.name

    @classmethod
    def parse(cls, name):
        m = cls._NAME.match(name)
        if not m:
            raise ValueError(f"not a {cls.__name__} name: {name!r} (expected e.g. {cls._EXAMPLE!r})")
        return cls(*(int(g) if f.type is int else g for f, g in zip(fields(cls), m.groups())))


@dataclass(frozen=True)
class KernelSpec(_Spec):
    """The outer-product micro-kernel (``microkernels.outer_product``): ``broadcasts`` values
    of the broadcast operand (rows of C) by ``width`` elements along the vectors (a multiple of
    the lanes), for one dtype and ISA. With windows in vectors, ``broadcasts`` are filters and
    ``width`` windows; with filters in vectors the other way round. ``variant``: "packed"
    (operand A, the vectors, a packed tile), "slab" (A read in place from a padded slab) or
    "direct" (B, the broadcasts, read in place from a slab)."""
    dtype: str
    broadcasts: int
    width: int
    isa: str
    variant: str = "packed"

    _NAME = re.compile(rf"^{_DTYPE}_conv_ukernel_(\d+)x(\d+)__(\w+)$")
    _EXAMPLE = "f32_conv_ukernel_8x32__avx512"

    def __post_init__(self):
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise ValueError(f"KernelSpec variant must be one of {sorted(VARIANTS)}, got "
                             f"{self.variant!r}")
        lanes = self.lanes
        if self.broadcasts < 1 or self.width < 1 or self.width % lanes:
            raise ValueError(f"KernelSpec needs broadcasts >= 1 and width a positive multiple of "
                             f"the {lanes} vector lanes, got broadcasts={self.broadcasts}, "
                             f"width={self.width}")

    @property
    def vectors(self):
        """Vectors per row of the tile."""
        return self.width // self.lanes

    @property
    def name(self):
        return (f"{self.dtype}_conv_ukernel_{self.broadcasts}x{self.width}"
                f"{VARIANTS[self.variant]}__{self.isa}")

    @classmethod
    def parse(cls, name):
        for variant, suffix in VARIANTS.items():
            if suffix and suffix + "__" in name:
                spec = super().parse(name.replace(suffix + "__", "__", 1))
                return cls(spec.dtype, spec.broadcasts, spec.width, spec.isa, variant)
        return super().parse(name)


@dataclass(frozen=True)
class DepthwiseSpec(_Spec):
    """The depthwise micro-kernel (``microkernels.depthwise``): one output channel computed
    along the virtual rows of a padded slab, ``vectors`` vectors (accumulators) per block."""
    dtype: str
    vectors: int
    isa: str

    _NAME = re.compile(rf"^{_DTYPE}_dw_ukernel_(\d+)v__(\w+)$")
    _EXAMPLE = "f32_dw_ukernel_4v__avx512"

    def __post_init__(self):
        super().__post_init__()
        if self.vectors < 1:
            raise ValueError(f"DepthwiseSpec needs vectors >= 1, got {self.vectors}")

    @property
    def name(self):
        return f"{self.dtype}_dw_ukernel_{self.vectors}v__{self.isa}"


@dataclass(frozen=True)
class TransposeSpec(_Spec):
    """The block transpose with the convolution epilogue (``microkernels.transpose``), blocks
    of up to lanes x lanes."""
    dtype: str
    isa: str

    _NAME = re.compile(rf"^{_DTYPE}_transpose_\d+x\d+__(\w+)$")
    _EXAMPLE = "f32_transpose_16x16__avx512"

    @property
    def name(self):
        return f"{self.dtype}_transpose_{self.lanes}x{self.lanes}__{self.isa}"

    @classmethod
    def parse(cls, name):
        spec = super().parse(name)
        if spec.name != name:
            raise ValueError(f"not a TransposeSpec name: {name!r} (blocks are lanes x lanes: "
                             f"{spec.name!r})")
        return spec


@dataclass(frozen=True)
class RowCopySpec(_Spec):
    """The packers' row copy (``microkernels.row_copy.define_row_copy``) for rows of
    ``width`` elements."""
    dtype: str
    width: int
    isa: str

    _NAME = re.compile(rf"^{_DTYPE}_row_copy_(\d+)__(\w+)$")
    _EXAMPLE = "f32_row_copy_32__avx512"

    def __post_init__(self):
        super().__post_init__()
        if self.width < 1:
            raise ValueError(f"{type(self).__name__} needs width >= 1, got {self.width}")

    @property
    def name(self):
        return f"{self.dtype}_row_copy_{self.width}__{self.isa}"


@dataclass(frozen=True)
class TapCopySpec(RowCopySpec):
    """The packers' copy of all taps of a filter row from one read of each input row
    (``microkernels.row_copy.define_tap_copy``), for rows of ``width`` elements."""
    _NAME = re.compile(rf"^{_DTYPE}_tap_copy_(\d+)__(\w+)$")
    _EXAMPLE = "f32_tap_copy_32__avx512"

    @property
    def name(self):
        return f"{self.dtype}_tap_copy_{self.width}__{self.isa}"


FAMILIES = (KernelSpec, DepthwiseSpec, TransposeSpec, RowCopySpec, TapCopySpec)


def parse_name(name):
    """The spec of any family named ``name``; ValueError for other names."""
    for family in FAMILIES:
        try:
            return family.parse(name)
        except ValueError:
            continue
    raise ValueError(f"not a kernel name: {name!r} (expected e.g. "
                     f"{', '.join(repr(f._EXAMPLE) for f in FAMILIES)})")
