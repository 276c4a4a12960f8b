"""Kernel specs: what a generated function computes and where it runs, one frozen dataclass per
kernel family. A spec's ``name`` is its cache key and the function's symbol; ``parse`` reads a
name back (``parse_name`` any family's)."""
import re
from dataclasses import dataclass, fields, replace

from .dtypes import DTYPES, get_dtype
from .isa import get_isa

VARIANTS = {"packed": "", "slab": "_slab", "direct": "_direct", "blocked": "_blocked"}   # KernelSpec variant -> suffix
NEXT = "_next"   # the suffix of a KernelSpec with prefetch_next
MERGED = "_merged"   # and of one with merged

# activation kind -> the names of its run-time parameters, in the order kernels take them
# (``microkernels.activation``; PyTorch's semantics, ``cso.Activation``)
ACTIVATIONS = {"identity": (), "relu": (), "clip": ("min", "max"), "leaky_relu": ("alpha",),
               "sigmoid": (), "silu": (), "tanh": (), "hardsigmoid": ("alpha", "beta"),
               "hardswish": (), "gelu": (), "gelu_tanh": (), "erf": ()}


# the activation a store applies when its flag (``ir.ACTIVATE``) is set, unless the spec says
# another: the one kernels had first, unnamed in their names
STORE_ACTIVATION = "relu"


class _Spec:
    """What every spec has: a ``dtype`` (short name, ``microkernels.dtypes``) and an ``isa``
    name, checked, and counts (its int fields), at least 1 (at least 0 for a count whose
    default is 0: an option left off); a ``name`` (the family's ``_FORMAT`` filled with fields
    and properties) and ``parse``, its inverse. A kernel that stores an output has an
    ``activation`` field, the kind (``ACTIVATIONS``, not the identity) its store applies on
    the ACTIVATE flag: its name says it before the ISA unless it is ``STORE_ACTIVATION``."""

    def __post_init__(self):
        get_dtype(self.dtype)
        get_isa(self.isa)
        activation = getattr(self, "activation", STORE_ACTIVATION)
        if activation not in ACTIVATIONS or activation == "identity":
            raise ValueError(f"{type(self).__name__} activation must be one of "
                             f"{sorted(set(ACTIVATIONS) - {'identity'})}, got {activation!r}")
        for field in fields(self):
            least = 0 if field.default == 0 else 1
            if field.type is int and getattr(self, field.name) < least:
                raise ValueError(f"{type(self).__name__} needs {field.name} >= {least}, got "
                                 f"{getattr(self, field.name)}")

    @property
    def np_dtype(self):
        return get_dtype(self.dtype).np_dtype

    @property
    def lanes(self):
        return get_isa(self.isa).lanes(get_dtype(self.dtype).itemsize)

    @property
    def name(self):
        parts = re.split(r"{(\w+)}", self._FORMAT)
        name = "".join(str(getattr(self, p)) if i % 2 else p for i, p in enumerate(parts))
        activation = getattr(self, "activation", STORE_ACTIVATION)
        if activation == STORE_ACTIVATION:
            return name
        head, isa = name.rsplit("__", 1)
        return f"{head}_{activation}__{isa}"

    def __str__(self):
        return self.name

    @classmethod
    def parse(cls, name):
        if "activation" in {f.name for f in fields(cls)}:
            head, _, isa = name.rpartition("__")
            # the longest kind the name ends with ("gelu_tanh" also ends with "_tanh")
            for kind in sorted(set(ACTIVATIONS) - {STORE_ACTIVATION}, key=len, reverse=True):
                if head.endswith("_" + kind):
                    spec = replace(cls._parse(f"{head[:-len(kind) - 1]}__{isa}"),
                                   activation=kind)
                    if spec.name != name:
                        raise ValueError(f"not a {cls.__name__} name: {name!r}")
                    return spec
        return cls._parse(name)

    @classmethod
    def _parse(cls, name):
        """``parse`` of a name without an activation."""
        types = {f.name: f.type for f in fields(cls)}
        pattern = "".join(
            re.escape(p) if i % 2 == 0 else
            rf"(?P<dtype>{'|'.join(DTYPES)})" if p == "dtype" else
            rf"(?P<{p}>\d+)" if types.get(p) is int else
            rf"(?P<{p}>\w+)" if p in types else r"\w*?"   # a property: the round trip checks it
            for i, p in enumerate(re.split(r"{(\w+)}", cls._FORMAT)))
        m = re.fullmatch(pattern, name)
        spec = m and cls(**{k: int(v) if types[k] is int else v for k, v in m.groupdict().items()})
        if not spec or spec.name != name:
            example = cls._FORMAT.replace("{dtype}", "f32").replace("{isa}", "avx2")
            raise ValueError(f"not a {cls.__name__} name: {name!r} (expected {example})")
        return spec


