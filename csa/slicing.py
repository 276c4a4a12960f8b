"""The slicing plan: a convolution's micro-tile, channel tile, blocking, schedule, bands and
thread split (``analyze_slicing``, the rules of the modules it imports), and what it implies
for the lowering (its properties)."""
from dataclasses import dataclass, field
from math import ceil

from .bands import (band_buffers, direct_band_channel_tile, direct_l2_set, output_band,
                    slab_within, workspace_band_cap)
from .blocking import (CACHE_FILL, DIRECT_FILTER_FILL, DIRECT_L1_FILTER_FILL, OUTPUT_BAND_FILL,
                       SCHEDULES, band_fits_l2, blocking, channel_tile, direct_channel_tile,
                       filters_in_l1, schedule_costs, streams_1x1_filters, tile_footprints)
from .layout import (LAYOUTS, SlabGeometry, balanced_row_windows, block_channel_tile,
                     blocked_band_rows, blocked_fits, blocked_slab_shape, reads_in_place,
                     row_tiles, slab_band_rows, slab_shape, subsampled, window_positions,
                     window_tiles, window_units)
from .machine import Machine
from .register_blocking import (TILE_VECTORS, blocked_tile, direct_windows, filter_vector_tile,
                                microtile)
from .overrides import SLICING_OVERRIDES, forced_note
from .thread_split import (FILTER_SPLIT_COST, GROUPED_FILTER_SPLIT_COST,
                           GROUPED_WINDOW_SPLIT_COST, parts_per_thread, thread_split,
                           use_group_runs)
from .variants import (choose_vector, grouped_direct, packing_positions, reads_input_unpacked,
                       slab_fits, use_direct, use_slab)

# on blocks, the next filter tile is prefetched where a thread's filters are this many times
# L2, or overflow L2 on an output plane of at most BLOCKED_PREFETCH_PLANE windows (few windows
# a filter tile: its lines stream fast); see SlicingPlan.prefetch_filters
BLOCKED_PREFETCH_L2S = 2
BLOCKED_PREFETCH_PLANE = 64


