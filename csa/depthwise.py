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
from .layout import (LAYOUTS, SlabGeometry, balanced_row_windows, blocked_band_rows,
                     blocked_fits, blocked_slab_shape, reads_in_place, slab_shape)
from .overrides import DEPTHWISE_OVERRIDES, forced_note
from .thread_split import PARTS_PER_THREAD

SLAB_FILL = 0.5       # share of L1 the slabs of one fill may take (the rest: output lines,
                      # the input streaming in)
BLOCKED_SLAB_FILL = 0.125   # share of L2 a blocked band's slab may take (a block's rows are
                            # lanes times wider: L1 would hold two or three of them)
MAX_FILL_CHANNELS = 64
# On channels last a band's blocks take their turns at its pixels (``cso.depthwise``): where an
# image's input (all channels) is more than ``tuning.pixel_band_image`` times L2, a band's input
# rows stay within PIXEL_BAND_FILL of L2, but a band has at least PIXEL_BAND_ROWS output rows
# (fewer cost more in halo rows and calls than the lines they keep: csa/TUNING.md)
PIXEL_BAND_FILL = 1.0
PIXEL_BAND_ROWS = 4


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
    layout: str = "nchw"   # "blocked": a block of lanes channels a unit, windows of a row a
                           # kernel call (``block_vectors`` of them), see ``csa.layout``

    nf = 1               # filters per packed tile: each output channel's R*S weights in a row

    @property
    def threads(self):
        return self.split[0]

    @property
    def parts(self):
        """Runs of units, each thread's own first (``cso.pool``)."""
        return self.split[0] * self.parts_per_thread

    @property
    def blocked(self):
        return self.layout == "blocked"

    @property
    def bands(self):
        return ceil(self.spec.p / self.band)

    @property
    def channel_units(self):
        """Channels (blocks of lanes channels, when blocked) a unit of work holds one of."""
        return -(-self.spec.c // self.lanes) if self.blocked else self.spec.c

    @property
    def units(self):
        """What a thread split hands out: (image, channel or block, band) triples."""
        return self.spec.n * self.channel_units * self.bands

    @property
    def slab_shape(self):
        """(Hs, Ws) of the phase planes, or of a blocked plan's zero-padded input, all of a
        strided 1x1's pixels too: the kernel steps the stride along its rows."""
        return (blocked_slab_shape(self.spec, subsample=False) if self.blocked
                else slab_shape(self.spec))

    @property
    def reads_input_unpacked(self):
        """A blocked plan's windows read from the input's blocks (no padding) or a slab."""
        return self.blocked and reads_in_place(self.spec)

    @property
    def band_rows(self):
        """Rows of each phase plane one band's slab holds (a blocked slab's rows)."""
        spec = self.spec
        if self.blocked:
            return blocked_band_rows(spec, self.band, 1, subsample=False)
        halo = (spec.r - 1) * spec.dilation[0] // spec.stride[0]
        return min(slab_shape(spec)[0], self.band + halo)

    @property
    def row_tiles(self):
        """A blocked plan's kernel calls per output row (of block_vectors windows or one
        fewer), else 0."""
        return ceil(self.spec.q / self.block_vectors) if self.blocked else 0

    @property
    def channel_elements(self):
        """Elements of one channel's slab: its stride phase planes of band_rows x Ws; a
        blocked band's block of rows (none read in place)."""
        (sh, sw), ws = self.spec.stride, self.slab_shape[1]
        if self.blocked:
            return 0 if self.reads_input_unpacked else self.band_rows * ws * self.lanes
        return sh * sw * self.band_rows * ws

    def explain(self):
        s, m = self.spec, self.machine
        hs, ws = self.slab_shape
        ds = s.itemsize
        fill = self.nc * self.channel_elements * ds
        if self.blocked:
            return self._explain_blocked()
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
            f"{self.parts} part(s), each thread's own first{forced_note(self, 'split')}",
            f"  plan: {self.origin or 'from the model'}",
        ]
        return "\n".join(lines)

    def _explain_blocked(self):
        s, m = self.spec, self.machine
        ws = self.slab_shape[1]
        source = ("read in place from the input's blocks (no padding)" if self.reads_input_unpacked
                  else f"a zero-padded slab per band: {self.band_rows} rows of {ws} blocks "
                       f"({self.channel_elements * s.itemsize} B vs {BLOCKED_SLAB_FILL}*L2 = "
                       f"{int(BLOCKED_SLAB_FILL * m.l2)})")
        return "\n".join([
            f"DepthwisePlan for {s} ({s.flops / 1e9:.4f} GFLOP), channel-blocked",
            f"  machine: {m}",
            f"  kernel: {self.block_vectors} windows of a row a call (or one fewer: "
            f"{self.row_tiles} calls per row of {s.q}), a vector of {self.lanes} channels "
            f"each{forced_note(self, 'block_vectors')}",
            f"  input: {source}; bands of {self.band} output rows of {s.p}"
            f"{forced_note(self, 'band')}",
            f"  threads: {self.threads}, the {self.units} (image, block, band) units in "
            f"{self.parts} part(s), each thread's own first{forced_note(self, 'split')}",
            f"  plan: {self.origin or 'from the model'}"])

    def compute_bound(self, peak_gflops):
        """None: a depthwise plan is bound by memory, not by its kernel's speed."""
        return None


