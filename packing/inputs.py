"""Input-tile packing, done on the fly inside the compiled loop nest.

A packed input tile holds, for each (c, r, s) of a channel tile, the ``nwin`` window values the
micro-kernel loads as vectors. Windows are flattened over the output plane (window j of a tile
starting at p0 is output position p0 + j, row (p0 + j) // Q, column (p0 + j) % Q), so a tile can
span several output rows. Zero padding is produced here: out-of-image taps and windows past the
end of the plane are written as zeros, and the input is never copied whole (the slab filler
below copies the rows an output band reads of one channel tile at a time).

The tile is filled by runs of windows that share an output row: for a fixed (c, r, s) a run reads
one input row at stride ``sw``, and vector row copies (``copy_rows``) move the whole run,
masking the taps that fall in the padding. The in-row lanes of a run depend on (r, s) only, so
they are computed once for all channels; per (c, r, s) only two addresses change. Where
``copy_taps`` serves (``tile_copiers``: strides up to 2, no dilation, 2 <= S <= its widest), it
reads each input row of the run once and makes all S taps from it with shuffles.

The row copies are generated functions (``microkernels.row_copy``) called through their
addresses, so the packer compiles once per dtype, whatever the tile width.
"""
from numba import njit

from microkernels import row_copy
from microkernels.jit import native_function
from microkernels.numba_bridge import caller

call_copy_rows = caller(row_copy.FUNCTION_TYPE)
call_copy_taps = caller(row_copy.TAP_FUNCTION_TYPE)


def row_copier(kspec, width):
    """The address of ``copy_rows`` for ``width``-wide rows in ``kspec``'s dtype and vectors."""
    return native_function(row_copy.define_row_copy, kspec, width).address


def tile_copiers(kspec, nwin, width, stride, dilation):
    """(copy_rows, copy_taps) addresses for ``pack_input_tile`` with ``nwin``-window tiles in
    kernel ``kspec``'s dtype and vectors, for filters ``width`` taps wide at ``stride`` and
    ``dilation`` along rows; copy_taps is 0 where it cannot serve
    (``microkernels.row_copy.tap_limits``), and then is not compiled."""
    widest, max_stride = row_copy.tap_limits(kspec)
    taps = dilation == 1 and stride <= max_stride and 2 <= width <= widest
    return (row_copier(kspec, nwin),
            native_function(row_copy.define_tap_copy, kspec, nwin).address if taps else 0)


