"""Depthwise analysis: the plan of a convolution with one input channel per group.

A depthwise convolution (C/groups = 1, K/groups = M filters per channel, the channel
multiplier) has nothing for an outer-product tile to reuse: each output value takes R*S
multiply-adds from one channel, so it is bound by moving data, not by arithmetic. The plan
pads each channel into a slab (zero-padded, split into stride phases, see
``csa.layout.slab_shape``) that stays in L1 while the depthwise micro-kernel reads it R*S times
along its virtual rows, once per filter of the channel: whole planes for several channels at
once when they fit, else bands of output rows of one channel.
"""
from dataclasses import dataclass, field
from math import ceil

from .machine import Machine
from .layout import SlabGeometry, slab_shape
from .overrides import DEPTHWISE_OVERRIDES, forced_note
from .thread_split import PARTS_PER_THREAD

SLAB_FILL = 0.5       # share of L1 the slabs of one fill may take (the rest: output lines,
                      # the input streaming in)
MAX_FILL_CHANNELS = 64


def is_depthwise(spec):
    return spec.c_per_group == 1


def default_block_vectors(vector_registers):
    """Accumulators of the depthwise kernel: a block of that many vectors per tap, each an FMA
    whose load the next taps do not wait for. Half the registers, at most 8: the kernel is
    bound by its loads, and larger blocks are no faster (csa/TUNING.md)."""
    return max(1, min(8, vector_registers // 2))


@dataclass(frozen=True)
class DepthwisePlan(SlabGeometry):
    spec: object
    machine: Machine
    block_vectors: int   # vectors (accumulators) per kernel block
    lanes: int
    nc: int              # channels one slab fill holds (whole planes), else 1
    band: int            # output rows per band (P: whole planes)
    split: tuple = (1, 1)   # the (image, channel, band) units split over threads
    forced: tuple = ()
    parts_per_thread: int = 1   # parts each thread's share is cut into (see analyze_depthwise)
    origin: str = field(default="", compare=False)   # where it came from when not the model

    nf = 1               # filters per packed tile: each output channel's R*S weights in a row

    @property
    def threads(self):
        return self.split[0]

    @property
    def parts(self):
        """Runs of units, claimed as threads come free."""
        return self.split[0] * self.parts_per_thread

    @property
    def bands(self):
        return ceil(self.spec.p / self.band)

    @property
    def units(self):
        """What a thread split hands out: (image, channel, band) triples."""
        return self.spec.n * self.spec.c * self.bands

    @property
    def band_rows(self):
        """Rows of each phase plane one band's slab holds."""
        spec = self.spec
        halo = (spec.r - 1) * spec.dilation[0] // spec.stride[0]
        return min(slab_shape(spec)[0], self.band + halo)

    @property
    def channel_elements(self):
        """Elements of one channel's slab: its stride phase planes of band_rows x Ws."""
        (sh, sw), ws = self.spec.stride, self.slab_shape[1]
        return sh * sw * self.band_rows * ws

    def explain(self):
        s, m = self.spec, self.machine
        hs, ws = self.slab_shape
        ds = s.itemsize
        fill = self.nc * self.channel_elements * ds
        lines = [
            f"DepthwisePlan for {s} ({s.flops / 1e9:.4f} GFLOP, {s.k_per_group} filter(s) per "
            f"channel)",
            f"  machine: {m}",
            f"  kernel: blocks of {self.block_vectors} vectors of {self.lanes} lanes along the virtual "
            f"rows of a slab ({s.stride[0] * s.stride[1]} phase plane(s) of {hs} x {ws} per "
            f"channel){forced_note(self, 'block_vectors')}",
            f"  fill: {self.nc} channel(s) x {self.band_rows} slab rows ({self.band} output rows "
            f"of {s.p}, {self.bands} band(s)) = {fill} B vs {SLAB_FILL}*L1 = "
            f"{int(SLAB_FILL * m.l1d)}{forced_note(self, 'nc', 'band')}",
            f"  threads: {self.threads}, the {self.units} (image, channel, band) units in "
            f"{self.parts} part(s), claimed as threads come free{forced_note(self, 'split')}",
            f"  plan: {self.origin or 'from the model'}",
        ]
        return "\n".join(lines)

    def compute_bound(self, peak_gflops):
        """None: a depthwise plan is bound by memory, not by its kernel's speed."""
        return None


def moved_bytes(spec):
    """Bytes a depthwise convolution must move: its input, output and weights, once."""
    n, c, k = spec.n, spec.c, spec.k
    return spec.itemsize * (n * c * spec.h * spec.w + n * k * spec.p * spec.q + k * spec.r * spec.s)


def analyze_depthwise(spec, machine, threads, overrides):
    """The DepthwisePlan of ``spec`` (C/groups = 1) for ``machine`` and up to ``threads``
    threads; ``overrides`` (as ``check_overrides`` returns them) force a value."""
    block_vectors, nc, band, split = (overrides.get(name) for name in DEPTHWISE_OVERRIDES)
    lanes = machine.vector_bytes // spec.itemsize
    block_vectors = block_vectors or default_block_vectors(machine.vector_registers)
    (sh, sw), ws = spec.stride, slab_shape(spec)[1]
    budget = SLAB_FILL * machine.l1d // spec.itemsize
    whole = sh * sw * slab_shape(spec)[0] * ws            # one channel's whole slab
    halo = (spec.r - 1) * spec.dilation[0] // sh
    if band is None:
        band = spec.p if whole <= budget else int(max(1, budget // (sh * sw * ws) - halo))
    band = min(band, spec.p)
    if nc is None:
        nc = int(max(1, min(MAX_FILL_CHANNELS, budget // whole))) if band == spec.p else 1
    nc = min(nc, spec.c) if band == spec.p else 1
    units = spec.n * spec.c * ceil(spec.p / band)    # see DepthwisePlan.units
    least = machine.tuning.depthwise_thread_min_flops   # a thread's work, and a part's
    if split:
        parts, per_thread = min(split[0], units), 1
    else:
        parts = max(1, min(threads, int(spec.flops // least), units))
        per_thread = 1 if parts == 1 else max(1, min(
            PARTS_PER_THREAD, units // parts, int(spec.flops // (parts * least))))
    return DepthwisePlan(spec, machine, block_vectors, lanes, nc, band, (parts, 1),
                         tuple(sorted(overrides)), per_thread)