@dataclass(frozen=True)
class KernelSpec(_Spec):
    """The outer-product micro-kernel (``microkernels.outer_product``): ``broadcasts`` values
    of the broadcast operand (rows of C) by ``width`` elements along the vectors (a multiple of
    the lanes), for one dtype and ISA. With windows in vectors, ``broadcasts`` are filters and
    ``width`` windows; with filters in vectors the other way round. ``variant``: "packed"
    (operand A, the vectors, a packed tile), "slab" (A read in place from a padded slab),
    "direct" (B, the broadcasts, read in place from a slab) or "blocked" (B read in place from
    channel-blocked activations, C stored into them). ``prefetch``: the kernel asks for
    the cache lines of C's rows this many tiles (``width`` elements) further along, to be
    written (0: none); with windows in vectors the loop nest's later tiles store there.
    ``prefetch_next``: the kernel asks for a line of the caller's ``next`` operand each trip
    of its depth loop, to be read (with filters in vectors, its share of the filter tile the
    loop nest reads next). ``merged`` (blocked only): the filters are groups merged onto
    blocks (``packing.merge_groups``), and a lane whose filter at a row is a NaN of the sign
    bit (``packing.other_group``: another group's) takes no FMA from that row."""
    dtype: str
    broadcasts: int
    width: int
    isa: str
    variant: str = "packed"
    prefetch: int = 0
    activation: str = STORE_ACTIVATION
    prefetch_next: bool = False
    merged: bool = False

    _FORMAT = "{dtype}_conv_ukernel_{broadcasts}x{width}{suffix}__{isa}"

    def __post_init__(self):
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise ValueError(f"KernelSpec variant must be one of {sorted(VARIANTS)}, got "
                             f"{self.variant!r}")
        if self.merged and self.variant != "blocked":
            raise ValueError(f"KernelSpec merged needs the blocked variant (filters in "
                             f"vectors), got {self.variant!r}")
        if self.width % self.lanes:
            raise ValueError(f"KernelSpec width must be a multiple of the {self.lanes} vector "
                             f"lanes, got {self.width}")

    @property
    def vectors(self):
        """Vectors per row of the tile."""
        return self.width // self.lanes

    @property
    def suffix(self):
        return (VARIANTS[self.variant] + (f"_pf{self.prefetch}" if self.prefetch else "")
                + (NEXT if self.prefetch_next else "") + (MERGED if self.merged else ""))

    @classmethod
    def _parse(cls, name):
        if MERGED + "__" in name:
            spec = replace(cls._parse(name.replace(MERGED + "__", "__", 1)), merged=True)
            if spec.name != name:   # _merged_merged
                raise ValueError(f"not a {cls.__name__} name: {name!r}")
            return spec
        if NEXT + "__" in name:
            spec = replace(cls._parse(name.replace(NEXT + "__", "__", 1)), prefetch_next=True)
            if spec.name != name:   # _next_next
                raise ValueError(f"not a {cls.__name__} name: {name!r}")
            return spec
        prefetch = re.search(r"_pf(\d+)__", name)
        if prefetch:
            spec = replace(cls._parse(name[:prefetch.start()] + "__" + name[prefetch.end():]),
                           prefetch=int(prefetch.group(1)))
            if spec.name != name:   # _pf0, or a leading zero
                raise ValueError(f"not a {cls.__name__} name: {name!r}")
            return spec
        for variant, suffix in VARIANTS.items():
            if suffix and suffix + "__" in name:
                return replace(super()._parse(name.replace(suffix + "__", "__", 1)),
                               variant=variant)
        return super()._parse(name)


@dataclass(frozen=True)
class DepthwiseSpec(_Spec):
    """The depthwise micro-kernel (``microkernels.depthwise``): one output channel computed
    along the virtual rows of a padded slab, ``vectors`` vectors (accumulators) per block."""
    dtype: str
    vectors: int
    isa: str
    activation: str = STORE_ACTIVATION

    _FORMAT = "{dtype}_dw_ukernel_{vectors}v__{isa}"


@dataclass(frozen=True)
class BlockedDepthwiseSpec(_Spec):
    """The depthwise micro-kernel on channel-blocked activations
    (``microkernels.depthwise_blocked``): ``windows`` output pixels of one block of channels
    (the vector lanes), an accumulator each."""
    dtype: str
    windows: int
    isa: str
    activation: str = STORE_ACTIVATION

    _FORMAT = "{dtype}_dw_blocked_ukernel_{windows}w__{isa}"


@dataclass(frozen=True)
class TransposeSpec(_Spec):
    """The block transpose with the convolution epilogue (``microkernels.transpose``), blocks
    of up to lanes x lanes."""
    dtype: str
    isa: str
    activation: str = STORE_ACTIVATION

    _FORMAT = "{dtype}_transpose_{lanes}x{lanes}__{isa}"


@dataclass(frozen=True)
class RowCopySpec(_Spec):
    """The packers' row copy (``microkernels.row_copy.define_row_copy``) for rows of
    ``width`` elements."""
    dtype: str
    width: int
    isa: str

    _FORMAT = "{dtype}_row_copy_{width}__{isa}"


@dataclass(frozen=True)
class TapCopySpec(RowCopySpec):
    """The packers' copy of all taps of a filter row from one read of each input row
    (``microkernels.row_copy.define_tap_copy``), for rows of ``width`` elements."""
    _FORMAT = "{dtype}_tap_copy_{width}__{isa}"


@dataclass(frozen=True)
class ActivationSpec(_Spec):
    """The elementwise activation kernel (``microkernels.activation.define_activation``) of
    ``kind``, one of ``ACTIVATIONS``."""
    dtype: str
    kind: str
    isa: str

    _FORMAT = "{dtype}_activation_{kind}__{isa}"

    def __post_init__(self):
        super().__post_init__()
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"ActivationSpec kind must be one of {sorted(ACTIVATIONS)}, got "
                             f"{self.kind!r}")


FAMILIES = (KernelSpec, DepthwiseSpec, BlockedDepthwiseSpec, TransposeSpec, RowCopySpec,
            TapCopySpec, ActivationSpec)


def parse_name(name):
    """The spec of any family named ``name`` (the family by the words after the dtype);
    ValueError for other names."""
    for family in FAMILIES:
        if family._FORMAT.split("}", 1)[1].split("{", 1)[0] in name:
            return family.parse(name)
    raise ValueError(f"not a kernel name: {name!r} (expected one of "
                     f"{', '.join(f._FORMAT for f in FAMILIES)})")
