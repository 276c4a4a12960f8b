"""Register blocking: the micro-tile (windows x filters per kernel call) and its orientation's
tile shapes, chosen among the tiles the register-blocking model (``csa.tuning``) or the host's
calibration finds fastest."""
from math import ceil

from .layout import balanced_row_windows
from .spec import ConvSpec


TILE_VECTORS = 2   # vector rows of a tile: two (little lane waste on small planes; a third
                   # adds no speed where two reach the peak)
# the kernel variants (KernelSpec.variant) each orientation runs: windows in vectors packed or
# read from a slab, filters in vectors packed, direct (windows broadcast from a slab)
WINDOW_VARIANTS, FILTER_VARIANTS, DIRECT_VARIANTS = ("packed", "slab"), ("packed",), ("direct",)


def microtile(machine, itemsize):
    """(Nwin, Nf) with windows in vectors: TILE_VECTORS vectors of windows by Nf filters, Nf
    among the counts the register-blocking model (``csa.tuning``) finds fastest for the
    machine's core: the largest multiple of 8 among them when there is one (filter counts in
    real networks are multiples of 8: no padded rows), else the largest (fewest loads per FMA).
    AVX-512: 8 x 32 floats; AVX2: 6 x 16."""
    counts = machine.tuning.broadcast_counts(machine.vector_registers, TILE_VECTORS,
                                             WINDOW_VARIANTS)
    nf = max((b for b in counts if b % 8 == 0), default=max(counts))
    return TILE_VECTORS * machine.vector_bytes // itemsize, nf