@dataclass(frozen=True)
class SlicingPlan(SlabGeometry):
    spec: object
    machine: Machine
    nwin: int
    nf: int
    nc: int
    k2: int
    k3: int
    schedule: str
    vectors_along: str                             # "windows" or "filters" (see choose_vector)
    slab: bool                              # input read in place from a padded slab (see use_slab)
    band: int                               # window tiles per output band (see output_band)
    costs: dict = field(compare=False)      # schedule -> {term: cycles}
    forced: tuple = ()                      # names of the values set by an override
    split: tuple = (1, 1)                   # output split over threads: (windows, filters)
    parts_per_thread: int = 1        # window parts per thread (see parts_per_thread)
    group_runs: bool = False         # threads take runs of the groups' windows (see use_group_runs)
    origin: str = field(default="", compare=False)   # where it came from when not the model
    layout: str = "nchw"     # the activations': "nchw", or "blocked" (see csa.layout.LAYOUTS)

    @property
    def threads(self):
        """Threads the plan runs on: one per part of ``split`` (see thread_split)."""
        return self.split[0] * self.split[1]

    @property
    def parts(self):
        """(window parts, filter parts) of the output, each thread's own first (``cso.pool``)."""
        return self.split[0] * self.parts_per_thread, self.split[1]

    @property
    def direct(self):
        """Filters in vectors, windows broadcast in place from a slab (see use_direct)."""
        return self.slab and self.vectors_along == "filters"

    @property
    def blocked(self):
        """On channel-blocked activations: a direct plan whose windows are broadcast from the
        input's blocks (in place, or from a slab of them when padded) and whose kernel stores
        into the output's blocks (no transposing pass)."""
        return self.layout == "blocked"

    @property
    def lanes(self):
        return self.machine.vector_bytes // self.spec.itemsize

    @property
    def variant(self):
        """The kernel variant (``KernelSpec.variant``): "blocked", "direct", "slab" (windows in
        vectors read in place from a slab) or "packed"."""
        return ("blocked" if self.blocked else "direct" if self.direct else "slab" if self.slab
                else "packed")

    @property
    def output_prefetch(self):
        """Window tiles ahead the kernel prefetches its output rows (``Tuning.output_prefetch``)
        with windows in vectors; 0 with filters in vectors, whose kernel stores to the band's
        transposed output, in L2."""
        return self.machine.tuning.output_prefetch if self.vectors_along == "windows" else 0

    @property
    def prefetch_filters(self):
        """Whether the kernel brings the next filter tile to L2 while it computes on this one
        (``KernelSpec.prefetch_next``): with filters in vectors, packed or direct. A filter tile
        comes from L3 or memory the first time its window tiles read it (in a model, whose
        other layers evicted it since the last call), at the pace of the kernel's FMAs, faster
        than one core's bandwidth from there; asked for during the calls before, the same
        lines arrive in time: timm 1x1s and 3x3s whose filters overflow L2 ran 0.78-0.97x the
        time at 1 thread, 0.87-1.02x at 2, the others 0.92-1.03x (csa/TUNING.md, "Filter
        tiles prefetched"). On several threads, only where a thread's filters (all of them,
        or its part of them where the split is over filters) overflow L2: a core that keeps
        its share of a smaller layer's in L2 between calls gained nothing, and paid up to 4%
        (1x1s of 14 x 14). On blocks, where they are BLOCKED_PREFETCH_L2S times L2, or
        overflow it on a plane of at most BLOCKED_PREFETCH_PLANE windows (each filter tile
        serves few window tiles there): ResNet's last stage ran 0.90-0.92x the time, its
        4 MB 1x1s 0.90-0.95x, but 14 x 14 3x3s of 2.4-3.7 MB 1.04-1.06x when they prefetched."""
        s = self.spec
        per_thread = s.k * s.c_per_group * s.r * s.s * s.itemsize / self.split[1]
        if self.vectors_along != "filters":
            return False
        if self.blocked:
            return (per_thread > BLOCKED_PREFETCH_L2S * self.machine.l2
                    or (per_thread > self.machine.l2
                        and s.p * s.q <= BLOCKED_PREFETCH_PLANE))
        return self.threads == 1 or per_thread > self.machine.l2

    @property
    def row_tiles(self):
        return row_tiles(self.spec, self.nwin, self.slab, self.vectors_along)

    @property
    def window_tiles(self):
        return window_tiles(self.spec, self.nwin, self.slab, self.vectors_along)

    @property
    def computed_windows(self):
        """Windows the tiles compute per image and group, edge padding included: a direct
        plan's rows of even tiles pad none."""
        return self.spec.p * self.spec.q if self.direct else self.window_tiles * self.nwin

    @property
    def filter_tiles(self):
        return ceil(self.spec.k_per_group / self.nf)

    @property
    def channel_tiles(self):
        return ceil(self.spec.c_per_group / self.nc)

    # the geometry the plan implies, for the lowering (see ``csa.layout``)
    @property
    def slab_shape(self):
        """(Hs, Ws): the slab's phase planes, or a blocked plan's padded input
        (``csa.layout.blocked_slab_shape``)."""
        return blocked_slab_shape(self.spec) if self.blocked else slab_shape(self.spec)

    @property
    def band_rows(self):
        """Rows of each slab phase plane (of a blocked plan's slab) a band reads."""
        if self.blocked:
            return blocked_band_rows(self.spec, self.band, self.row_tiles)
        return slab_band_rows(self.spec, self.nwin, self.band, self.row_tiles)

    @property
    def window_positions(self):
        return window_positions(self.spec, self.slab)

    @property
    def window_units(self):
        """What a window split hands out (output rows of a direct plan, else window tiles)."""
        return window_units(self.spec, self.nwin, self.slab, self.vectors_along)

    @property
    def reads_input_unpacked(self):
        if self.blocked:
            return reads_in_place(self.spec)
        return reads_input_unpacked(self.spec, self.vectors_along, self.machine.tuning)

    @property
    def band_buffers(self):
        """(slab, transposed output) elements of one band (``csa.bands.band_buffers``); a
        blocked plan's slab holds whole blocks, its output needs no transposing."""
        if self.blocked:
            blocks = -(-self.nc // self.lanes)
            slab = (0 if self.reads_input_unpacked
                    else blocks * self.lanes * self.band_rows * self.slab_shape[1])
            return slab, 0
        return band_buffers(self.spec, self.nwin, self.nc, self.band, self.slab, self.vectors_along,
                            self.row_tiles)

    @property
    def direct_l2_set(self):
        """Bytes a direct plan's calls keep in L2 within a band (``csa.bands.direct_l2_set``)."""
        return direct_l2_set(self.spec, self.nwin, self.nf, self.nc, self.band, self.row_tiles)

    def footprints(self):
        return tile_footprints(self.spec, self.nwin, self.nf, self.nc)

    def explain(self):
        s, m = self.spec, self.machine
        fin, fw, fout = self.footprints()
        ds, rs = s.itemsize, s.r * s.s
        nc_rule = ("all C/groups channels fit:" if self.nc == s.c_per_group else
                   f"C/groups split evenly into the fewest tiles ({self.channel_tiles}) with"
                   if "nc" not in self.forced else "forced; the rule is")
        in_l1 = "nc" not in self.forced and filters_in_l1(s, self.nwin, m, self.blocked)
        why_l1 = (f"{self.nwin} windows a tile are too few to stream the filter tile from L2"
                  if self.blocked else f"an image's {s.p * self.row_tiles} window tiles read "
                  "the filter tile from L1 in turn")
        direct_room = (f"Nf*R*S*Nc*ds <= {DIRECT_L1_FILTER_FILL}*L1 ({fw} vs "
                       f"{int(DIRECT_L1_FILTER_FILL * m.l1d)}: {why_l1})" if in_l1 else
                       f"Nf*R*S*Nc*ds <= {DIRECT_FILTER_FILL}*L2 ({fw} vs "
                       f"{int(DIRECT_FILTER_FILL * m.l2)})")
        lines = [
            f"SlicingPlan for {s} ({s.flops / 1e9:.3f} GFLOP)",
            f"  machine: {m}",
            f"  micro-tile: {self.nwin} windows x {self.nf} filters, vectors along the "
            f"{self.vectors_along} "
            f"(from {m.vector_registers} registers of {m.vector_bytes // ds} lanes; computes "
            f"{self.computed_windows * self.filter_tiles * self.nf} outputs for "
            f"{s.p * s.q * s.k_per_group}){forced_note(self, 'microtile_shape', 'vectors_along')}",
            (f"  Nc = {self.nc}: {nc_rule} {direct_room} and, unless calls would be shallower "
             f"than {m.tuning.direct_min_depth} rows, the filter tile, slab rows and a group's "
             f"partial outputs of a band <= {CACHE_FILL}*L2 ({self.direct_l2_set} vs "
             f"{int(CACHE_FILL * m.l2)})" if self.direct else
             f"  Nc = {self.nc}: {nc_rule} Nc*(Nwin+Nf)*R*S*ds + Nwin*Nf*ds <= {CACHE_FILL}*L1: "
             f"{self.nc}*{self.nwin + self.nf}*{rs}*{ds} + {fout} = "
             f"{self.nc * (self.nwin + self.nf) * rs * ds + fout} vs {int(CACHE_FILL * m.l1d)}")
            + forced_note(self, 'nc'),
            f"  tiles: {self.window_tiles} window x {self.filter_tiles} filter x "
            f"{self.channel_tiles} channel (per image and group); |IN|={fin} B |W|={fw} B |OUT|={fout} B",
        ]
        if self.schedule == "IS":
            lines.append(f"  IS: K2 = {self.k2} filter tiles in L2 (|IN| + K2*(|W|+|OUT|) <= "
                         f"{CACHE_FILL}*L2), K3 = {self.k3} window tiles in L3 (K3*|IN| + K2*|W| + "
                         f"K2*K3*|OUT| <= {CACHE_FILL}*L3){forced_note(self, 'k2', 'k3')}")
        else:
            lines.append(f"  WS: K2 = {self.k2} window tiles in L2 (|W| + K2*(|IN|+|OUT|) <= "
                         f"{CACHE_FILL}*L2), K3 = {self.k3} filter tiles in L3 (K3*|W| + K2*|IN| + "
                         f"K2*K3*|OUT| <= {CACHE_FILL}*L3){forced_note(self, 'k2', 'k3')}")
        bands = ceil(self.window_tiles / self.band)
        block = self.band * self.nwin * s.k_per_group * ds
        where = "fit" if band_fits_l2(s, self.nwin, self.band, m) else "overflow"
        lines.append(f"  output bands: {bands} of {self.band} window tiles" + (
            f", whose partial outputs ({self.band}*{self.nwin}*{s.k_per_group}*{ds} = {block} B) "
            f"{where} {OUTPUT_BAND_FILL}*{CACHE_FILL}*L2 between the {self.channel_tiles} channel "
            f"tiles" if self.channel_tiles > 1 else " (one channel tile: no partial outputs)")
            + forced_note(self, "band"))
        if self.blocked:
            short = self.row_tiles * self.nwin - s.q
            lines.append(
                f"  layout: channel-blocked ({self.lanes} channels a block, the vector lanes): "
                f"the kernel stores each tile into the output's blocks (no transposing pass), "
                f"{self.nf // self.lanes} vector(s) of filters a tile (the most lanes used at "
                f"the model's speed), {self.row_tiles} tiles per output row"
                + (f", {short} of them of {self.nwin - 1} windows by a kernel of their own"
                   if short else ""))
            source = ("a slab of its windows alone (a strided 1x1)" if subsampled(s) else
                      "a zero-padded slab of its blocks")
            lines.append("  input: " + (
                "read in place from its blocks (no padding), a window every "
                f"{s.stride[1]} block(s)" if self.reads_input_unpacked else
                f"{source} ({self.band_rows} rows of {self.slab_shape[1]} columns per band "
                f"and channel tile), copied once per band"))
        elif self.slab:
            short = self.row_tiles * self.nwin - s.q
            why = (f"direct: windows broadcast from it, {self.row_tiles} tiles per output row"
                   + (f", {short} of them of {self.nwin - 1} windows by a kernel of their own"
                      if short else "")
                   if self.direct else f"{self.filter_tiles} <= "
                   f"{self.machine.tuning.slab_max_filter_tiles} filter tiles per packed tile")
            lines.append(f"  input: a padded slab of {s.stride[0] * s.stride[1]} phase plane(s) per "
                         f"channel ({self.band_rows} rows "
                         f"of each per band), read in place ({why}){forced_note(self, 'slab')}")
        else:
            lines.append(f"  input: packed tiles (R*S shifted copies per channel){forced_note(self, 'slab')}")
        lines.append("  cost model (cache-line loads x latency, streamed L2 x bandwidth, cycles):")
        for name in SCHEDULES:
            terms = self.costs[name]
            detail = ", ".join(f"{k} {v:.3g}" for k, v in terms.items() if k != "total")
            lines.append(f"    {name}: total {terms['total']:.4g}  ({detail})")
        why = "forced by override" if "schedule" in self.forced else "cheaper"
        lines.append(f"  schedule: {self.schedule} ({why})")
        groups = self.spec.groups
        whole_groups = " (whole groups)" if 1 < self.parts[1] <= groups else ""
        rows = "output rows" if self.direct else "window tiles"
        if self.group_runs:
            split = (f"each a near-equal run of the {groups} groups' {self.window_units} {rows} "
                     f"(all images) in group order: whole groups and a share of one's {rows}")
        else:
            split = (f"the output split into {self.parts[0]} part(s) of the {self.window_units} "
                     f"{rows} (all images) x {self.parts[1]} of the "
                     f"{groups * self.filter_tiles} filter tiles{whole_groups} "
                     f"({self.parts_per_thread} window part(s) a thread, each thread's own "
                     f"first, then others' last ones)")
        lines.append(f"  threads: {self.threads}, {split}; L3 counted as "
                     f"{m.per_thread(self.threads).l3 // 1024} KiB per thread"
                     + forced_note(self, "split"))
        lines.append(f"  plan: {self.origin or 'from the model'}")
        return "\n".join(lines)

    def compute_bound(self, peak_gflops):
        """Seconds the plan's tiles (edge padding included) take at its micro-kernel's
        calibrated (else modelled) fraction of a ``peak_gflops`` core, on each of its threads:
        the model's prediction, which leaves memory out."""
        s, m = self.spec, self.machine
        lanes = m.vector_bytes // s.itemsize
        broadcasts, vectors = ((self.nwin, self.nf // lanes) if self.vectors_along == "filters"
                               else (self.nf, self.nwin // lanes))
        speed = (m.tuning.measured_speeds(vectors, (self.variant,)).get(broadcasts)
                 or m.tuning.kernel_efficiency(m.vector_registers, broadcasts, vectors))
        flops = (2 * s.n * s.groups * self.computed_windows * self.filter_tiles * self.nf
                 * s.c_per_group * s.r * s.s)
        return flops / (max(speed, 0.05) * peak_gflops * 1e9 * self.threads)


def analyze_slicing(spec, machine, threads, overrides, layout="nchw"):
    """The slicing plan of ``spec`` for ``machine`` and up to ``threads`` threads (see
    ``csa.analyze``) on activations of ``layout`` (``csa.layout.LAYOUTS``). ``overrides`` (as
    ``check_overrides`` returns them) force a value:
    ``microtile_shape`` is (windows, filters) per tile in the plan's orientation, ``split`` the
    output parts, whatever ``threads``; the rest is derived by the rules. Only the blocking and
    the schedule depend on ``threads`` (through each thread's share of L3), never the channel
    tiles or kernels: the result is the same for any thread count.

    On blocked activations the plan is a direct one whatever its shape (the layout already
    holds the windows as the kernel broadcasts them, and takes its stores in place): the
    tiles, channel tile (in whole blocks), bands, split and schedule follow the direct rules."""
    vectors_along, microtile_shape, nc, k2, k3, schedule, slab, band, split = (
        overrides.get(name) for name in SLICING_OVERRIDES)
    blocked = _check_layout(spec, machine, layout, vectors_along, slab)
    if blocked:
        vectors_along, slab = "filters", True
    lanes = machine.vector_bytes // spec.itemsize
    tiles = {"windows": microtile(machine, spec.itemsize),
             "filters": filter_vector_tile(
                 machine, spec.itemsize, spec.p * spec.q,
                 spec.k * spec.c_per_group * spec.r * spec.s * spec.itemsize,
                 packing_positions(spec, machine.tuning, TILE_VECTORS * lanes))}
    grouped = not blocked and grouped_direct(spec, machine)
    direct_tile = (blocked_tile(spec, machine) if blocked or grouped else
                   (direct_windows(spec, machine), TILE_VECTORS * lanes))
    tile = microtile_shape or direct_tile
    fits_direct = (grouped or use_direct(spec, *tile, machine.tuning, lanes)) and slab_within(
        spec, tile[0], direct_channel_tile(spec, tile[1], machine), "filters", machine.l3)
    if vectors_along is None:
        vectors_along = ("filters" if slab is not False and fits_direct else
                  choose_vector(spec, tiles["windows"], tiles["filters"], machine.tuning, lanes))
    direct = vectors_along == "filters" and (fits_direct if slab is None else slab)
    nwin, nf = microtile_shape or (direct_tile if direct else tiles[vectors_along])
    if direct:
        nwin = balanced_row_windows(spec.q, nwin)
    if slab and not blocked and not slab_fits(spec, nwin, vectors_along):
        raise ValueError(f"slab override: {spec} is an unpadded stride-1 1x1, or needs slab rows "
                         f"of at least {nwin} columns with windows in vectors "
                         f"(has {slab_shape(spec)[1]})")
    if nc:
        nc = min(nc, spec.c_per_group)
    else:
        # (a blocked plan's windows are a block apart: each broadcast its own line)
        nc = (direct_channel_tile(spec, nf, machine, nwin, blocked) if direct else
              channel_tile(spec, nwin, nf, machine.l1d, vectors_along == "filters"
                           and streams_1x1_filters(spec, nwin, machine)))
    if vectors_along == "filters":
        slab = direct
    elif slab is None:
        slab = (use_slab(spec, nwin, nf, nc, vectors_along, machine)
                and slab_within(spec, nwin, nc, vectors_along, machine.l3))
    per_row = row_tiles(spec, nwin, slab, vectors_along)
    t_in, t_w = window_tiles(spec, nwin, slab, vectors_along), ceil(spec.k_per_group / nf)

    def banded_and_cap(machine):
        return (output_band(spec, nwin, nc, t_in, vectors_along, machine, per_row),
                workspace_band_cap(spec, nwin, nc, slab, vectors_along, t_in, machine.l3, per_row))

    if direct and "nc" not in overrides:
        # within the band of one thread, no smaller than a thread's: the channel tiles, and so
        # the order of the sums, are the same for any thread count
        one_thread = min(band or min(banded_and_cap(machine)), t_in)
        nc = direct_band_channel_tile(spec, nwin, nf, nc, one_thread, per_row, machine)
    if blocked:
        if "nc" in overrides and nc % lanes and nc < spec.c_per_group:
            raise ValueError(f"nc override {nc}: a blocked plan's channel tiles are whole "
                             f"blocks of {lanes} channels (or all {spec.c_per_group})")
        nc = block_channel_tile(nc, lanes, spec.c_per_group)
    fin, fw, fout = tile_footprints(spec, nwin, nf, nc)
    units = window_units(spec, nwin, slab, vectors_along)
    # what a filter part inside a group costs more: it packs the group's input again (nothing
    # where a 1x1 reads it in place), for a grouped windows-in-vectors plan its windows
    repacking = (0 if not blocked and reads_input_unpacked(spec, vectors_along, machine.tuning)
                 else GROUPED_FILTER_SPLIT_COST if spec.groups > 1 and vectors_along == "windows"
                 and not blocked else FILTER_SPLIT_COST)
    runs = False
    if split:
        split = (min(split[0], units), min(split[1], spec.groups * t_w))
        per_thread = 1
    else:
        windowing = GROUPED_WINDOW_SPLIT_COST if blocked and spec.groups > 1 else 0.0
        split = thread_split(spec, units, t_w, threads, machine, repacking, windowing)
        runs = use_group_runs(spec.groups, units, t_w, split, repacking)
        if runs:
            split = (1, split[0] * split[1])
        per_thread = 1 if runs else parts_per_thread(spec, split, units, machine)
    plan_machine, machine = machine, machine.per_thread(split[0] * split[1])

    def costed(band):
        blocks = {"IS": blocking(fin, fw, fout, t_w, band, machine),
                  "WS": blocking(fw, fin, fout, band, t_w, machine)}
        costs = {name: schedule_costs(spec, machine, nwin, nf, nc, *blocks[name], name,
                                      vectors_along, band) for name in SCHEDULES}
        chosen = schedule or min(SCHEDULES, key=lambda name: costs[name]["total"])
        return band, blocks, costs, chosen

    # output bands where the model finds the partial outputs they keep in L2 worth the filters
    # they read again (one band on a tie); a direct plan is always banded (see output_band)
    banded, cap = banded_and_cap(machine)
    if band and per_row:   # a direct plan's bands are whole output rows (its slab's rows)
        band = max(per_row, band - band % per_row)
    bands = ([min(band, t_in)] if band else [min(banded, cap)] if per_row else
             sorted({min(t_in, cap), min(banded, cap)}, reverse=True))
    band, blocks, costs, chosen = min((costed(b) for b in bands),
                                      key=lambda option: option[2][option[3]]["total"])
    b2, b3 = blocks[chosen]
    return SlicingPlan(spec, plan_machine, nwin, nf, nc, k2 or b2, k3 or b3, chosen,
                       vectors_along, slab, band, costs, tuple(sorted(overrides)), split,
                       per_thread, group_runs=runs, layout="blocked" if blocked else "nchw")


def _check_layout(spec, machine, layout, vectors_along, slab):
    """Whether ``layout`` is the blocked one, for a convolution that can take it and overrides
    that leave its orientation alone; ValueError otherwise."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "nchw":
        return False
    lanes = machine.vector_bytes // spec.itemsize
    if not blocked_fits(spec, lanes):
        raise ValueError(f"{spec} cannot run on blocks of {lanes} channels: its "
                         f"{spec.groups} groups of {spec.c_per_group} channels and "
                         f"{spec.k_per_group} filters do not start on blocks")
    if vectors_along not in (None, "filters") or slab is not None:
        raise ValueError("a blocked plan has filters in vectors and reads its input in place or "
                         "from a slab as its padding asks: vectors_along and slab cannot be "
                         "overridden")
    return True
