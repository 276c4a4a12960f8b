"""What depends on the CPU: one tuning record per ISA, and the register-blocking model.

A record holds the core facts the model needs (FMA latency and pipes, the vector loads a cycle
the L1 feeds, whether an FMA reads its broadcast operand from memory) and the plan constants
that were measured rather than derived, each record saying what it was measured on. Plans
read the record of the machine they plan for (``Machine.tuning``); ``csa/TUNING.md`` gives the
measurements behind each value.

The model (after Low et al., "Analytical modeling is enough for high-performance BLIS", ACM
TOMS 2016): a tile of ``broadcasts`` x ``vectors`` accumulators runs at the FMA peak when

- its accumulators cover the FMA latency times the pipes (independent FMAs in flight),
- its loads (``vectors`` vector rows and ``broadcasts`` broadcasts per step) stay within what the
  L1 delivers per cycle while the pipes run,
- accumulators, vector rows and a broadcast register fit the register file (else it spills).

A host calibration (``cso.calibration``) corrects a record with what it measured on this CPU
(``calibrated``): the FMAs in flight a tile needs, and the speed of the candidate tiles of
each kernel variant, of which the rules then choose only those measured fast.
"""
from dataclasses import dataclass, replace

MEASURED_TOLERANCE = 0.08   # tiles measured within this of the best are equally fast (noise)