def filter_vector_tile(machine, itemsize, positions=49, filter_bytes=0, packing=None):
    """(windows, filters) when filters are the vector dimension: TILE_VECTORS filter vectors
    by the window count, among those the model finds fastest, that covers the output plane's
    ``positions`` fastest (``fastest_windows``, the record's ``filter_windows``: tiles of more
    windows load fewer filter vectors per FMA, a plane that is not a multiple of the count
    pads its last tile; ``packing``, where given, the cost of copying a count's tiles, in
    positions: ``csa.variants.packing_positions``). AVX-512: 7 x 32 floats on a 7x7 plane,
    14 x 32 on 14x14 and larger multiples of 7, 8 x 32 on 4x4, 12 x 32 on 6x6 and 12x12, 9 x 32 on 9x9, 10 x 32 on 10x10;
    AVX2: 5 x 16 on a 7x7 plane, 6 x 16 on 14x14 and larger. A single-pixel plane is a
    matrix-vector product whose weights stream through once: 1 window by up to four vectors
    (AVX-512: 1 x 64), but TILE_VECTORS where its ``filter_bytes`` are more than L2 holds:
    there the stream, not the FMAs' latency, sets its speed (4096 x 25088 from memory:
    0.95-1.04x with 1 x 32, Xeon), and its filters, packed for the plans of a few pixels (a
    classifier's batch of 8), are held once."""
    lanes, registers = machine.vector_bytes // itemsize, machine.vector_registers
    if positions == 1:
        vectors = TILE_VECTORS if filter_bytes > machine.l2 else 4
        return 1, max(1, min(vectors, (registers - 1) // 2)) * lanes
    tuning = machine.tuning
    counts = tuning.broadcast_counts(registers, TILE_VECTORS, FILTER_VARIANTS)
    return fastest_windows(positions, counts, tuning.filter_windows, packing), TILE_VECTORS * lanes


def fastest_windows(positions, counts, measured, packing=None):
    """Of the window counts ``counts`` (the model's or calibration's fastest), the one whose
    tiles cover ``positions`` windows fastest: padded positions over the relative speed the
    record ``measured`` in loop nests ((windows, speed), ...; of the counts it lists, when it
    lists any), plus ``packing(count)`` where given, ties to the larger count. The model
    finds a tile of 8 accumulators (AVX2's 4 x 16) as fast as one of 12; in a loop nest it is
    not (csa/TUNING.md)."""
    speeds = {w: speed for w, speed in measured if w in counts} or counts
    return min(speeds, key=lambda w: (ceil(positions / w) * w / speeds[w]
                                      + (packing(w) if packing else 0), -w))


def direct_windows(spec, machine):
    """Windows per direct tile: of the window counts the model (or calibration) finds fastest,
    the one whose even tiles cover an output row fastest. A row is cut into as many tiles as
    the count makes, each that many windows or one fewer (``csa.layout.balanced_row_windows``:
    32 = 11 + 11 + 10 for a count of 11 to 15; the short ones run a kernel of their own,
    ``cso.lowering.tail_kernel``), at the speed the record's ``direct_windows`` measured for
    their width in loop nests; a width it does not list (any, in a record that measured none)
    counts as the count's tiles padded. Ties to fewer tiles, then to the narrowest count that
    makes them, which is what ``csa.variants.use_direct`` counts a row's tiles padded to.
    AVX-512: 14 wide rows 14, 32 wide 11 (not 7), 48 wide 12, 7 wide 7; AVX2: 14 wide rows 5,
    56 wide 6 (csa/TUNING.md)."""
    tuning = machine.tuning
    counts = tuning.broadcast_counts(machine.vector_registers, TILE_VECTORS, DIRECT_VARIANTS)
    listed = {w: speed for w, speed in tuning.direct_windows if w in counts}
    speeds = listed or counts

    def row_time(w):
        even = balanced_row_windows(spec.q, w)
        return spec.q / listed[even] if even in listed else ceil(spec.q / w) * w / speeds[w]

    return min(speeds, key=lambda w: (row_time(w), ceil(spec.q / w), w))


BLOCKED_TILE_VECTORS = (1, 2, 3)   # vectors of filters a blocked plan's tile may take


def blocked_tile(spec, machine):
    """(windows, filters) per tile of a blocked plan: of one, two (the direct tile) or three
    vectors of filters, the one whose speed in the model (or calibration) times the share of
    its lanes a group's filters use is the highest, ties to more vectors: 24 filters on AVX2
    in one tile of three vectors by 4 windows, not two of two vectors (the second half zeros);
    a group of 8 (RegNet's) in one vector by 14 windows. Its windows cover an output row
    fastest among the counts the model finds fastest for that many vectors."""
    lanes = machine.vector_bytes // spec.itemsize
    k, tuning = spec.k_per_group, machine.tuning
    best, tile = -1.0, None
    for vectors in BLOCKED_TILE_VECTORS:
        if vectors == TILE_VECTORS:
            windows, speed = direct_windows(spec, machine), 1.0
        else:
            counts = tuning.broadcast_counts(machine.vector_registers, vectors, DIRECT_VARIANTS)
            if not counts:
                continue
            windows = fastest_windows(spec.q, counts, ())
            speed = counts[windows]
        nf = vectors * lanes
        score = speed * k / (ceil(k / nf) * nf)
        if score >= best:
            best, tile = score, (windows, nf)
    return tile


CALIBRATION_PLANES = (7, 14, 28, 56, 112)   # output widths (square planes) of real networks


def calibration_candidates(machine):
    """{kernel variant: broadcast counts} a host calibration measures (float32, TILE_VECTORS
    rows): the counts the rules pick from the model for the usual planes, and their
    neighbours, and those the record lists as measured in loop nests (``filter_windows``,
    ``direct_windows``), that fit the registers: a calibration confirms or overturns them."""
    planes = [ConvSpec.parse(f"n1c64h{q}w{q}k64r3s3p1u1") for q in CALIBRATION_PLANES]
    tuning = machine.tuning
    picks = {"packed": {filter_vector_tile(machine, 4, s.p * s.q)[0] for s in planes},
             "slab": {microtile(machine, 4)[1]},
             "direct": {direct_windows(s, machine) for s in planes}}
    picks["packed"] |= picks["slab"]   # windows in vectors runs packed tiles too
    # and the tiles the record measured in loop nests, which other planes pick
    listed = {"packed": tuning.filter_windows, "direct": tuning.direct_windows}
    registers = machine.vector_registers
    fitting = {b for b in range(1, registers)
               if tuning.kernel_efficiency(registers, b, TILE_VECTORS) > 0}
    return {variant: sorted(({b for p in chosen for b in (p - 1, p, p + 1)}
                             | {b for b, _ in listed.get(variant, ())}) & fitting)
            for variant, chosen in picks.items()}
