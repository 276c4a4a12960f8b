"""Convolution Slicing Analysis: micro-tile, channel tile, cache blocking and schedule.

Symbols (after SConv, Ferrari et al., ACM TACO 2023): C_g = channels per group, K_g = filters per group, R x S filter, P x Q output,
ds bytes per element, micro-tile Nwin windows x Nf filters. Footprints of packed tiles:
|IN| = Nwin*R*S*Nc*ds, |W| = Nf*R*S*Nc*ds, |OUT| = Nwin*Nf*ds.
"""
import numbers
from dataclasses import dataclass, field
from math import ceil, gcd

from .machine import Machine
from .spec import ConvSpec

SCHEDULES = ("IS", "WS")
VECTORS = ("windows", "filters")  # the dimension the micro-kernel's vectors run along
CACHE_FILL = 0.9  # fraction of each cache level a tile set may occupy


TILE_VECTORS = 2   # vector rows of a tile: two (little lane waste on small planes; a third
                   # adds no speed where two reach the peak)
# the kernel variants (KernelSpec slab modes) each orientation runs: windows in vectors packed
# or from a slab, filters in vectors packed, direct (windows broadcast from a slab)
WINDOW_SLABS, FILTER_SLABS, DIRECT_SLABS = ("", "vector"), ("",), ("broadcast",)


def microtile(machine, itemsize):
    """(Nwin, Nf) with windows in vectors: TILE_VECTORS vectors of windows by Nf filters, Nf
    among the counts the register-blocking model (``csa.tuning``) finds fastest for the
    machine's core: the largest multiple of 8 among them when there is one (filter counts in
    real networks are multiples of 8: no padded rows), else the largest (fewest loads per FMA).
    AVX-512: 8 x 32 floats; AVX2: 6 x 16."""
    counts = machine.tuning.broadcast_counts(machine.vector_registers, TILE_VECTORS,
                                             WINDOW_SLABS)
    nf = max((b for b in counts if b % 8 == 0), default=max(counts))
    return TILE_VECTORS * machine.vector_bytes // itemsize, nf