@dataclass(frozen=True)
class Tuning:
    isa: str
    measured_on: str              # the CPUs the measured values below come from
    fma_latency: float            # cycles
    fma_pipes: int                # full-width vector FMAs issued a cycle
    loads_per_cycle: float        # vector loads and broadcasts the L1 sustains a cycle
    broadcast_operand: bool       # an FMA takes its broadcast from memory: no register for it
    # vector registers a kernel's loop holds beyond its tile's accumulators, filter rows and
    # broadcast: where no FMA takes a memory operand (aarch64), LLVM loads the next step's
    # rows and broadcasts ahead of this step's FMAs
    spare_registers: int = 0
    # (windows, relative speed) of filters-in-vectors tiles measured in loop nests, direct
    # (windows broadcast from a slab) and packed; () = the model's tiles all equally fast
    direct_windows: tuple = ()
    filter_windows: tuple = ()
    # work a thread must get to pay for handing parts over; and the work a part must have to be
    # handed out on its own (threads then share more parts than there are threads, each
    # thread's own run of them first, where each still has this much): a calibration derives
    # both from the hand-off it measures (cso.calibration), else these
    thread_min_flops: float = 3e6
    part_min_flops: float = 3e6
    depthwise_thread_min_flops: float = 0.5e6   # the same for a depthwise plan (about 10 us)
    depthwise_part_min_flops: float = 0.5e6     # and its parts past one a thread
    direct_min_depth: int = 512     # C/groups*R*S a direct plan needs (shallower: C's tile costs)
    # the same where a group's filters fit one direct filter tile, whose windows-in-vectors
    # plan reads its window tiles for several filter tiles (0: not measured, direct_min_depth)
    direct_one_tile_min_depth: int = 0
    # windows from which an output row's even direct tiles (one, where the row is narrower
    # than a tile) count at their own width where ``direct_windows`` lists no tile that
    # narrow, not padded to a listed one, and a strided row of one such tile runs direct
    # (``csa.variants.use_direct``; 0: not measured, never)
    direct_min_row_windows: int = 0
    # the same at stride 1 for a row that is one tile (8 x 8 planes: a direct plan prefetches
    # the filter tiles such a small plane streams; 0: not measured, direct_min_row_windows)
    direct_row_tile_min_windows: int = 0
    # window tiles an image's output rows must hold for an NCHW direct plan to keep its filter
    # tile in L1, read from there by each of them in turn, not streamed from L2
    # (``csa.blocking.filters_in_l1``; 0: not measured, never)
    direct_l1_filter_tiles: int = 0
    # taps (R*S) from which an NCHW depthwise convolution runs its blocked plan, its planes
    # transposed into blocks and back (``cso.Conv2d``; 0: not measured, never)
    depthwise_blocked_min_taps: int = 0
    # outputs a grouped convolution of as many filters as channels a group, in whole blocks
    # up to ``grouped_blocked_max_blocks`` of them (a filter larger than 1x1), may have for an
    # NCHW call to run its blocked plan on the NCHW planes, writing them from each band
    # (``cso.Conv2d``; 0: not measured, never)
    grouped_blocked_max_plane: int = 0
    grouped_blocked_max_blocks: int = 0
    # input pixels up to which such a convolution's groups of whole blocks (not merged ones)
    # run so whatever their outputs (0: not measured, never)
    grouped_blocked_max_input: int = 0
    # outputs a grouped convolution whose groups do not start on blocks may have for its
    # blocked and channels-last calls to run with groups merged onto blocks
    # (``csa.layout.merged_groups``, ``cso.Conv2d``; 0: not measured, never)
    merged_groups_max_plane: int = 0
    # the same limit on a host whose FMAs take no lane mask at no cost (no AVX-512), where
    # the merged kernels blend each FMA's result (``cso.calibration.model_machine``; 0: never)
    blended_merge_max_plane: int = 0
    # outputs such a convolution may have, where its last merge is padded with zero groups
    # (``csa.layout.padded_groups``), for its calls on channels last (or on blocks of other
    # lanes) to run merged too, their input copied into blocks of the kernels' lanes first
    # (``cso.Conv2d``; 0: not measured, never)
    padded_merge_max_plane: int = 0
    # outputs a grouped convolution's plane may have for its plan to be direct
    # (``csa.variants.grouped_direct``; 0: not measured, never)
    grouped_direct_max_plane: int = 0
    # on larger planes, those whose filters fill whole tiles of at least this many vectors
    # (``csa.variants.grouped_direct``; 0: not measured, never)
    grouped_direct_whole_vectors: int = 0
    # a channels-last image (all channels) over this many times L2 runs its blocked depthwise
    # plan in bands whose input pixels fit L2 (``csa.depthwise``; 0: not measured, never)
    pixel_band_image: float = 0
    slab_max_filter_tiles: int = 4  # windows in vectors read a slab when at most this many
    # filter tiles share each window tile (more: packing the tile once is cheaper)
    # the kernel depth (C/groups*R*S rows) whose FMAs the transposing pass of one output costs
    # with filters in vectors (0: not measured, the lanes padding alone chooses the vectors)
    transpose_depth: int = 0
    # with filters in vectors a plain 1x1 packs each input value once for all its filters,
    # where windows in vectors read the input in place: the packing costs as much per value
    # as the FMAs of this many filters (0: not measured, not counted)
    packing_filters: int = 0
    # FMA lanes a packed window tile's run (windows of one output row) costs per channel and
    # filter row, beside its elements: windows in vectors on short rows copy a tile in several
    # runs (``csa.variants.choose_vector``; 0: not measured, not counted)
    packing_run: float = 0
    # filters per group from which plain 1x1s pack their window tiles rather than read the
    # input in place (0: never, in place wherever it does not alias L1 sets)
    packed_1x1_filters: int = 0
    # and from which, on planes of at least packed_1x1_plane_bytes, they pack too: a tile's
    # rows, one per channel, then lie pages apart and the kernel waits on them (0: never)
    packed_1x1_plane_filters: int = 0
    packed_1x1_plane_bytes: int = 0
    # with windows in vectors the kernel prefetches its output rows' lines this many window
    # tiles ahead, where the loop nest's next tiles store: a store to a line not in the cache
    # waits for it, and a tile's rows lie in as many planes as it has filters, more streams
    # than the hardware prefetcher follows (0: no prefetch)
    output_prefetch: int = 0
    # measured on this host by a calibration: ((kernel variant, vectors, broadcasts, fraction
    # of the FMA peak), ...), variants as KernelSpec names them ("packed", "slab", "direct");
    # and what the calibration measured on ("": not calibrated)
    kernel_speeds: tuple = ()
    calibration: str = ""

    def kernel_efficiency(self, registers, broadcasts, vectors):
        """Modelled fraction of the FMA peak of a ``broadcasts`` x ``vectors`` tile (0 when
        it does not fit ``registers``)."""
        accumulators = broadcasts * vectors
        if (accumulators + vectors + (0 if self.broadcast_operand else 1)
                + self.spare_registers > registers):
            return 0.0
        latency = accumulators / (self.fma_latency * self.fma_pipes)
        loads = self.loads_per_cycle * accumulators / (self.fma_pipes * (broadcasts + vectors))
        return min(1.0, latency, loads)

    def broadcast_counts(self, registers, vectors, variants=("packed",)):
        """{broadcasts: efficiency} of the tiles with ``vectors`` vector rows that reach the
        best efficiency any of them reaches (ties: the plan rules choose), for kernels of every
        kernel variant in ``variants``. Calibrated: of the tiles measured within MEASURED_TOLERANCE
        of the best (a tile's speed: its slowest variant's), those the model finds fastest too,
        else all of them."""
        speeds = {b: self.kernel_efficiency(registers, b, vectors) for b in range(1, registers)}
        best = max(speeds.values())
        modelled = {b: e for b, e in speeds.items() if best > 0 and e >= best - 1e-9}
        measured = self.measured_speeds(vectors, variants)
        if not measured:
            return modelled
        fastest = max(measured.values())
        fast = {b: e for b, e in measured.items() if e >= (1 - MEASURED_TOLERANCE) * fastest}
        return {b: e for b, e in modelled.items() if b in fast} or fast

    def measured_speeds(self, vectors, variants):
        """{broadcasts: fraction of the peak} of the tiles of ``vectors`` rows a calibration
        measured in every one of ``variants`` (the slowest variant's)."""
        found = {}
        for variant, v, b, speed in self.kernel_speeds:
            if v == vectors and variant in variants:
                found.setdefault(b, {})[variant] = speed
        return {b: min(by_variant.values()) for b, by_variant in found.items()
                if len(by_variant) == len(variants)}

    def calibrated(self, fma_in_flight, kernel_speeds, host, thread_min_flops=None,
                   part_min_flops=None):
        """This record corrected by a calibration on ``host``: ``fma_in_flight`` independent
        FMAs measured to reach the peak (the model's latency x pipes), ``kernel_speeds``,
        ``thread_min_flops`` and ``part_min_flops`` (as the fields; None: the record's)."""
        return replace(self, fma_latency=fma_in_flight / self.fma_pipes,
                       kernel_speeds=tuple(kernel_speeds), calibration=host,
                       thread_min_flops=thread_min_flops or self.thread_min_flops,
                       part_min_flops=part_min_flops or self.part_min_flops)


