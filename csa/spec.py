"""ConvSpec: one convolution problem, hashable, with one canonical string (benchdnn style)."""
import re
from dataclasses import dataclass

from microkernels.dtypes import DTYPES as KERNEL_DTYPES

_ITEMSIZE = {d.name: d.itemsize for d in KERNEL_DTYPES.values()}
DTYPES = tuple(_ITEMSIZE)   # NumPy names: ConvSpec.dtype is user facing


@dataclass(frozen=True)
class ConvSpec:
    """Shapes follow PyTorch: input N x C x H x W, weight K x C/groups x R x S, output N x K x P x Q.
    Padding is explicit per side (top, bottom, left, right)."""
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)   # top, bottom, left, right
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype: str = "float32"

    def __post_init__(self) -> None:
        ints = (self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.groups)
        if min(ints) < 1 or min(self.stride + self.dilation) < 1 or min(self.padding) < 0:
            raise ValueError(f"invalid ConvSpec {self!r}: sizes, stride, dilation and groups must be "
                             "positive, padding non-negative")
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"groups={self.groups} must divide channels c={self.c} and filters k={self.k}")
        if self.dtype not in DTYPES:
            raise ValueError(f"ConvSpec dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.p < 1 or self.q < 1:
            raise ValueError(f"kernel {self.r}x{self.s} (dilation {self.dilation}) is larger than the "
                             f"padded input {self.h + self.padding[0] + self.padding[1]}x"
                             f"{self.w + self.padding[2] + self.padding[3]}")

    @property
    def p(self) -> int:
        pad = self.padding[0] + self.padding[1]
        return (self.h + pad - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        pad = self.padding[2] + self.padding[3]
        return (self.w + pad - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @property
    def k_per_group(self) -> int:
        return self.k // self.groups

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def flops(self) -> int:
        return 2 * self.n * self.k * self.p * self.q * self.c_per_group * self.r * self.s

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.c_per_group, self.r, self.s)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.k, self.p, self.q)

    def __str__(self) -> str:
        """Canonical string, e.g. ``n1c64h56w56k64r3s3p1u1``; stride u, padding p (one number when
        all four sides agree, else top_bottom_left_right), dilation d, groups g, dtype last."""
        text = f"n{self.n}c{self.c}h{self.h}w{self.w}k{self.k}r{self.r}s{self.s}"
        pads = self.padding
        text += f"p{pads[0]}" if len(set(pads)) == 1 else "p" + "_".join(map(str, pads))
        text += "u" + _pair(self.stride)
        if self.dilation != (1, 1):
            text += "d" + _pair(self.dilation)
        if self.groups != 1:
            text += f"g{self.groups}"
        if self.dtype != "float32":
            text += "_f64"
        return text

    @classmethod
    def parse(cls, text: str) -> "ConvSpec":
        m = _CANONICAL.match(text)
        if not m:
            raise ValueError(f"not a canonical conv string: {text!r} (e.g. 'n1c64h56w56k64r3s3p1u1')")
        g = m.groupdict()
        n, c, h, w, k, r, s = (int(g[x]) for x in "nchwkrs")
        pads = tuple(int(v) for v in g["p"].split("_"))
        top, bottom, left, right = pads * 4 if len(pads) == 1 else pads
        return cls(n, c, h, w, k, r, s,
                   stride=_unpair(g["u"]), padding=(top, bottom, left, right),
                   dilation=_unpair(g["d"]) if g["d"] else (1, 1),
                   groups=int(g["g"] or 1), dtype="float64" if g["f64"] else "float32")


def _pair(v: tuple[int, int]) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"


def _unpair(text: str) -> tuple[int, int]:
    a, _, b = text.partition("x")
    return (int(a), int(b or a))


_CANONICAL = re.compile(r"^n(?P<n>\d+)c(?P<c>\d+)h(?P<h>\d+)w(?P<w>\d+)k(?P<k>\d+)r(?P<r>\d+)s(?P<s>\d+)"
                        r"p(?P<p>\d+(?:_\d+_\d+_\d+)?)u(?P<u>\d+(?:x\d+)?)(?:d(?P<d>\d+(?:x\d+)?))?"
                        r"(?:g(?P<g>\d+))?(?P<f64>_f64)?$")