def filter_vector_tile(machine, itemsize, positions=49):
    """(windows, filters) when filters are the vector dimension: TILE_VECTORS filter vectors
    by a window count among those the model finds fastest: 7 when it is among them (planes of
    real networks are multiples of 7: 7x7, 14x14, 28x28, 56x56), else the one that covers the
    output plane's ``positions`` fastest (``fastest_windows``, the record's ``filter_windows``).
    AVX-512: 7 x 32 floats; AVX2: 5 x 16 on a 7x7 plane, 6 x 16 on 14x14 and larger. A
    single-pixel plane is a matrix-vector product whose weights stream through once: 1 window
    by up to four vectors (AVX-512: 1 x 64)."""
    lanes, registers = machine.vector_bytes // itemsize, machine.vector_registers
    if positions == 1:
        return 1, max(1, min(4, (registers - 1) // 2)) * lanes
    tuning = machine.tuning
    counts = tuning.broadcast_counts(registers, TILE_VECTORS, FILTER_SLABS)
    windows = 7 if 7 in counts else fastest_windows(positions, counts, tuning.filter_windows)
    return windows, TILE_VECTORS * lanes


def fastest_windows(positions, counts, measured):
    """Of the window counts ``counts`` (the model's or calibration's fastest), the one whose
    tiles cover ``positions`` windows fastest: padded positions over the relative speed the
    record ``measured`` in loop nests ((windows, speed), ...; of the counts it lists, when it
    lists any), ties to the larger count. The model finds a tile of 8 accumulators (AVX2's
    4 x 16) as fast as one of 12; in a loop nest it is not (csa/TUNING.md)."""
    speeds = {w: speed for w, speed in measured if w in counts} or counts
    return min(speeds, key=lambda w: (ceil(positions / w) * w / speeds[w], -w))


DIRECT_WASTE = 0.1   # padded work a direct plan may add (row-aligned tiles, filter tiles)


def direct_windows(spec, machine):
    """Windows per direct tile: of the window counts the model (or calibration) finds fastest,
    the one whose row-aligned tiles (a tile never spans two output rows) cover Q fastest
    (``fastest_windows``, the record's ``direct_windows``). AVX-512: 56, 28, 112, 14 and 104
    wide planes take 14, 7, 21 and 35 wide ones 7; AVX2: 14 wide planes 5, 7 wide 4, the
    others 6. A row's short last tile runs a kernel of its own (``cso.lowering.tail_kernel``);
    the choice still counts it padded to a whole tile, as the records' speeds were measured
    (counted at its own kernel's speed, 56 of timm's convolutions would change plans on
    AVX-512, 8x8 to 35x35 planes, unmeasured there)."""
    tuning = machine.tuning
    counts = tuning.broadcast_counts(machine.vector_registers, TILE_VECTORS, DIRECT_SLABS)
    return fastest_windows(spec.q, counts, tuning.direct_windows)


CALIBRATION_PLANES = (7, 14, 28, 56, 112)   # output widths (square planes) of real networks


def calibration_candidates(machine):
    """{slab variant: broadcast counts} a host calibration measures (float32, TILE_VECTORS
    rows): the counts the rules pick from the model for the usual planes, and their
    neighbours that fit the registers, so that a calibration can confirm or overturn them."""
    planes = [ConvSpec.parse(f"n1c64h{q}w{q}k64r3s3p1u1") for q in CALIBRATION_PLANES]
    picks = {"": {filter_vector_tile(machine, 4, s.p * s.q)[0] for s in planes},
             "vector": {microtile(machine, 4)[1]},
             "broadcast": {direct_windows(s, machine) for s in planes}}
    picks[""] |= picks["vector"]   # windows in vectors runs packed tiles too
    fits = machine.tuning.kernel_efficiency
    return {slab: sorted({b for p in chosen for b in (p - 1, p, p + 1)
                          if b > 0 and fits(machine.vector_registers, b, TILE_VECTORS) > 0})
            for slab, chosen in picks.items()}


def use_direct(spec, nwin, nf, tuning):
    """Filters in vectors and the input windows broadcast in place from a padded slab (the
    direct convolution MLAS runs on NCHWc): no window tile is packed. For stride-1
    convolutions a slab applies to (not unpadded 1x1s) with at least
    ``tuning.direct_min_depth`` rows per kernel call (shallower calls spend too much on C's
    tile), whose row-aligned window tiles and filter tiles waste at most DIRECT_WASTE of the
    work. Stride 2 is left to the packed plans: its taps read R*S runs per channel from four
    phase planes and overflow L1 (csa/TUNING.md has the measurements)."""
    padded = window_tiles(spec, nwin, True, "filters") * nwin * ceil(spec.k_per_group / nf) * nf
    return (spec.stride == (1, 1) and slab_fits(spec, nwin, "filters")
            and spec.c_per_group * spec.r * spec.s >= tuning.direct_min_depth
            and padded <= (1 + DIRECT_WASTE) * spec.p * spec.q * spec.k_per_group)


def padded_work(spec, nwin, nf):
    """Output elements the tiles compute, edge padding included (per image and group)."""
    return ceil(spec.p * spec.q / nwin) * nwin * ceil(spec.k_per_group / nf) * nf


def choose_vector(spec, window_tile, filter_tile, tuning):
    """Vectors along the windows unless tiles along the filters waste fewer lanes (small output
    planes: 7x7, 14x14, 1x1) by more than their transposing pass costs: the pass over each
    output costs as much as ``tuning.transpose_depth`` more rows of kernel depth, little
    beside hundreds of channels, much beside a few dozen (0: lanes waste alone, with a 5%
    margin)."""
    windows, filters = padded_work(spec, *window_tile), padded_work(spec, *filter_tile)
    depth = spec.c_per_group * spec.r * spec.s
    if tuning.transpose_depth:
        return "filters" if filters * (1 + tuning.transpose_depth / depth) < windows else "windows"
    return "filters" if filters < 0.95 * windows else "windows"


@dataclass(frozen=True)
class SlicingPlan:
    spec: object
    machine: Machine
    nwin: int
    nf: int
    nc: int
    k2: int
    k3: int
    schedule: str
    vector: str                             # "windows" or "filters" (see choose_vector)
    slab: bool                              # input read in place from a padded slab (see use_slab)
    band: int                               # window tiles per output band (see output_band)
    costs: dict = field(compare=False)      # schedule -> {term: cycles}
    forced: tuple = ()                      # names of the values set by an override
    split: tuple = (1, 1)                   # output parts run in parallel: (windows, filters)
    origin: str = field(default="", compare=False)   # where it came from when not the model

    @property
    def threads(self):
        """Threads the plan runs on: one per output part (see thread_split)."""
        return self.split[0] * self.split[1]

    @property
    def direct(self):
        """Filters in vectors, windows broadcast in place from a slab (see use_direct)."""
        return self.slab and self.vector == "filters"

    @property
    def row_tiles(self):
        return row_tiles(self.spec, self.nwin, self.slab, self.vector)

    @property
    def window_tiles(self):
        return window_tiles(self.spec, self.nwin, self.slab, self.vector)

    @property
    def filter_tiles(self):
        return ceil(self.spec.k_per_group / self.nf)

    @property
    def channel_tiles(self):
        return ceil(self.spec.c_per_group / self.nc)

    def footprints(self):
        return tile_footprints(self.spec, self.nwin, self.nf, self.nc)

    def explain(self):
        s, m = self.spec, self.machine
        fin, fw, fout = self.footprints()
        ds, rs = s.itemsize, s.r * s.s
        nc_rule = ("all C/groups channels fit:" if self.nc == s.c_per_group else
                   f"C/groups split evenly into the fewest tiles ({self.channel_tiles}) with"
                   if "nc" not in self.forced else "forced; the rule is")
        lines = [
            f"SlicingPlan for {s} ({s.flops / 1e9:.3f} GFLOP)",
            f"  machine: {m}",
            f"  micro-tile: {self.nwin} windows x {self.nf} filters, vectors along the {self.vector} "
            f"(from {m.vector_registers} registers of {m.vector_bytes // ds} lanes; computes "
            f"{self.window_tiles * self.nwin * self.filter_tiles * self.nf} outputs for "
            f"{s.p * s.q * s.k_per_group}){_forced(self, 'microtile_shape', 'vector')}",
            (f"  Nc = {self.nc}: {nc_rule} Nf*R*S*Nc*ds <= {DIRECT_FILTER_FILL}*L2: "
             f"{fw} vs {int(DIRECT_FILTER_FILL * m.l2)}" if self.direct else
             f"  Nc = {self.nc}: {nc_rule} Nc*(Nwin+Nf)*R*S*ds + Nwin*Nf*ds <= {CACHE_FILL}*L1: "
             f"{self.nc}*{self.nwin + self.nf}*{rs}*{ds} + {fout} = "
             f"{self.nc * (self.nwin + self.nf) * rs * ds + fout} vs {int(CACHE_FILL * m.l1d)}")
            + _forced(self, 'nc'),
            f"  tiles: {self.window_tiles} window x {self.filter_tiles} filter x "
            f"{self.channel_tiles} channel (per image and group); |IN|={fin} B |W|={fw} B |OUT|={fout} B",
        ]
        if self.schedule == "IS":
            lines.append(f"  IS: K2 = {self.k2} filter tiles in L2 (|IN| + K2*(|W|+|OUT|) <= "
                         f"{CACHE_FILL}*L2), K3 = {self.k3} window tiles in L3 (K3*|IN| + K2*|W| + "
                         f"K2*K3*|OUT| <= {CACHE_FILL}*L3){_forced(self, 'k2', 'k3')}")
        else:
            lines.append(f"  WS: K2 = {self.k2} window tiles in L2 (|W| + K2*(|IN|+|OUT|) <= "
                         f"{CACHE_FILL}*L2), K3 = {self.k3} filter tiles in L3 (K3*|W| + K2*|IN| + "
                         f"K2*K3*|OUT| <= {CACHE_FILL}*L3){_forced(self, 'k2', 'k3')}")
        bands = ceil(self.window_tiles / self.band)
        block = self.band * self.nwin * s.k_per_group * ds
        where = "fit" if _band_fits_l2(s, self.nwin, self.band, m) else "overflow"
        lines.append(f"  output bands: {bands} of {self.band} window tiles" + (
            f", whose partial outputs ({self.band}*{self.nwin}*{s.k_per_group}*{ds} = {block} B) "
            f"{where} {OUTPUT_BAND_FILL}*{CACHE_FILL}*L2 between the {self.channel_tiles} channel "
            f"tiles" if self.channel_tiles > 1 else " (one channel tile: no partial outputs)")
            + _forced(self, "band"))
        if self.slab:
            tail = s.q % self.nwin
            why = (f"direct: windows broadcast from it, {self.row_tiles} tiles per output row"
                   + (f", the last of {tail} windows by a {tail}-window kernel" if tail else "")
                   if self.direct else f"{self.filter_tiles} <= "
                   f"{self.machine.tuning.slab_max_filter_tiles} filter tiles per packed tile")
            lines.append(f"  input: a padded slab of {s.stride[0] * s.stride[1]} phase plane(s) per "
                         f"channel ({slab_band_rows(s, self.nwin, self.band, self.row_tiles)} rows "
                         f"of each per band), read in place ({why}){_forced(self, 'slab')}")
        else:
            lines.append(f"  input: packed tiles (R*S shifted copies per channel){_forced(self, 'slab')}")
        lines.append("  cost model (cache-line loads x latency, streamed L2 x bandwidth, cycles):")
        for name in SCHEDULES:
            terms = self.costs[name]
            detail = ", ".join(f"{k} {v:.3g}" for k, v in terms.items() if k != "total")
            lines.append(f"    {name}: total {terms['total']:.4g}  ({detail})")
        why = "forced by override" if "schedule" in self.forced else "cheaper"
        lines.append(f"  schedule: {self.schedule} ({why})")
        units = window_units(s, self.nwin, self.slab, self.vector)
        lines.append(f"  threads: {self.threads}, the output split into {self.split[0]} part(s) of "
                     f"the {units} {'output rows' if self.direct else 'window tiles'} (all images) "
                     f"x {self.split[1]} of the {self.filter_tiles} filter tiles; L3 counted as "
                     f"{m.per_thread(self.threads).l3 // 1024} KiB per thread"
                     + _forced(self, "split"))
        lines.append(f"  plan: {self.origin or 'from the model'}")
        return "\n".join(lines)

    def compute_bound(self, peak_gflops):
        """Seconds the plan's tiles (edge padding included) take at its micro-kernel's
        calibrated (else modelled) fraction of a ``peak_gflops`` core, on each of its threads:
        the model's prediction, which leaves memory out."""
        s, m = self.spec, self.machine
        lanes = m.vector_bytes // s.itemsize
        broadcasts, vectors = ((self.nwin, self.nf // lanes) if self.vector == "filters"
                               else (self.nf, self.nwin // lanes))
        variant = ("broadcast" if self.direct else "vector" if self.slab else "",)
        speed = (m.tuning.measured_speeds(vectors, variant).get(broadcasts)
                 or m.tuning.kernel_efficiency(m.vector_registers, broadcasts, vectors))
        flops = (2 * s.n * s.groups * self.window_tiles * self.nwin * self.filter_tiles * self.nf
                 * s.c_per_group * s.r * s.s)
        return flops / (max(speed, 0.05) * peak_gflops * 1e9 * self.threads)


def _forced(plan, *names):
    hit = [n for n in names if n in plan.forced]
    return f" [forced: {', '.join(hit)}]" if hit else ""


def tile_footprints(spec, nwin, nf, nc):
    ds, rs = spec.itemsize, spec.r * spec.s
    return nwin * rs * nc * ds, nf * rs * nc * ds, nwin * nf * ds


def channel_tile(spec, nwin, nf, l1d):
    """Nc: the fewest channel tiles with Nc*(Nwin+Nf)*R*S*ds + Nwin*Nf*ds <= 0.9*L1 (at least 1
    channel each), split evenly: a short last tile would cost a whole pass over the partial
    outputs for a few channels (32 channels as 30 + 2 measured 2% slower than 16 + 16)."""
    ds, rs = spec.itemsize, spec.r * spec.s
    room = CACHE_FILL * l1d - nwin * nf * ds
    return _even_channel_tile(spec, room // ((nwin + nf) * rs * ds))


def _even_channel_tile(spec, largest):
    """The channels of the fewest tiles of at most ``largest`` (at least 1), split evenly."""
    largest = int(min(spec.c_per_group, max(1, largest)))
    return ceil(spec.c_per_group / ceil(spec.c_per_group / largest))


DIRECT_FILTER_FILL = 0.25   # share of L2 a direct plan's filter tile may take


def direct_channel_tile(spec, nf, l2):
    """Nc of a direct plan: its filter tile streams from L2 (the windows' slab rows, a few
    hundred bytes per channel, sit in L1), so the fewest channel tiles with
    Nf*R*S*Nc*ds <= DIRECT_FILTER_FILL*L2, split evenly. Measured on 3x3 256->256 at 56x56 and
    512->512 at 28x28: Nc from 64 to 256 within 2%; fewer channel tiles read the partial
    outputs less often."""
    filter_row = nf * spec.r * spec.s * spec.itemsize   # one channel's share of the tile
    return _even_channel_tile(spec, DIRECT_FILTER_FILL * l2 // filter_row)


def blocking(stationary, streamed, out, streamed_tiles, resident_tiles, machine):
    """K2 streamed tiles kept in L2 beside one stationary tile, K3 stationary tiles kept in L3
    beside them: the largest values satisfying (for IS; WS swaps inputs and filters)
        |IN| + K2*(|W| + |OUT|) <= 0.9*L2,   K3*|IN| + K2*|W| + K2*K3*|OUT| <= 0.9*L3,
    solved directly rather than by halving, and clamped to [1, tiles]."""
    k2 = (CACHE_FILL * machine.l2 - stationary) // (streamed + out)
    k2 = int(min(streamed_tiles, max(1, k2)))
    k3 = (CACHE_FILL * machine.l3 - k2 * streamed) // (stationary + k2 * out)
    k3 = int(min(resident_tiles, max(1, k3)))
    return k2, k3


def schedule_costs(spec, machine, nwin, nf, nc, k2, k3, schedule, vector="windows", band=None):
    """Cache-line loads per level, weighted by latency (streamed L2: bandwidth), for one whole
    convolution.

    Stationary tiles (inputs for IS with windows in vectors; filters for WS, and for IS with
    filters in vectors, whose innermost loop walks window tiles past the filter tile) are re-read
    from L1 by every micro-kernel call after the first of each streamed block, which brings them
    from L3. Streamed tiles are read by every call except the first of each resident block,
    which brings them from L3; the rest come from L2 when their block fits there (a streamed
    tile is read in sequence, so those reads cost bandwidth, ``stream_l2``), else from L3.
    Compulsory traffic reads the input and filters from memory once. Input packing writes
    packed tiles once per pass over the filters (IS packs once; WS re-packs once per block of K3
    filter tiles; a slab's refill of each band's halo rows is not counted). Partial outputs are
    re-read once per extra channel tile: from L2 when an output band (``band`` window tiles,
    default all) fits its share of it, else from L3 when the output fits there, else from
    memory (the blocks lie within a band, so every band reloads its stationary or streamed
    filter tiles from L3: the terms above count that).

    Output streams: a micro-kernel call writes a tile's rows of C. IS with windows in vectors
    goes down the rows of its K2 filter tiles in turn; more than OUTPUT_STREAMS rows at least a
    page apart measured up to 29% slower than WS (prefetchers and TLB), so then every output
    line written costs an L3 latency more. With filters in vectors consecutive calls write
    consecutive windows' rows of the transposed output.
    """
    line, ds, rs = machine.line, spec.itemsize, spec.r * spec.s
    images = spec.n * spec.groups
    t_in = ceil(spec.p * spec.q / nwin)
    t_w = ceil(spec.k_per_group / nf)
    t_c = ceil(spec.c_per_group / nc)
    in_lines = nwin * rs * spec.c_per_group * ds / line   # one window tile over all channel tiles
    w_lines = nf * rs * spec.c_per_group * ds / line      # one filter tile over all channel tiles
    calls = t_in * t_w
    packs = 1 if schedule == "IS" else ceil(t_w / k3)
    if schedule == "IS" and vector == "windows":
        stat, strm, t_stat, t_strm = in_lines, w_lines, t_in, t_w
        strm_block, stat_block = k2, k3
    else:
        # filter-stationary terms: IS with filters in vectors keeps the filter tile in L1 while
        # its K3 window tiles stream past (from L3 when they overflow L2). WS with windows in
        # vectors runs filter tiles innermost too (lowering), but its K2 window block is modelled
        # filter-stationary, an approximation measured to pick within 3% of the faster
        # schedule on 92 of 100 timm convolutions (python -m bench --schedules)
        stat, strm, t_stat, t_strm = w_lines, in_lines, t_w, t_in
        strm_block, stat_block = (k2, k3) if schedule == "WS" else (k3, k2)
    stat_from_l3 = t_stat * ceil(t_strm / strm_block) * stat
    strm_from_l3 = ceil(t_stat / stat_block) * t_strm * strm
    strm_in_l2 = strm_block * strm * line / t_c <= CACHE_FILL * machine.l2   # one channel tile's
    out_lines = spec.k_per_group * spec.p * spec.q * ds / line
    band = band or t_in
    out_latency = (machine.latency_l2 if _band_fits_l2(spec, nwin, band, machine) else
                   machine.latency_l3 if out_lines * line * images <= machine.l3 else
                   machine.latency_mem)
    raw_in_lines = spec.c_per_group * spec.h * spec.w * ds / line
    terms = {
        "stationary L1": (calls * stat - stat_from_l3) * machine.latency_l1,
        "stationary L3": stat_from_l3 * machine.latency_l3,
        "streamed L2": (calls * strm - strm_from_l3) * (machine.stream_l2 if strm_in_l2 else
                                                          machine.latency_l3),
        "streamed L3": strm_from_l3 * machine.latency_l3,
        "compulsory mem": (raw_in_lines + t_w * w_lines) * machine.latency_mem,
        "input packing": packs * (raw_in_lines * machine.latency_l3 + t_in * in_lines * machine.latency_l2),
        "partial outputs": (t_c - 1) * out_lines * out_latency,
        "output streams": t_c * out_lines * machine.latency_l3 * _scattered_output(
            spec, nwin, nf, k2, schedule, vector, machine),
    }
    terms = {k: v * images for k, v in terms.items()}
    terms["total"] = sum(terms.values())
    return terms


OUTPUT_STREAMS = 16  # output rows written in turn that the hardware still follows
PAGE = 4096


def _scattered_output(spec, nwin, nf, k2, schedule, vector, machine):
    """1 when the calls of a block write more than OUTPUT_STREAMS C rows a page or more apart
    (see schedule_costs), else 0."""
    if vector == "filters":
        return 0   # consecutive calls write consecutive windows' rows of the transposed output
    rows = k2 * nf if schedule == "IS" else nf
    return int(rows > OUTPUT_STREAMS and spec.p * spec.q * spec.itemsize >= PAGE)


SLICING_OVERRIDES = ("vector", "microtile_shape", "nc", "k2", "k3", "schedule", "slab", "band",
                     "split")
# every override: the slicing plan's, the depthwise plan's vectors per kernel block, and the
# choice of analysis (depthwise=False plans a one-channel-per-group convolution as grouped)
OVERRIDES = SLICING_OVERRIDES + ("vectors", "depthwise")


def check_overrides(**overrides):
    """The overrides normalised (plain ints, tuples; None = unset, dropped). Raises TypeError
    for an unknown name or a non-integer, ValueError for a bad value."""
    normal = {}
    for name, v in overrides.items():
        if name not in OVERRIDES:
            raise TypeError(f"unknown plan override {name!r}; known: {OVERRIDES}")
        if v is None:
            continue
        if name in ("slab", "depthwise"):
            if not isinstance(v, bool):
                raise TypeError(f"{name} override must be True or False, got {v!r}")
            normal[name] = v
        elif name in ("schedule", "vector"):
            choices = SCHEDULES if name == "schedule" else VECTORS
            if v not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {v!r}")
            normal[name] = v
        elif name in ("microtile_shape", "split"):
            if not isinstance(v, (tuple, list)) or len(v) != 2:
                shape = "(nwin, nf)" if name == "microtile_shape" else "(window parts, filter parts)"
                raise ValueError(f"{name} override must be {shape}, got {v!r}")
            normal[name] = tuple(_positive_int(name, x) for x in v)
        else:
            normal[name] = _positive_int(name, v)
    return normal


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} override must be an int, got {v!r}")
    if v < 1:
        raise ValueError(f"{name} override must be >= 1, got {v!r}")
    return int(v)


def slab_shape(spec):
    """(Hs, Ws) of a slab's phase planes. A slab holds each channel's zero-padded input split
    into stride_h*stride_w phase planes (plane (a, b) = padded rows a, a+sh, ..., columns b,
    b+sw, ...), so that tap (r, s) of every window is the window's own position on plane
    (r*dh % sh, s*dw % sw), shifted by (r*dh // sh, s*dw // sw): a stride-1 read for any stride.
    Its output rows are Ws wide, of which the last dw*(S-1) // sw are padding."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    return spec.p + dh * (spec.r - 1) // sh, spec.q + dw * (spec.s - 1) // sw


def slab_planes(spec):
    """Bit mask of the phase planes (bit a*sw + b for plane (a, b)) some tap reads: all of them
    for a 3x3 stride 2, only plane (0, 0) for a 1x1 stride 2, whose other planes are not filled.
    -1 (all) when there are more planes than bits (strides of 8 x 8 and more: patch embeddings)."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    if sh * sw > 62:
        return -1
    return sum({1 << (r * dh % sh * sw + s * dw % sw)
                for r in range(spec.r) for s in range(spec.s)})


def window_positions(spec, slab):
    """Window positions the tiles cover: P*Q, or on a slab's phase planes every position of
    the first P-1 virtual rows (Ws wide, padding columns included) and Q of the last."""
    if not slab:
        return spec.p * spec.q
    return (spec.p - 1) * slab_shape(spec)[1] + spec.q


def row_tiles(spec, nwin, slab, vector):
    """Window tiles per output row of a direct plan, whose tiles never span two rows (each
    broadcast window is a column of the transposed output); 0 for other plans."""
    return ceil(spec.q / nwin) if slab and vector == "filters" else 0


def window_tiles(spec, nwin, slab, vector):
    """Window tiles per image and group: P rows of row_tiles for a direct plan, else the
    window positions cut into tiles of ``nwin``."""
    return spec.p * row_tiles(spec, nwin, slab, vector) or ceil(window_positions(spec, slab) / nwin)


def reads_input_unpacked(spec, vector, tuning):
    """1x1, stride 1, no padding, windows in vectors: the NCHW input already is the C x (H*W)
    matrix whose rows the kernel loads as vectors, so full window tiles need no packing. Not
    when the plane's size in bytes is a multiple of half a page (32x32, 64x64 planes): a tile's
    rows, one per channel, would then share one or two L1 sets (measured 18-50% slower than
    packed tiles; 16x16 planes, four sets, run as fast). Not with ``tuning.packed_1x1_filters``
    filters or more either: every filter tile reuses a packed tile, whose contiguous rows then
    beat rows a plane apart by more than the copy costs. Not with filters in vectors: the
    windows are broadcast, one input row (channel) per step, and packed they sit in L1
    (measured 3-18% faster, e.g. 1x1 2432->1600 on 7x7)."""
    many_filters = tuning.packed_1x1_filters and spec.k_per_group >= tuning.packed_1x1_filters
    return (vector == "windows" and _plain_1x1(spec) and not many_filters
            and PAGE // gcd(spec.h * spec.w * spec.itemsize, PAGE) >= 4)


def slab_fits(spec, nwin, vector):
    """A slab applies except to unpadded stride-1 1x1s (their slab would be a plain copy of the
    input, which their tiles read in place or pack, see reads_input_unpacked); with windows in
    vectors only when its rows are at least a tile wide (so a tile spans at most two rows)."""
    return not _plain_1x1(spec) and (vector == "filters" or slab_shape(spec)[1] >= nwin)


def _plain_1x1(spec):
    return (spec.r, spec.s, spec.stride, spec.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def slab_footprint(spec, nwin, nc, line):
    """Bytes of a slab a window tile reads: per channel, one run of windows per filter row
    (stride 1: the S taps of a row share it, nwin + dw*(S-1) values) or per tap (other
    strides: taps fall on different phase planes), each a line longer when unaligned and
    doubled when the tile straddles two slab rows (a fraction nwin/Ws of tiles)."""
    sw, dw = spec.stride[1], spec.dilation[1]
    runs, values = (spec.r, nwin + dw * (spec.s - 1)) if sw == 1 else (spec.r * spec.s, nwin)
    straddle = 1 + nwin / slab_shape(spec)[1]
    return nc * runs * straddle * (values * spec.itemsize + line)


def use_slab(spec, nwin, nf, nc, vector, machine):
    """Pad each channel tile into a slab once and let the kernel read it in place, instead of
    packing R*S shifted copies of every window tile, when few filter tiles share each packed
    tile (at most ``tuning.slab_max_filter_tiles``) and the slab rows a tile reads fit in L1
    beside the filter and output tiles. Past that count the packing is shared by enough
    filter tiles, and the slab costs more: its rows, scattered over Nc planes, sit less well in
    L1 than a packed tile, its vector loads are unaligned, and its tiles straddle output rows,
    which costs split, masked stores (csa/TUNING.md has the measurements)."""
    _, fw, fout = tile_footprints(spec, nwin, nf, nc)
    return (slab_fits(spec, nwin, vector)
            and ceil(spec.k_per_group / nf) <= machine.tuning.slab_max_filter_tiles
            and slab_footprint(spec, nwin, nc, machine.line) + fw + fout <= CACHE_FILL * machine.l1d)


DIRECT_MIN_BAND = 32     # window tiles per band of a direct plan, at least
OUTPUT_BAND_FILL = 0.25  # share of L2 a band's partial outputs may take (the rest: filters,
                         # slab rows or packed tiles, the input streaming in; measured best)


def output_band(spec, nwin, nc, window_tiles, vector, machine, row_tiles=0):
    """Window tiles per output band: the loop nest runs the channel tiles band by band, so that
    a band's partial outputs (its window tiles x K_g filters) stay in L2 from one channel tile
    to the next instead of going to L3 and back, at the price of reading the filters again for
    every band (``analyze`` keeps bands where the cost model finds them cheaper). Measured on
    3x3 128->128 at 112x112 (5 channel tiles, 6.4 MB of output): 5% faster; on 3x3 512->512 at
    28x28 (9.4 MB of filters for 1.6 MB of output) 3% slower, which the model rejects. One band
    when there is a single channel tile, and with filters in vectors on packed tiles (small
    planes, whose transposed output is accumulated apart).

    A direct plan is banded even with one channel tile, since each band transposes its own
    output while hot in L2 (3x3 128->128 at 112x112: 4% of the time as one band, 3% in bands),
    in whole output rows (``row_tiles`` window tiles each), and of at least DIRECT_MIN_BAND
    tiles, since a band reads every filter tile from L3 again (3x3 512->512 at 28x28: bands of
    8 tiles 4% slower than of 28 or 56)."""
    if not row_tiles and (vector == "filters" or nc >= spec.c_per_group):
        return window_tiles
    per_tile = nwin * spec.k_per_group * spec.itemsize
    band = int(max(1, OUTPUT_BAND_FILL * CACHE_FILL * machine.l2 // per_tile))
    if row_tiles:
        band = max(band, DIRECT_MIN_BAND)
        band = max(row_tiles, band - band % row_tiles)
    return min(window_tiles, band)


def _band_fits_l2(spec, nwin, band, machine):
    """A band's partial outputs fit the share of L2 output_band sizes them for."""
    share = OUTPUT_BAND_FILL * CACHE_FILL * machine.l2
    return band * nwin * spec.k_per_group * spec.itemsize <= share


def band_workspace(spec, nwin, nc, band, slab, vector, row_tiles=0):
    """Bytes a band needs beside its tiles: the slab of its rows (``nc`` channels' phase
    planes), and with filters in vectors its transposed output (the band's windows x K)."""
    total = 0
    if slab:
        sh, sw = spec.stride
        total += nc * sh * sw * slab_band_rows(spec, nwin, band, row_tiles) * slab_shape(spec)[1]
    if vector == "filters":
        total += min(spec.p * spec.q, band * nwin) * spec.k
    return total * spec.itemsize


def workspace_band_cap(spec, nwin, nc, slab, vector, window_tiles, budget, row_tiles=0):
    """The most window tiles a band may hold for ``band_workspace`` to stay within ``budget``
    bytes (a thread's share of L3: larger bands would not stay in cache anyway), so that a
    call's workspace is bounded by its tiles, not by the input size; at least one tile (direct:
    one output row)."""
    step = row_tiles or 1   # direct bands are whole output rows
    lo, hi = 1, -(-window_tiles // step)
    while lo < hi:   # the workspace grows with the band: the largest count within the budget
        mid = (lo + hi + 1) // 2
        if band_workspace(spec, nwin, nc, mid * step, slab, vector, row_tiles) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return min(window_tiles, lo * step)


def slab_within(spec, nwin, nc, vector, budget):
    """The slab of the smallest band (one window tile, or one output row of a direct plan)
    fits ``budget`` bytes: not so for planes of hundreds of thousands of columns, whose
    tiles are packed instead."""
    per_row = row_tiles(spec, nwin, True, vector)
    return band_workspace(spec, nwin, nc, per_row or 1, True, "windows", per_row) <= budget


def slab_band_rows(spec, nwin, band, row_tiles=0):
    """Rows of each phase plane a band of ``band`` slab tiles reads: the virtual rows its
    windows span, starting anywhere in a row (for a direct plan: the output rows of ``band``
    tiles of ``row_tiles`` per row, starting on a row when ``band`` is whole rows), and the
    filter's reach below them."""
    hs, ws = slab_shape(spec)
    if row_tiles:
        spans = (band - 1 + (row_tiles - 1 if band % row_tiles else 0)) // row_tiles + 1
    else:
        spans = (band * nwin + ws - 2) // ws + 1
    return min(hs, spans + hs - spec.p)


FILTER_SPLIT_COST = 0.05  # filter parts each pack (or fill) the whole input again


def window_units(spec, nwin, slab, vector):
    """What a window split hands out, over all images: output rows for a direct plan (a slab
    band starts on a row), else window tiles."""
    per_image = spec.p if row_tiles(spec, nwin, slab, vector) else window_tiles(spec, nwin, slab,
                                                                                 vector)
    return spec.n * per_image


def thread_split(spec, units, filter_tiles, threads, filters_splittable, min_flops):
    """(window parts, filter parts) of the output, one thread each: the split whose busiest
    thread has the least work, a filter part costing FILTER_SPLIT_COST more, since each
    repacks the input. The output is split, never the reduction, so the result does not
    depend on it. A thread is only added for at least ``min_flops`` of work (the record's
    ``thread_min_flops``: small convolutions stay on one), and only where it makes the busiest
    thread's share smaller."""
    worth = max(1, min(threads, int(spec.flops // min_flops)))
    best, best_share = (1, 1), 1.0
    for t in range(2, worth + 1):
        for a in range(1, t + 1):
            b = t // a
            if a * b != t or a > units or b > filter_tiles or (b > 1 and not filters_splittable):
                continue
            share = (ceil(units / a) * ceil(filter_tiles / b) / (units * filter_tiles)
                     * (1 + FILTER_SPLIT_COST * (b > 1)))
            if share < best_share - 1e-9:
                best, best_share = (a, b), share
    return best


def analyze_slicing(spec, machine=None, *, vector=None, microtile_shape=None, nc=None, k2=None,
                    k3=None, schedule=None, slab=None, band=None, split=None, threads=1):
    """The slicing plan of ``spec`` for ``machine`` (default: ``Machine.host()``) and up to
    ``threads`` threads. Keyword overrides force a value (tests and what-if analysis; ``microtile_shape`` is
    (windows, filters) per tile in the plan's vector orientation, ``split`` the output parts,
    whatever ``threads``); the rest is derived by the rules above. Only the blocking and the
    schedule depend on ``threads`` (through each thread's share of L3), never the channel tiles
    or kernels: the result is the same for any thread count."""
    machine = machine or Machine.host()
    given = check_overrides(vector=vector, microtile_shape=microtile_shape, nc=nc, k2=k2, k3=k3,
                            schedule=schedule, slab=slab, band=band, split=split)
    forced = tuple(given)
    vector, microtile_shape, nc, k2, k3, schedule, slab, band, split = (
        given.get(name) for name in SLICING_OVERRIDES)
    tiles = {"windows": microtile(machine, spec.itemsize),
             "filters": filter_vector_tile(machine, spec.itemsize, spec.p * spec.q)}
    direct_tile = (direct_windows(spec, machine),
                   TILE_VECTORS * machine.vector_bytes // spec.itemsize)
    tile = microtile_shape or direct_tile
    fits_direct = use_direct(spec, *tile, machine.tuning) and slab_within(
        spec, tile[0], direct_channel_tile(spec, tile[1], machine.l2), "filters", machine.l3)
    if vector is None:
        vector = ("filters" if slab is not False and fits_direct else
                  choose_vector(spec, tiles["windows"], tiles["filters"], machine.tuning))
    direct = vector == "filters" and (fits_direct if slab is None else slab)
    nwin, nf = microtile_shape or (direct_tile if direct else tiles[vector])
    if slab and not slab_fits(spec, nwin, vector):
        raise ValueError(f"slab override: {spec} is an unpadded stride-1 1x1, or needs slab rows "
                         f"of at least {nwin} columns with windows in vectors "
                         f"(has {slab_shape(spec)[1]})")
    if nc:
        nc = min(nc, spec.c_per_group)
    else:
        nc = (direct_channel_tile(spec, nf, machine.l2) if direct else
              channel_tile(spec, nwin, nf, machine.l1d))
    if vector == "filters":
        slab = direct
    elif slab is None:
        slab = use_slab(spec, nwin, nf, nc, vector, machine) and slab_within(spec, nwin, nc,
                                                                             vector, machine.l3)
    fin, fw, fout = tile_footprints(spec, nwin, nf, nc)
    per_row = row_tiles(spec, nwin, slab, vector)
    t_in, t_w = window_tiles(spec, nwin, slab, vector), ceil(spec.k_per_group / nf)
    # filter parts of grouped filters-in-vectors plans would transpose a group's filters apart
    units = window_units(spec, nwin, slab, vector)
    splittable = spec.groups == 1 or vector == "windows"
    if split:
        split = (min(split[0], units), min(split[1], t_w) if splittable else 1)
    else:
        split = thread_split(spec, units, t_w, threads, splittable,
                             machine.tuning.thread_min_flops)
    plan_machine, machine = machine, machine.per_thread(split[0] * split[1])

    def costed(band):
        blocks = {"IS": blocking(fin, fw, fout, t_w, band, machine),
                  "WS": blocking(fw, fin, fout, band, t_w, machine)}
        costs = {name: schedule_costs(spec, machine, nwin, nf, nc, *blocks[name], name, vector,
                                      band) for name in SCHEDULES}
        chosen = schedule or min(SCHEDULES, key=lambda name: costs[name]["total"])
        return band, blocks, costs, chosen

    # output bands where the model finds the partial outputs they keep in L2 worth the filters
    # they read again (one band on a tie); a direct plan is always banded (see output_band)
    banded = output_band(spec, nwin, nc, t_in, vector, machine, per_row)
    cap = workspace_band_cap(spec, nwin, nc, slab, vector, t_in, machine.l3, per_row)
    bands = ([min(band, t_in)] if band else [min(banded, cap)] if per_row else
             sorted({min(t_in, cap), min(banded, cap)}, reverse=True))
    band, blocks, costs, chosen = min((costed(b) for b in bands),
                                      key=lambda option: option[2][option[3]]["total"])
    b2, b3 = blocks[chosen]
    return SlicingPlan(spec, plan_machine, nwin, nf, nc, k2 or b2, k3 or b3, chosen, vector, slab,
                       band, costs, forced, split)