AVX512 = Tuning(
    "avx512", "AMD Zen 5 (2 cores); Zen 4 runs zmm FMAs at half rate, same tiles; "
    "output_prefetch on Zen 4 (2 vCPUs); thread_min_flops on Zen 5 and an Intel Xeon (2 vCPUs), "
    "transpose_depth, packing_filters, packing_run, direct_min_row_windows, "
    "direct_one_tile_min_depth, "
    "slab_max_filter_tiles, grouped_blocked_max_plane, grouped_blocked_max_blocks, "
    "grouped_blocked_max_input, merged_groups_max_plane and padded_merge_max_plane on that "
    "Xeon; direct_l1_filter_tiles, direct_row_tile_min_windows, depthwise_blocked_min_taps, "
    "depthwise_thread_min_flops, the packed_1x1 fields, filter_windows, direct_windows, "
    "grouped_direct_max_plane and grouped_direct_whole_vectors on another (2 vCPUs, 2 MiB "
    "of L2, 480 MiB of L3)",
    fma_latency=4, fma_pipes=2, loads_per_cycle=2.0, broadcast_operand=True,
    direct_windows=((14, 1.0), (13, 1.0), (12, 1.0), (11, 0.995), (10, 0.99), (9, 0.985),
                    (8, 0.975), (7, 0.95), (6, 0.93)),
    filter_windows=((14, 1.0), (13, 0.99), (12, 0.99), (10, 0.96), (9, 0.97), (8, 0.97),
                    (7, 0.95)), direct_min_row_windows=10, direct_row_tile_min_windows=8,
    direct_l1_filter_tiles=28, direct_one_tile_min_depth=144, output_prefetch=2,
    thread_min_flops=1.2e6, transpose_depth=24, packing_filters=6, packing_run=90,
    slab_max_filter_tiles=4,
    grouped_blocked_max_plane=256, grouped_blocked_max_blocks=3, grouped_blocked_max_input=1024,
    merged_groups_max_plane=1024, padded_merge_max_plane=225, grouped_direct_max_plane=225,
    grouped_direct_whole_vectors=2, depthwise_blocked_min_taps=5,
    depthwise_thread_min_flops=0.1e6, packed_1x1_filters=256, packed_1x1_plane_filters=96,
    packed_1x1_plane_bytes=6144)
