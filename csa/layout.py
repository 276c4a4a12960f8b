"""Tile and slab geometry: where a plan's window tiles lie (packed, on a padded slab's stride
phase planes, or row-aligned for a direct plan), and what a band of them reads; the same for a
plan on channel-blocked activations (``blocked_*``). Pure functions of
the spec and the tile: the planner uses them before a plan exists, the plans expose them as
properties (``SlicingPlan.slab_shape``, ...) for the lowering."""
from math import ceil


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


def row_tiles(spec, nwin, slab, vectors_along):
    """Window tiles per output row of a direct plan, whose tiles never span two rows (each
    broadcast window is a column of the transposed output); 0 for other plans."""
    return ceil(spec.q / nwin) if slab and vectors_along == "filters" else 0


def balanced_row_windows(q, nwin):
    """Windows per tile of a direct plan whose output rows are ``q`` wide, for tiles of at
    most ``nwin``: as many tiles as ``nwin`` makes, evened out, so that each has that many or
    one fewer (56 = 6 x 6 + 4 x 5, not 9 x 6 + 2): a short tile of 1-3 windows keeps too few
    accumulators to hide the FMA latency (csa/TUNING.md)."""
    return ceil(q / ceil(q / nwin))


def window_tiles(spec, nwin, slab, vectors_along):
    """Window tiles per image and group: P rows of row_tiles for a direct plan, else the
    window positions cut into tiles of ``nwin``."""
    return (spec.p * row_tiles(spec, nwin, slab, vectors_along)
            or ceil(window_positions(spec, slab) / nwin))


def window_units(spec, nwin, slab, vectors_along):
    """What a window split hands out, over all images: output rows for a direct plan (a slab
    band starts on a row), else window tiles."""
    if row_tiles(spec, nwin, slab, vectors_along):
        return spec.n * spec.p
    return spec.n * window_tiles(spec, nwin, slab, vectors_along)


