"""The kernel variant a convolution runs: vectors along the windows or the filters, window
tiles packed, read in place from a padded slab, or broadcast from it (direct), or the input read
unpacked (plain 1x1s)."""
from math import ceil, gcd

from .blocking import CACHE_FILL, PAGE, tile_footprints
from .layout import plain_1x1, slab_shape
from .register_blocking import blocked_tile

DIRECT_WASTE = 0.1   # padded work a direct plan may add (row-aligned tiles, filter tiles)
# the largest stride whose taps the packer makes by shuffles from one read of each input row
# (``microkernels.row_copy.TAP_STRIDES``); past it, each tap of each window is copied alone
SHUFFLED_TAPS_MAX_STRIDE = 2


def use_direct(spec, nwin, nf, tuning, lanes):
    """Filters in vectors and the input windows broadcast in place from a padded slab (the
    direct convolution MLAS runs on NCHWc): no window tile is packed. For stride-1
    convolutions a slab applies to (not unpadded 1x1s) with at least
    ``tuning.direct_min_depth`` rows per kernel call (shallower calls spend too much on C's
    tile; ``tuning.direct_one_tile_min_depth`` where a group's filters fit one tile), whose
    row-aligned window tiles and filter tiles waste at most DIRECT_WASTE of the
    work. A row is cut into even tiles (``balanced_row_windows``); one that splits into tiles
    of one width of at least ``tuning.direct_min_row_windows`` wastes nothing (10x10 and 12x12
    planes, one tile a row, whose packed tiles waste lanes or cost their packing; rows of 24
    and 36 as tiles of 12), at stride 1 a row of one tile from
    ``tuning.direct_row_tile_min_windows`` (8x8 planes, whose filters dominate: the direct plan
    prefetches them), others count padded to ``nwin`` a tile (``direct_windows``' narrowest
    count for as many tiles: 32 = 11 + 11 + 10 as 3 x 11); filter tiles count the lanes
    they compute (``filter_lanes``, of ``lanes`` a vector). Other strides are left to
    the packed plans: their taps read R*S runs per channel from the stride's phase planes and
    overflow L1; but not where an output row is one such even tile (10-14 windows) and the
    windows overlap (a 3x3 at stride 2), whose packed tiles copy each value several times;
    and not at strides past SHUFFLED_TAPS_MAX_STRIDE with overlapping windows and at most half
    as many filters as a window reads values (C*R*S; stems such as 7x7 at stride 4 and 16x16
    at stride 8 over 3 channels), with up to twice DIRECT_WASTE of padded work: there the packer
    copies every tap of every window alone, a cost a packed tile shares among its few filters,
    while a direct plan's own costs per output (its transposition, a store per call) shrink
    with the depth of its calls (csa/TUNING.md has the measurements)."""
    tiles = ceil(spec.q / nwin)
    least = (tuning.direct_row_tile_min_windows
             if spec.stride == (1, 1) and tiles == 1 and tuning.direct_row_tile_min_windows
             else tuning.direct_min_row_windows)
    even = least and spec.q % tiles == 0 and spec.q // tiles >= least
    row = spec.q if even else tiles * nwin
    padded = spec.p * row * filter_lanes(spec.k_per_group, nf, tail_lanes(nwin, lanes, tuning))
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    overlap = (spec.r - 1) * dh + 1 > sh or (spec.s - 1) * dw + 1 > sw
    depth = spec.c_per_group * spec.r * spec.s
    min_depth = (tuning.direct_one_tile_min_depth
                 if spec.k_per_group <= nf and tuning.direct_one_tile_min_depth
                 else tuning.direct_min_depth)
    deep = ((spec.stride == (1, 1) or even and tiles == 1 and overlap) and depth >= min_depth)
    unshuffled = (max(sh, sw) > SHUFFLED_TAPS_MAX_STRIDE and overlap
                  and 2 * spec.k_per_group <= depth)
    waste = 2 * DIRECT_WASTE if unshuffled else DIRECT_WASTE   # (beside tap-by-tap packing)
    return ((deep or unshuffled) and slab_fits(spec, nwin, "filters")
            and padded <= (1 + waste) * spec.p * spec.q * spec.k_per_group)


GROUPED_CHANNELS = (8, 64)     # channels per group of the grouped rule (grouped_direct)
GROUPED_MIN_LANE_USE = 2 / 3  # of its filter tiles' lanes a group's filters must fill


