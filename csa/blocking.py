"""Cache blocking and its cost model: the channel tile Nc (L1), the K2 / K3 blocks of tiles
(L2 / L3) of each schedule, and the cache-line loads each costs.

Symbols (after SConv, Ferrari et al., ACM TACO 2023): C_g = channels per group, K_g = filters per
group, R x S filter, P x Q output, ds bytes per element, micro-tile Nwin windows x Nf filters.
Footprints of packed tiles: |IN| = Nwin*R*S*Nc*ds, |W| = Nf*R*S*Nc*ds, |OUT| = Nwin*Nf*ds.
"""
from math import ceil

SCHEDULES = ("IS", "WS")
CACHE_FILL = 0.9  # fraction of each cache level a tile set may occupy
OUTPUT_BAND_FILL = 0.25  # share of L2 a band's partial outputs may take (the rest: filters,
                         # slab rows or packed tiles, the input streaming in)
DIRECT_MIN_BAND = 32     # window tiles per band of a direct plan, at least (``bands.output_band``)


def tile_footprints(spec, nwin, nf, nc):
    ds, rs = spec.itemsize, spec.r * spec.s
    return nwin * rs * nc * ds, nf * rs * nc * ds, nwin * nf * ds


def channel_tile(spec, nwin, nf, l1d, filters_streamed=False):
    """Nc: the fewest channel tiles with Nc*(Nwin+Nf)*R*S*ds + Nwin*Nf*ds <= 0.9*L1 (at least 1
    channel each), split evenly: a short last tile would cost a whole pass over the partial
    outputs for a few channels (csa/TUNING.md, "Plan rules"). With ``filters_streamed`` the
    window tile alone (Nc*Nwin*R*S*ds): its filter tile streams from L2, as a direct plan's
    does, where each channel tile's pass over partial outputs that overflow L2 costs more
    (``streams_1x1_filters``)."""
    ds, rs = spec.itemsize, spec.r * spec.s
    room = CACHE_FILL * l1d - nwin * nf * ds
    return even_channel_tile(spec, room // ((nwin + (0 if filters_streamed else nf)) * rs * ds))


EXPANSION = 2   # filters per channel from which a 1x1 streams its filter tile (below)


def streams_1x1_filters(spec, nwin, machine):
    """Whether a packed plan with filters in vectors is a 1x1 that expands (at least
    EXPANSION filters a channel: inverted bottlenecks, MLPs) whose transposed output, all of
    it in one band (``bands.output_band``), holds more than a band's share of L2
    (``band_fits_l2``): each channel tile then reads and writes it from L3, and fewer channel
    tiles, their filter tile streamed from L2, ran 0.89-0.97x the time at 1 thread and
    0.94-1.01x at 2. 1x1s of fewer filters and larger filters (3x3s, 2x2s) gained at 1 thread
    only, and lost up to 9% at 2, where each thread's part of the output fits its L2
    (csa/TUNING.md, "Filters-in-vectors channel tiles past L2")."""
    return (spec.r == spec.s == 1 and spec.k_per_group >= EXPANSION * spec.c_per_group
            and not band_fits_l2(spec, nwin, ceil(spec.p * spec.q / nwin), machine))


def even_channel_tile(spec, largest):
    """The channels of the fewest tiles of at most ``largest`` (at least 1), split evenly."""
    largest = int(min(spec.c_per_group, max(1, largest)))
    return ceil(spec.c_per_group / ceil(spec.c_per_group / largest))


DIRECT_FILTER_FILL = 0.25   # share of L2 a direct plan's filter tile may take
# ... and of L1, where its window tiles read it from there (``filters_in_l1``)
DIRECT_L1_FILTER_FILL = 0.5


def streams_filters(nwin, machine):
    """Whether a blocked direct tile of ``nwin`` windows keeps up with its filter tile
    streamed from L2: its FMAs on a row of the tile (``nwin`` a vector, ``fma_pipes`` a cycle)
    take at least the ``machine.stream_l2`` cycles a line of that row's filter vectors.
    AVX-512: 8 windows and more; AVX2: 4. On blocks, the 34 layers of `convbench:100` and
    `grouped:50` with tiles of 5-7 windows (1x1s on planes of up to 35 columns, stride-2
    3x3s) ran 1.08x at 1 thread and 1.06x at 2 with the filter tile in L1 (Xeon)
    (csa/TUNING.md, "Direct channel tiles on blocks")."""
    return (nwin / machine.tuning.fma_pipes
            >= machine.stream_l2 * machine.vector_bytes / machine.line)


def filters_in_l1(spec, nwin, machine, blocked):
    """Whether a direct plan of tiles of ``nwin`` windows keeps its filter tile within
    DIRECT_L1_FILTER_FILL of L1 rather than streaming it from L2 for each window tile. On
    blocks (``blocked``), where its tiles are too few windows to stream it
    (``streams_filters``) and more than one tile reads it. On NCHW planes, where an image's
    output rows hold at least ``tuning.direct_l1_filter_tiles`` window tiles and the partial
    outputs of its smallest band fit their share of L2 (``band_fits_l2``): each extra channel
    tile passes over them again, from L3 where they overflow. On 80 timm 3x3s so planned,
    1.033x at 1 thread (0.97-1.12x); planes of 7 x 7 to 14 x 14 (7-14 tiles) ran 0.95-1.03x,
    bands overflowing L2 0.93-1.07x (csa/TUNING.md, "NCHW direct filter tiles in L1")."""
    if blocked:
        return spec.n * spec.p * spec.q > nwin and not streams_filters(nwin, machine)
    tiles, image_tiles = machine.tuning.direct_l1_filter_tiles, spec.p * ceil(spec.q / nwin)
    return (bool(tiles) and image_tiles >= tiles
            and band_fits_l2(spec, nwin, min(DIRECT_MIN_BAND, image_tiles), machine))


def direct_channel_tile(spec, nf, machine, nwin=None, blocked=False):
    """Nc of a direct plan, before its band: the fewest channel tiles with
    Nf*R*S*Nc*ds <= DIRECT_FILTER_FILL*L2, split evenly (its filter tile streams from L2, and
    fewer channel tiles read the partial outputs less often), or <= DIRECT_L1_FILTER_FILL*L1
    where its tiles of ``nwin`` windows (on blocks if ``blocked``) read it from L1
    (``filters_in_l1``; not known without ``nwin``). ``bands.direct_band_channel_tile`` cuts
    it to the band's L2."""
    filter_row = nf * spec.r * spec.s * spec.itemsize   # one channel's share of the tile
    room = (DIRECT_L1_FILTER_FILL * machine.l1d
            if nwin is not None and filters_in_l1(spec, nwin, machine, blocked)
            else DIRECT_FILTER_FILL * machine.l2)
    return even_channel_tile(spec, room // filter_row)


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


def schedule_costs(spec, machine, nwin, nf, nc, k2, k3, schedule, vectors_along="windows",
                   band=None):
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
    page apart outrun the prefetchers and the TLB (csa/TUNING.md), so then every output line
    written costs an L3 latency more. With filters in vectors consecutive calls write
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
    if schedule == "IS" and vectors_along == "windows":
        stat, strm, t_stat, t_strm = in_lines, w_lines, t_in, t_w
        strm_block, stat_block = k2, k3
    else:
        # filter-stationary terms: IS with filters in vectors keeps the filter tile in L1 while
        # its K3 window tiles stream past (from L3 when they overflow L2). WS with windows in
        # vectors runs filter tiles innermost too (lowering), but its K2 window block is modelled
        # filter-stationary, an approximation checked with python -m bench --schedules
        # (csa/TUNING.md)
        stat, strm, t_stat, t_strm = w_lines, in_lines, t_w, t_in
        strm_block, stat_block = (k2, k3) if schedule == "WS" else (k3, k2)
    stat_from_l3 = t_stat * ceil(t_strm / strm_block) * stat
    strm_from_l3 = ceil(t_stat / stat_block) * t_strm * strm
    strm_in_l2 = strm_block * strm * line / t_c <= CACHE_FILL * machine.l2   # one channel tile's
    out_lines = spec.k_per_group * spec.p * spec.q * ds / line
    band = band or t_in
    out_latency = (machine.latency_l2 if band_fits_l2(spec, nwin, band, machine) else
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
            spec, nwin, nf, k2, schedule, vectors_along, machine),
    }
    terms = {k: v * images for k, v in terms.items()}
    terms["total"] = sum(terms.values())
    return terms


def band_fits_l2(spec, nwin, band, machine):
    """A band's partial outputs (``band`` window tiles x K_g filters) fit the share of L2
    ``bands.output_band`` sizes them for."""
    share = OUTPUT_BAND_FILL * CACHE_FILL * machine.l2
    return band * nwin * spec.k_per_group * spec.itemsize <= share


OUTPUT_STREAMS = 16  # output rows written in turn that the hardware still follows
PAGE = 4096


def _scattered_output(spec, nwin, nf, k2, schedule, vectors_along, machine):
    """1 when the calls of a block write more than OUTPUT_STREAMS C rows a page or more apart
    (see schedule_costs), else 0."""
    if vectors_along == "filters":
        return 0   # consecutive calls write consecutive windows' rows of the transposed output
    rows = k2 * nf if schedule == "IS" else nf
    return int(rows > OUTPUT_STREAMS and spec.p * spec.q * spec.itemsize >= PAGE)