def plain_1x1(spec):
    return (spec.r, spec.s, spec.stride, spec.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def slab_band_rows(spec, nwin, band, row_tiles=0):
    """Rows of each phase plane a band of ``band`` slab tiles reads: the virtual rows its
    windows span, starting anywhere in a row, the filter's reach below them and one more,
    past the plane's end too (zero): the taps of a row's padding columns, and the windows of
    a last tile past the plane's end, reach a row further; a row the band did not fill would
    hold whatever the workspace held (subnormals, say, that slow every FMA on them). For a
    direct plan: the output rows of ``band`` tiles of ``row_tiles`` per row (starting on a
    row when ``band`` is whole rows), and the reach."""
    hs, ws = slab_shape(spec)
    if row_tiles:
        spans = (band - 1 + (row_tiles - 1 if band % row_tiles else 0)) // row_tiles + 1
        return min(hs, spans + hs - spec.p)
    return (band * nwin + ws - 2) // ws + 2 + hs - spec.p


class SlabGeometry:
    """What a plan's slab looks like (both plans read their input from slabs): mixed into
    the plans, for the lowering."""

    @property
    def slab_shape(self):
        return slab_shape(self.spec)

    @property
    def slab_planes(self):
        return slab_planes(self.spec)


# activation layouts a plan reads and writes: NCHW, or channel-blocked (NCHWc: N x ceil(C/L) x
# H x W x L, L channels per block, the plan's vector lanes; ``cso.layouts``), or the blocked
# plan on channels last (NHWC: each pixel's channels a run of blocks): a slicing plan as on
# blocks, a depthwise plan with its band sized for whole pixels (``csa.depthwise``)
LAYOUTS = ("nchw", "blocked", "nhwc")


def blocked_fits(spec, lanes):
    """Whether ``spec`` runs on channel-blocked activations of ``lanes`` channels a block:
    every group's channels and filters start on a block (one group, or whole blocks per
    group), or it is depthwise with one filter per channel (a lane per channel). A group of
    one channel is planned as depthwise (``csa.analyze``), so one channel with several
    filters, a single-channel image's first layer included, does not fit: the blocked
    depthwise plan has a filter a lane."""
    if spec.c_per_group == 1:
        return spec.k_per_group == 1
    return spec.groups == 1 or (spec.c_per_group % lanes == 0 and spec.k_per_group % lanes == 0)


MERGED_GROUPS_MAX = 4   # groups a block at most: the merged filters' zeros cost (m-1)/m of the FMAs


def merged_groups(spec, lanes):
    """How many consecutive groups of ``spec`` a blocked plan runs as one group (m), their
    filters zero on the other groups' channels, where a group's channels and filters are a
    part of a block (8 on blocks of 16): the fewest groups that fill whole blocks, at most
    ``MERGED_GROUPS_MAX``. The groups come in whole merges, or, where a group has as many
    filters as channels (its merges' blocks in and out the same), the last merge is padded
    with zero groups (``padded_groups``). 1 where none is merged: a convolution
    ``blocked_fits``, a 1x1 (its FMAs are all it has: every zero costs one), groups that do
    not divide a block, or too few channels a group."""
    if (spec.groups == 1 or spec.r * spec.s == 1 or blocked_fits(spec, lanes)
            or lanes % spec.c_per_group or lanes % spec.k_per_group):
        return 1
    m = lanes // min(spec.c_per_group, spec.k_per_group)
    whole = spec.groups % m == 0 or spec.c_per_group == spec.k_per_group
    return m if m <= MERGED_GROUPS_MAX and whole else 1


def padded_groups(spec, m):
    """Zero groups that pad ``spec``'s last merge of ``m`` groups (``merged_groups``): the
    merged convolution's extra channels and filters are the padding lanes of the last
    block, in and out."""
    return -spec.groups % m


def reads_in_place(spec):
    """A blocked plan reads its windows from the input's blocks themselves when the
    convolution has no padding (every tap of every window inside), else from a slab: the
    band's rows copied, zero-padded (``blocked_slab_shape``). Not a strided 1x1 either: its
    windows, every other block of every other row, would use half of each line read; its
    slab holds them alone (``subsampled``)."""
    return spec.padding == (0, 0, 0, 0) and not subsampled(spec)


def subsampled(spec):
    """A 1x1 with a stride and no padding: its blocked slab holds the pixels its windows read
    and no others (P x Q, a window a block), read as a stride-1 1x1's."""
    return (spec.r, spec.s, spec.padding) == (1, 1, (0, 0, 0, 0)) and spec.stride != (1, 1)


def _slab_strides(spec, subsample):
    """The strides and dilations of a blocked slab's geometry: a subsampled 1x1's slab, where
    the plan ``subsample``s, is read as a stride-1 1x1's."""
    return ((1, 1), (1, 1)) if subsample and subsampled(spec) else (spec.stride, spec.dilation)


def blocked_slab_shape(spec, subsample=True):
    """(rows, columns) of the zero-padded input a blocked plan's windows reach, each column a
    block (no stride phases: window j of a row is j*stride blocks along); a subsampled 1x1's
    windows alone where the plan ``subsample``s (a slicing plan's; a depthwise plan's kernel
    steps the stride along the rows of its slab)."""
    (sh, sw), (dh, dw) = _slab_strides(spec, subsample)
    return (spec.p - 1) * sh + dh * (spec.r - 1) + 1, (spec.q - 1) * sw + dw * (spec.s - 1) + 1


def blocked_band_rows(spec, band, row_tiles, subsample=True):
    """Slab rows a blocked band of ``band`` window tiles (whole output rows of ``row_tiles``)
    reads: its output rows' taps (``subsample``: as ``blocked_slab_shape``)."""
    rows = -(-band // row_tiles)
    (sh, _), (dh, _) = _slab_strides(spec, subsample)
    return min(blocked_slab_shape(spec, subsample)[0], (rows - 1) * sh + dh * (spec.r - 1) + 1)


def block_channel_tile(nc, lanes, c_per_group):
    """A blocked plan's channel tile: ``nc`` rounded down to whole blocks (at least one),
    so that every tile starts on a block; all channels when ``nc`` covers them."""
    return c_per_group if nc >= c_per_group else max(lanes, nc - nc % lanes)


MERGED_ROW_WINDOWS = 24   # a blocked 1x1's rows are merged up to at least this many windows


def merged_rows(spec, windows=MERGED_ROW_WINDOWS):
    """Output rows a blocked plan of a plain 1x1 (stride 1, no padding) runs as one row: its
    plane is a matrix of pixels, whatever its rows, and tiles along a row of 7 or 14 windows
    are short (4 + 3, 5 + 5 + 4: fewer accumulators, a kernel of their own). The fewest
    rows dividing P that make a row of at least ``windows`` (7 x 7: one row of 49; 14 x 14:
    rows of 28); 1 for other convolutions."""
    if not plain_1x1(spec):
        return 1
    return next((m for m in range(1, spec.p + 1) if spec.p % m == 0 and spec.q * m >= windows),
                spec.p)