def grouped_direct(spec, machine):
    """Whether a grouped convolution (2 or more groups of GROUPED_CHANNELS channels) runs
    direct on NCHW, windows broadcast from a slab of each group's channels and filter tiles of
    one, two or three vectors as a blocked plan's (``blocked_tile``: the most lanes a group's
    filters use): stride 1, tiles at least GROUPED_MIN_LANE_USE full, on a plane of at most
    ``tuning.grouped_direct_max_plane`` outputs, or any plane where the filters fill whole
    tiles of at least ``tuning.grouped_direct_whole_vectors`` vectors. A group's few channels
    make shallow calls, which ``use_direct`` leaves to packed tiles; but packing R*S shifted
    copies of each window per group costs more, and 6 or 16 filters a tile leave a group of 8
    a third or half of its lanes idle. Larger planes, stride 2, groups of 4 and of hundreds
    run the other plans as fast or faster (csa/TUNING.md, "Grouped convolutions")."""
    fewest, most = GROUPED_CHANNELS
    if (spec.groups == 1 or not fewest <= spec.c_per_group <= most
            or spec.stride != (1, 1)):
        return False
    nwin, nf = blocked_tile(spec, machine)
    k, tuning = spec.k_per_group, machine.tuning
    lanes = machine.vector_bytes // spec.itemsize
    whole = (k % nf == 0 and tuning.grouped_direct_whole_vectors
             and nf >= tuning.grouped_direct_whole_vectors * lanes)
    return ((spec.p * spec.q <= tuning.grouped_direct_max_plane or whole)
            and k / (ceil(k / nf) * nf) >= GROUPED_MIN_LANE_USE
            and slab_fits(spec, nwin, "filters"))


def padded_work(spec, nwin, nf, lanes=None):
    """Output elements the tiles compute, edge padding included (per image and group); with
    filters in vectors of ``lanes`` (None: whole tiles), their tiles' lanes
    (``filter_lanes``)."""
    filters = (filter_lanes(spec.k_per_group, nf, lanes) if lanes
               else ceil(spec.k_per_group / nf) * nf)
    return ceil(spec.p * spec.q / nwin) * nwin * filters


def filter_lanes(k, nf, lanes):
    """The lanes ``k`` filters (a group's) take in tiles of ``nf`` along vectors of ``lanes``:
    whole tiles, the last one narrowed to the vectors its filters fill (its kernel is a
    narrower one, ``cso.lowering.filter_tail_kernels``: 112 filters in 3 x 32 + 16). Fewer
    filters than a tile count it whole: a group all in the narrower kernel runs at its speed
    (one vector by 14 windows: a load a FMA), which the lanes leave out; plans moved by
    their lanes alone ran up to 1.23x slower (csa/TUNING.md)."""
    if k < nf or not lanes:
        return ceil(k / nf) * nf
    return k // nf * nf + last_tile_lanes(k, nf, lanes)


def last_tile_lanes(k, nf, lanes):
    """The lanes of the vectors ``k`` filters fill in their last, partial tile of ``nf``
    (0 where whole tiles hold them)."""
    return ceil(k % nf / lanes) * lanes


def tail_lanes(nwin, lanes, tuning):
    """``lanes`` where a narrower last filter tile of ``nwin`` windows keeps the FMA pipes
    busy with one vector (a chain per window: at least latency x pipes of them), else None:
    AVX2's 6 windows would wait on their FMAs, and the plans its lanes moved ran 1.05x
    slower there (csa/TUNING.md)."""
    return lanes if nwin >= tuning.fma_latency * tuning.fma_pipes else None


def choose_vector(spec, window_tile, filter_tile, tuning, lanes):
    """Vectors along the windows unless tiles along the filters waste fewer lanes (small output
    planes: 7x7, 14x14, 1x1) by more than their transposing pass costs: the pass over each
    output costs as much as ``tuning.transpose_depth`` more rows of kernel depth, little
    beside hundreds of channels, much beside a few dozen (0: lanes waste alone, with a 5%
    margin). Where windows in vectors would read a plain 1x1's input in place, the packing
    filters in vectors need costs ``tuning.packing_filters`` filters' FMAs a value: much
    beside 16 or 32 filters (SqueezeNet's squeeze layers), little beside hundreds. Packed
    window tiles of filters more than a tap wide add ``tuning.packing_run`` FMA lanes for
    each run they copy (``tile_runs``) per channel and filter row: a tile across several
    short output rows (32 windows on rows of 14) is copied in as many runs."""
    windows = padded_work(spec, *window_tile)
    filters = padded_work(spec, *filter_tile, tail_lanes(filter_tile[0], lanes, tuning))
    depth = spec.c_per_group * spec.r * spec.s
    if tuning.transpose_depth:
        extra = tuning.transpose_depth / depth
        if tuning.packing_filters and reads_input_unpacked(spec, "windows", tuning):
            extra += tuning.packing_filters / spec.k_per_group
        windows += run_lanes(spec, window_tile[0], tuning)
        return "filters" if filters * (1 + extra) < windows else "windows"
    return "filters" if filters < 0.95 * windows else "windows"


def run_lanes(spec, nwin, tuning):
    """What copying the plane's packed ``nwin``-window tiles run by run costs, in FMA lanes
    of a channel and filter row: ``tuning.packing_run`` a run (``tile_runs``), for filters
    more than a tap wide (a run's taps come from one copy: its cost per output is over R*C,
    not R*S*C); 0 where the record weighs no runs."""
    if not tuning.packing_run or spec.s == 1:
        return 0
    return tile_runs(spec, nwin) * tuning.packing_run / spec.s