@njit(nogil=True)
def pack_input_tile(x, n, c_first, nc, p0, nwin_used, geom, dst_addr, nwin, copy_rows, copy_taps):
    """Pack windows p0 .. p0+nwin_used-1 of image ``n``, channels c_first .. c_first+nc-1 of
    the 4-D C-contiguous input ``x`` into the nc*R*S*nwin values at address ``dst_addr``
    (``nwin``-window tiles), moving rows with the ``copy_rows(dst, dst_step, src, src_step,
    count, stride, j0, j1, lo, hi)`` at address ``copy_rows`` and, unless ``copy_taps`` is 0,
    whole filter rows with ``copy_taps(dst, dst_step, tap_step, src, src_step, count, taps,
    stride, j0, j1, end, lo, hi)`` (see ``tile_copiers``); ``geom`` starts with (R, S,
    stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, Q)."""
    R, S, sh, sw, dh, dw, pt, pl, Q = (geom[0], geom[1], geom[2], geom[3], geom[4], geom[5],
                                       geom[6], geom[7], geom[8])
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    item = x.itemsize
    x_addr = x.ctypes.data
    j = 0
    while j < nwin_used:
        oh, ow0 = (p0 + j) // Q, (p0 + j) % Q
        j1 = j + min(Q - ow0, nwin_used - j)
        # the last run also zeroes the tail, the first stores whole vectors (unmasked) past
        # its windows: the next runs overwrite those lanes
        store_end = nwin if j1 == nwin_used or j == 0 else j1
        for r in range(R):
            ih = oh * sh - pt + r * dh
            row0 = ((n * C + c_first) * H + ih) * W   # row ih of channel c_first
            if copy_taps:
                col0 = (ow0 - j) * sw - pl              # input column lane 0 of tap 0 reads
                lo, hi = (-col0, W - col0) if 0 <= ih < H else (0, 0)
                call_copy_taps(copy_taps, dst_addr + r * S * nwin * item, R * S * nwin * item,
                               nwin * item, x_addr + (row0 + col0) * item, H * W * item, nc, S,
                               sw, j, j1, store_end, lo, hi)
                continue
            for s in range(S):
                col0 = (ow0 - j) * sw - pl + s * dw    # input column lane 0 would read
                lo, hi = j, j                           # lanes reading inside the row
                if 0 <= ih < H:
                    if col0 + j * sw >= 0 and col0 + (j1 - 1) * sw < W:
                        hi = j1                             # interior run: no division
                    else:
                        lo = max(j, (-col0 + sw - 1) // sw)
                        hi = max(lo, min(j1, (W - col0 + sw - 1) // sw))
                # the same lanes in every channel: one call copies the tap for all nc
                call_copy_rows(copy_rows, dst_addr + (r * S + s) * nwin * item,
                               R * S * nwin * item, x_addr + (row0 + col0) * item, H * W * item,
                               nc, sw, j, store_end, lo, hi)
        j = j1


@njit(nogil=True)
def fill_slab(x, n, c_first, nc, sh, sw, Hb, Ws, row0, rows, pt, pl, planes, dst_addr, run,
              copy_rows):
    """Channels c_first .. c_first+nc-1 of image ``n`` of the 4-D C-contiguous input ``x`` written
    at ``dst_addr`` as the slab a slab micro-kernel reads in place: per channel, sh*sw phase
    planes of Hb x Ws holding rows row0 .. row0+rows-1 (rows <= Hb) of the full planes, whose
    plane (a, b) row i column j holds the input at row sh*i + a - pt, column sw*j + b - pl, or
    zero outside it (see ``csa.plan.slab_shape``); only the planes in the bit mask ``planes``
    (bit a*sw + b; -1: all) are filled. Each input value is read once per fill. ``run``-wide
    runs of a plane row move per call of the ``copy_rows`` at address ``copy_rows`` (see
    ``row_copier``), for all nc channels, or, when there are more rows than channels, down all
    the rows of a channel (a call costs about as much as a few vectors moved: 1 to 4 channels
    of 128 x 128 planes filled 3-4x faster so)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    item = x.itemsize
    src_plane = x.ctypes.data + (n * C + c_first) * H * W * item
    channel_bytes = sh * sw * Hb * Ws * item
    for a in range(sh):
        # the plane rows on input rows: i_lo <= i < i_hi (the others are zero padding)
        first = sh * row0 + a - pt                  # input row of plane row 0
        i_lo = min(rows, max(0, (-first + sh - 1) // sh))
        i_hi = max(i_lo, min(rows, (H - first + sh - 1) // sh))
        for b in range(sw):
            if planes != -1 and not planes >> (a * sw + b) & 1:
                continue
            plane = dst_addr + (a * sw + b) * Hb * Ws * item
            for j0 in range(0, Ws, run):
                col = sw * j0 + b - pl                  # input column of lane 0
                lo = min(run, max(0, (-col + sw - 1) // sw))   # lanes on input columns
                hi = max(lo, min(run, (W - col + sw - 1) // sw))
                j1 = min(run, Ws - j0)
                src = src_plane + (first * W + col) * item
                dst = plane + j0 * item
                if nc >= rows:   # one call per row, down the channels
                    for i in range(rows):
                        inside = i_lo <= i < i_hi
                        call_copy_rows(copy_rows, dst + i * Ws * item, channel_bytes,
                                       src + i * sh * W * item, H * W * item, nc, sw, 0, j1,
                                       lo if inside else 0, hi if inside else 0)
                    continue
                for ch in range(nc):   # per channel, down the rows (padding rows zeroed)
                    at = dst + ch * channel_bytes
                    if i_lo:
                        call_copy_rows(copy_rows, at, Ws * item, src, 0, i_lo, sw, 0, j1, 0, 0)
                    call_copy_rows(copy_rows, at + i_lo * Ws * item, Ws * item,
                                   src + (ch * H * W + i_lo * sh * W) * item, sh * W * item,
                                   i_hi - i_lo, sw, 0, j1, lo, hi)
                    if rows > i_hi:
                        call_copy_rows(copy_rows, at + i_hi * Ws * item, Ws * item, src, 0,
                                       rows - i_hi, sw, 0, j1, 0, 0)