def moved_bytes(spec):
    """Bytes a depthwise convolution must move: its input, output and weights, once."""
    n, c, k = spec.n, spec.c, spec.k
    return spec.itemsize * (n * c * spec.h * spec.w + n * k * spec.p * spec.q + k * spec.r * spec.s)


def analyze_depthwise(spec, machine, threads, overrides, layout="nchw"):
    """The DepthwisePlan of ``spec`` (C/groups = 1) for ``machine`` and up to ``threads``
    threads on activations of ``layout``; ``overrides`` (as ``check_overrides`` returns them)
    force a value."""
    block_vectors, nc, band, split = (overrides.get(name) for name in DEPTHWISE_OVERRIDES)
    lanes = machine.vector_bytes // spec.itemsize
    block_vectors = block_vectors or default_block_vectors(machine.vector_registers)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "nchw":
        return _analyze_blocked(spec, machine, threads, overrides, block_vectors, band, split,
                                channels_last=layout == "nhwc")
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
    parts, per_thread = _depthwise_parts(spec, machine, threads, units, split)
    return DepthwisePlan(spec, machine, block_vectors, lanes, nc, band, (parts, 1),
                         tuple(sorted(overrides)), per_thread)



def _analyze_blocked(spec, machine, threads, overrides, windows, band, split,
                     channels_last=False):
    """The blocked DepthwisePlan: each unit one block of channels over a band of output rows,
    its rows' windows in calls of ``windows`` (evened out along the row), the bands as many
    as keep each slab within BLOCKED_SLAB_FILL of L2; on ``channels_last`` activations, whose
    blocks take their turns at each band's pixels, where an image's input is over
    ``tuning.pixel_band_image`` times L2, also as many as keep the band's input pixels (all
    channels) within PIXEL_BAND_FILL of L2, but bands of at least PIXEL_BAND_ROWS output
    rows; then as many bands, evened out."""
    lanes = machine.vector_bytes // spec.itemsize
    if not blocked_fits(spec, lanes):
        raise ValueError(f"{spec}: a blocked depthwise plan takes one filter per channel, got "
                         f"{spec.k_per_group}")
    windows = balanced_row_windows(spec.q, windows)
    if band is None:
        row = blocked_slab_shape(spec, subsample=False)[1] * lanes * spec.itemsize
        band = _band_of(spec, BLOCKED_SLAB_FILL * machine.l2 // row)
        pixels = spec.w * -(-spec.c // lanes) * lanes * spec.itemsize   # an input row's
        image = machine.tuning.pixel_band_image * machine.l2
        if channels_last and 0 < image < spec.h * pixels:
            band = min(band, max(PIXEL_BAND_ROWS,
                                 _band_of(spec, PIXEL_BAND_FILL * machine.l2 // pixels)))
        # as many bands, evened out (75 rows: 38 + 37, not 51 + 24): units of a size, which
        # threads share evenly where the blocks are few
        band = ceil(spec.p / ceil(spec.p / band))
    band = min(band, spec.p)
    units = spec.n * -(-spec.c // lanes) * ceil(spec.p / band)
    parts, per_thread = _depthwise_parts(spec, machine, threads, units, split)
    return DepthwisePlan(spec, machine, windows, lanes, 1, band, (parts, 1),
                         tuple(sorted(overrides)), per_thread, layout="blocked")


def _band_of(spec, rows):
    """Output rows (at least one) whose taps lie within ``rows`` input rows."""
    return max(1, (int(rows) - spec.dilation[0] * (spec.r - 1) - 1) // spec.stride[0] + 1)


def _depthwise_parts(spec, machine, threads, units, split):
    """(parts, parts per thread) of ``units``: as many threads as get
    ``tuning.depthwise_thread_min_flops`` each, unless ``split`` says, each thread's work in
    parts of at least ``tuning.depthwise_part_min_flops``."""
    least = machine.tuning.depthwise_thread_min_flops   # a thread's work
    if split:
        return min(split[0], units), 1
    parts = max(1, min(threads, int(spec.flops // least), units))
    part = max(least, machine.tuning.depthwise_part_min_flops)
    per_thread = 1 if parts == 1 else max(1, min(
        PARTS_PER_THREAD, units // parts, int(spec.flops // (parts * part))))
    return parts, per_thread