def packing_positions(spec, tuning, nf):
    """For filters in vectors (``nf`` a tile), the cost of packing the plane's ``nwin``-window
    tiles in output positions, as ``choose_vector`` weighs the windows' tiles (``run_lanes``,
    over the group's filter lanes): tiles of 13 across rows of 8 copy 12 runs, of 8 one a row
    (csa/TUNING.md)."""
    lanes = ceil(spec.k_per_group / nf) * nf
    return lambda nwin: run_lanes(spec, nwin, tuning) / lanes


def tile_runs(spec, nwin):
    """The runs of windows that share an output row in the plane's ``nwin``-window tiles (a
    packed tile is copied run by run): a run a tile, and one more for each row's start inside
    a tile."""
    p, q = spec.p, spec.q
    tiles = ceil(p * q / nwin)
    starts_on_tiles = (p - 1) * q // (q * nwin // gcd(q, nwin))   # at multiples of both
    return tiles + (p - 1) - starts_on_tiles


def reads_input_unpacked(spec, vectors_along, tuning):
    """1x1, stride 1, no padding, windows in vectors: the NCHW input already is the C x (H*W)
    matrix whose rows the kernel loads as vectors, so full window tiles need no packing. Not
    when the plane's size in bytes is a multiple of half a page (32x32, 64x64 planes): a tile's
    rows, one per channel, would then share one or two L1 sets (16x16 planes, four sets, run
    as fast as packed tiles). Not with ``tuning.packed_1x1_filters`` filters or more either:
    every filter tile reuses a packed tile, whose contiguous rows then beat rows a plane apart
    by more than the copy costs; nor with ``packed_1x1_plane_filters`` or more on planes of
    ``packed_1x1_plane_bytes`` or more, whose rows lie pages apart. Not with filters in
    vectors: the windows are broadcast, one input row (channel) per step, and packed they sit
    in L1 (csa/TUNING.md, "Plan rules" and "Plain 1x1s: packed window tiles")."""
    plane_bytes, k = spec.h * spec.w * spec.itemsize, spec.k_per_group
    wide = tuning.packed_1x1_plane_bytes and plane_bytes >= tuning.packed_1x1_plane_bytes
    packs = ((tuning.packed_1x1_filters and k >= tuning.packed_1x1_filters)
             or (wide and k >= tuning.packed_1x1_plane_filters))
    return (vectors_along == "windows" and plain_1x1(spec) and not packs
            and PAGE // gcd(plane_bytes, PAGE) >= 4)


def slab_fits(spec, nwin, vectors_along):
    """A slab applies except to unpadded stride-1 1x1s (their slab would be a plain copy of the
    input, which their tiles read in place or pack, see reads_input_unpacked); with windows in
    vectors only when its rows are at least a tile wide (so a tile spans at most two rows)."""
    return not plain_1x1(spec) and (vectors_along == "filters" or slab_shape(spec)[1] >= nwin)


def slab_footprint(spec, nwin, nc, line):
    """Bytes of a slab a window tile reads: per channel, one run of windows per filter row
    (stride 1: the S taps of a row share it, nwin + dw*(S-1) values) or per tap (other
    strides: taps fall on different phase planes), each a line longer when unaligned and
    doubled when the tile straddles two slab rows (a fraction nwin/Ws of tiles)."""
    sw, dw = spec.stride[1], spec.dilation[1]
    runs, values = (spec.r, nwin + dw * (spec.s - 1)) if sw == 1 else (spec.r * spec.s, nwin)
    straddle = 1 + nwin / slab_shape(spec)[1]
    return nc * runs * straddle * (values * spec.itemsize + line)


def use_slab(spec, nwin, nf, nc, vectors_along, machine):
    """Pad each channel tile into a slab once and let the kernel read it in place, instead of
    packing R*S shifted copies of every window tile, when few filter tiles share each packed
    tile (at most ``tuning.slab_max_filter_tiles``) and the slab rows a tile reads fit in L1
    beside the filter and output tiles. Past that count the packing is shared by enough
    filter tiles, and the slab costs more: its rows, scattered over Nc planes, sit less well in
    L1 than a packed tile, its vector loads are unaligned, and its tiles straddle output rows,
    which costs split, masked stores (csa/TUNING.md has the measurements). A convolution at a
    stride packs its tiles: a slab of its stride phases ran at 0.5-0.94x the speed of packed
    tiles (stems over 3 channels among them), 0.67-1.0x with several groups."""
    _, fw, fout = tile_footprints(spec, nwin, nf, nc)
    return (spec.stride == (1, 1)
            and slab_fits(spec, nwin, vectors_along)
            and ceil(spec.k_per_group / nf) <= machine.tuning.slab_max_filter_tiles
            and slab_footprint(spec, nwin, nc, machine.line) + fw + fout <= CACHE_FILL * machine.l1d)
