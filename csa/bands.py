"""Output bands and the workspace they need: the window tiles whose partial outputs stay in L2
from one channel tile to the next, capped so that a call's workspace is bounded by its tiles."""
from .blocking import CACHE_FILL, DIRECT_MIN_BAND, OUTPUT_BAND_FILL, even_channel_tile
from .layout import row_tiles as tiles_per_row, slab_band_rows, slab_shape


def output_band(spec, nwin, nc, window_tiles, vectors_along, machine, row_tiles=0):
    """Window tiles per output band: the loop nest runs the channel tiles band by band, so that
    a band's partial outputs (its window tiles x K_g filters) stay in L2 from one channel tile
    to the next instead of going to L3 and back, at the price of reading the filters again for
    every band (``analyze`` keeps bands where the cost model finds them cheaper). One band
    when there is a single channel tile, and with filters in vectors on packed tiles (small
    planes, whose transposed output is accumulated apart).

    A direct plan is banded even with one channel tile, since each band transposes its own
    output while hot in L2, in whole output rows (``row_tiles`` window tiles each), and of at
    least DIRECT_MIN_BAND tiles, since a band reads every filter tile from L3 again
    (csa/TUNING.md, "Plan rules"). A group's transposed output is passed into the planes
    after its tiles, before the next group's run."""
    if not row_tiles and (vectors_along == "filters" or nc >= spec.c_per_group):
        return window_tiles
    per_tile = nwin * spec.k_per_group * spec.itemsize
    band = int(max(1, OUTPUT_BAND_FILL * CACHE_FILL * machine.l2 // per_tile))
    if row_tiles:
        band = max(band, DIRECT_MIN_BAND)
        band = max(row_tiles, band - band % row_tiles)
    return min(window_tiles, band)


def band_buffers(spec, nwin, nc, band, slab, vectors_along, row_tiles=0):
    """(slab, transposed output) elements a band needs beside its tiles: the slab of its rows
    (``nc`` channels' phase planes), and with filters in vectors its transposed output (the
    band's windows x K_g: one group's at a time)."""
    slab_elements = out_t_elements = 0
    if slab:
        sh, sw = spec.stride
        slab_elements = (nc * sh * sw * slab_band_rows(spec, nwin, band, row_tiles)
                         * slab_shape(spec)[1])
    if vectors_along == "filters":
        out_t_elements = min(spec.p * spec.q, band * nwin) * spec.k_per_group
    return slab_elements, out_t_elements


def direct_l2_set(spec, nwin, nf, nc, band, row_tiles):
    """Bytes a direct plan's kernel calls keep in L2 within a band: the filter tile they
    stream, the channel tile's slab rows they broadcast from, and the band's transposed partial
    outputs of one group (its windows x K_g: every call adds to a part of them)."""
    per_channel, outputs = _direct_l2_terms(spec, nwin, nf, band, row_tiles)
    return nc * per_channel + outputs


def _direct_l2_terms(spec, nwin, nf, band, row_tiles):
    """(bytes per channel of the tile, bytes of the partial outputs) of ``direct_l2_set``."""
    slab_row, out_t = band_buffers(spec, nwin, 1, band, True, "filters", row_tiles)
    return (nf * spec.r * spec.s + slab_row) * spec.itemsize, out_t * spec.itemsize


def direct_band_channel_tile(spec, nwin, nf, nc, band, row_tiles, machine):
    """A direct plan's Nc, cut from ``nc`` (``blocking.direct_channel_tile``) into the fewest
    even tiles whose ``direct_l2_set`` fits CACHE_FILL*L2: past it the calls' filters, slab rows
    and partial outputs evict each other (csa/TUNING.md, "Plan rules"). Not where the partial
    outputs leave room only for calls shallower than ``tuning.direct_min_depth`` rows, whose
    C tile would cost more than L2 saves: there ``nc`` stays."""
    per_channel, outputs = _direct_l2_terms(spec, nwin, nf, band, row_tiles)
    fit = int((CACHE_FILL * machine.l2 - outputs) // per_channel)
    if fit * spec.r * spec.s < machine.tuning.direct_min_depth:
        return nc
    return min(nc, even_channel_tile(spec, fit))


def band_workspace(spec, nwin, nc, band, slab, vectors_along, row_tiles=0):
    """Bytes of ``band_buffers``."""
    return sum(band_buffers(spec, nwin, nc, band, slab, vectors_along, row_tiles)) * spec.itemsize


def workspace_band_cap(spec, nwin, nc, slab, vectors_along, window_tiles, budget, row_tiles=0):
    """The most window tiles a band may hold for ``band_workspace`` to stay within ``budget``
    bytes (a thread's share of L3: larger bands would not stay in cache anyway), so that a
    call's workspace is bounded by its tiles, not by the input size; at least one tile (direct:
    one output row)."""
    step = row_tiles or 1   # direct bands are whole output rows
    lo, hi = 1, -(-window_tiles // step)
    while lo < hi:   # the workspace grows with the band: the largest count within the budget
        mid = (lo + hi + 1) // 2
        if band_workspace(spec, nwin, nc, mid * step, slab, vectors_along, row_tiles) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return min(window_tiles, lo * step)


def slab_within(spec, nwin, nc, vectors_along, budget):
    """The slab of the smallest band (one window tile, or one output row of a direct plan)
    fits ``budget`` bytes: not so for planes of hundreds of thousands of columns, whose
    tiles are packed instead."""
    per_row = tiles_per_row(spec, nwin, True, vectors_along)
    return band_workspace(spec, nwin, nc, per_row or 1, True, "windows", per_row) <= budget