AVX2 = Tuning(
    "avx2", "AMD Zen 3 EPYC (2 cores); grouped_blocked_max_plane, grouped_blocked_max_blocks, "
    "merged_groups_max_plane and padded_merge_max_plane with these kernels on an Intel Xeon "
    "(AVX-512, 2 vCPUs), direct_l1_filter_tiles, packed_1x1_plane_filters and "
    "packed_1x1_plane_bytes on another (2 MiB of L2, 480 MiB of L3), blended_merge_max_plane "
    "there with these kernels compiled for Zen 3 (no mask registers)",
    fma_latency=4, fma_pipes=2, loads_per_cycle=1.75, broadcast_operand=False, direct_windows=((6, 1.0), (5, 0.97), (4, 0.90)),
    filter_windows=((6, 1.0), (5, 0.98), (4, 0.96)), thread_min_flops=1e6,
    part_min_flops=1.2e6, depthwise_thread_min_flops=0.2e6, depthwise_part_min_flops=0.2e6,
    direct_min_depth=144, grouped_direct_max_plane=1024, depthwise_blocked_min_taps=49,
    pixel_band_image=4.0,
    slab_max_filter_tiles=3, transpose_depth=16, packing_filters=6, packed_1x1_filters=256,
    packed_1x1_plane_filters=96, packed_1x1_plane_bytes=6144, direct_l1_filter_tiles=48,
    output_prefetch=2, grouped_blocked_max_plane=196, grouped_blocked_max_blocks=3,
    merged_groups_max_plane=1024, blended_merge_max_plane=49, padded_merge_max_plane=225)
# no CPU measured: the usual FMA core (latency 4, two pipes) with SSE/NEON-width vectors; the
# plan constants as the AVX2 core measured them
GENERIC = Tuning("generic", "not measured: a typical core", fma_latency=4, fma_pipes=2,
                 loads_per_cycle=2.0, broadcast_operand=False, direct_min_depth=144,
                 grouped_direct_max_plane=1024, depthwise_blocked_min_taps=49,
                 slab_max_filter_tiles=3, transpose_depth=16, packing_filters=6,
                 packed_1x1_filters=256, output_prefetch=2)
# spare_registers from the kernels cross-compiled for aarch64: 2 x 12, 1 x 26 and 3 x 7
# (vectors x broadcasts) are the largest tiles whose loops spill no vector register
NEON = Tuning("neon", "not measured (aarch64 runs here under emulation only): Neoverse/Apple "
              "cores have 2-4 FMA pipes of latency 4", fma_latency=4, fma_pipes=2,
              loads_per_cycle=2.0, broadcast_operand=False, spare_registers=5,
              direct_min_depth=144,
              grouped_direct_max_plane=1024, depthwise_blocked_min_taps=49,
              slab_max_filter_tiles=3, transpose_depth=16, packing_filters=6,
              packed_1x1_filters=256, output_prefetch=2)
RECORDS = {t.isa: t for t in (AVX512, AVX2, GENERIC, NEON)}


def record(isa):
    """The tuning record of ISA ``isa`` (a name as ``microkernels.isa`` spells it); an ISA
    without one plans with the generic record."""
    return RECORDS.get(isa, GENERIC)
