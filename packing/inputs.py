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

The packers are generated code (``microkernels.loop_ir``), functions of the loop nest's own
module; the row copies are generated functions (``microkernels.row_copy``) they call through
their addresses, so a packer compiles once per dtype, whatever the tile width.
"""
import ctypes

from microkernels import RowCopySpec, TapCopySpec, row_copy
from microkernels.dtypes import DTYPES, dtype_name
from microkernels.jit import native_function
from microkernels.loop_ir import LoopCode

WINDOW_FIELDS = ("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q")   # a window's geometry
PACK_ARGS = ("x", "C", "H", "W", "n", "c_first", "nc", "p0", "nwin_used", *WINDOW_FIELDS,
             "dst", "nwin", "copy_rows", "copy_taps")
FILL_ARGS = ("src", "src_step", "H", "W", "nc", "sh", "sw", "Hb", "Ws", "row0", "rows", "pt",
             "pl", "planes", "dst", "run", "copy_rows")


def row_copier(kspec, width):
    """The address of ``copy_rows`` for ``width``-wide rows in ``kspec``'s dtype and vectors."""
    return native_function(row_copy.define_row_copy, RowCopySpec(kspec.dtype, width, kspec.isa)).address


def tile_copiers(kspec, nwin, width, stride, dilation):
    """(copy_rows, copy_taps) addresses for ``pack_input_tile`` with ``nwin``-window tiles in
    kernel ``kspec``'s dtype and vectors, for filters ``width`` taps wide at ``stride`` and
    ``dilation`` along rows; copy_taps is 0 where it cannot serve
    (``microkernels.row_copy.tap_limits``), and then is not compiled."""
    widest, max_stride = row_copy.tap_limits(kspec)
    taps = dilation == 1 and stride <= max_stride and 2 <= width <= widest
    return (row_copier(kspec, nwin),
            native_function(row_copy.define_tap_copy, TapCopySpec(kspec.dtype, nwin, kspec.isa)).address
            if taps else 0)


def define_pack_input_tile(module, dtype, internal=True):
    """``pack_input_tile(PACK_ARGS)`` for ``dtype`` ("f32", "f64") in ``module`` (defined
    once): pack windows p0 .. p0+nwin_used-1 of image ``n``, channels c_first ..
    c_first+nc-1 of the C x H x W images at address ``x`` into the nc*R*S*nwin values at
    address ``dst`` (``nwin``-window tiles), moving rows with the ``copy_rows(dst, dst_step,
    src, src_step, count, stride, j0, j1, lo, hi)`` at address ``copy_rows`` and, unless
    ``copy_taps`` is 0, whole filter rows with ``copy_taps(dst, dst_step, tap_step, src,
    src_step, count, taps, stride, j0, j1, end, lo, hi)`` (see ``tile_copiers``). Not
    ``internal``: a function of its own, for calls from Python (``pack_input_tile``)."""
    name = f"pack_input_tile_{dtype}"
    if name in module.globals:
        return module.globals[name]
    code = LoopCode(module, name, PACK_ARGS, internal=internal)
    item = DTYPES[dtype].itemsize
    x, C, H, W, n, c_first, nc, p0, nwin_used = code.args(*PACK_ARGS[:9])
    R, S, sh, sw, dh, dw, pt, pl, Q = code.args(*WINDOW_FIELDS)
    dst, nwin, copy_rows, copy_taps = code.args("dst", "nwin", "copy_rows", "copy_taps")
    j = code.var(0)
    with code.while_(lambda: j < nwin_used):
        oh, ow0 = (p0 + j) // Q, (p0 + j) % Q
        j1 = j + code.min(Q - ow0, nwin_used - j)
        # the last run also zeroes the tail, the first stores whole vectors (unmasked) past
        # its windows: the next runs overwrite those lanes
        store_end = code.choose((j1 == nwin_used) | (j == 0), nwin, j1)
        with code.range(0, R) as r:
            ih = oh * sh - pt + r * dh
            row0 = ((n * C + c_first) * H + ih) * W   # row ih of channel c_first
            inside = (ih >= 0) & (ih < H)
            with code.if_else(copy_taps != 0) as (taps, single):
                with taps:
                    col0 = (ow0 - j) * sw - pl              # input column lane 0 of tap 0 reads
                    code.call((copy_taps, row_copy.TAP_FUNCTION_TYPE),
                              dst + r * S * nwin * item, R * S * nwin * item, nwin * item,
                              x + (row0 + col0) * item, H * W * item, nc, S, sw, j, j1,
                              store_end, code.choose(inside, -col0, 0),
                              code.choose(inside, W - col0, 0))
                with single:
                    with code.range(0, S) as s:
                        _copy_tap(code, item, r, s, row0, inside, ow0, j, j1, store_end)
        j.set(j1)
    code.ret()
    return code.function


def _copy_tap(code, item, r, s, row0, inside, ow0, j, j1, store_end):
    """Tap (r, s) of the run of windows j .. j1-1 (``define_pack_input_tile``), for all nc
    channels in one call: the same lanes in every channel."""
    x, C, H, W, nc, R, S, sw, dw, pl, dst, nwin, copy_rows = code.args(
        "x", "C", "H", "W", "nc", "R", "S", "sw", "dw", "pl", "dst", "nwin", "copy_rows")
    col0 = (ow0 - j) * sw - pl + s * dw    # input column lane 0 would read
    lo, hi = code.var(j), code.var(j)      # lanes reading inside the row
    with code.if_(inside):
        with code.if_else((col0 + j * sw >= 0) & (col0 + (j1 - 1) * sw < W)) as (interior, edge):
            with interior:
                hi.set(j1)                 # no division
            with edge:
                lo.set(code.max(j, (-col0 + sw - 1) // sw))
                hi.set(code.max(lo, code.min(j1, (W - col0 + sw - 1) // sw)))
    code.call((copy_rows, row_copy.FUNCTION_TYPE), dst + (r * S + s) * nwin * item,
              R * S * nwin * item, x + (row0 + col0) * item, H * W * item, nc, sw, j,
              store_end, lo, hi)


def define_fill_slab(module, dtype):
    """``fill_slab(FILL_ARGS)`` for ``dtype`` in ``module`` (defined once): ``nc`` channels,
    H x W planes the first at address ``src`` and each ``src_step`` bytes after the one before,
    written at address ``dst`` as the slab a slab micro-kernel reads in place: per channel,
    sh*sw phase planes of
    Hb x Ws holding rows row0 .. row0+rows-1 (rows <= Hb) of the full planes, whose plane
    (a, b) row i column j holds the input at row sh*i + a - pt, column sw*j + b - pl, or zero
    outside it (see ``csa.layout.slab_shape``); only the planes in the bit mask ``planes`` (bit
    a*sw + b; -1: all) are filled. Each input value is read once per fill. ``run``-wide runs
    of a plane row move per call of the ``copy_rows`` at address ``copy_rows`` (see
    ``row_copier``), for all nc channels, or, when there are more rows than channels, down all
    the rows of a channel (a call costs about as much as a few vectors moved: csa/TUNING.md)."""
    name = f"fill_slab_{dtype}"
    if name in module.globals:
        return module.globals[name]
    code = LoopCode(module, name, FILL_ARGS, internal=True)
    item = DTYPES[dtype].itemsize
    src_plane, _, H, W, nc, sh, sw, Hb, Ws, row0, rows, pt, pl, planes, dst, run, _ = (
        code.args(*FILL_ARGS))
    channel_bytes = sh * sw * Hb * Ws * item
    with code.range(0, sh) as a:
        # the plane rows on input rows: i_lo <= i < i_hi (the others are zero padding)
        first = sh * row0 + a - pt                  # input row of plane row 0
        i_lo = code.min(rows, code.max(0, (-first + sh - 1) // sh))
        i_hi = code.max(i_lo, code.min(rows, (H - first + sh - 1) // sh))
        with code.range(0, sw) as b:
            with code.if_((planes == -1) | ((planes >> (a * sw + b)) & 1 != 0)):
                plane = dst + (a * sw + b) * Hb * Ws * item
                with code.range(0, Ws, run) as j0:
                    col = sw * j0 + b - pl                  # input column of lane 0
                    # the lanes on input columns
                    lo = code.min(run, code.max(0, (-col + sw - 1) // sw))
                    hi = code.max(lo, code.min(run, (W - col + sw - 1) // sw))
                    row = dict(src=src_plane + (first * W + col) * item, dst=plane + j0 * item,
                               j1=code.min(run, Ws - j0), lo=lo, hi=hi, i_lo=i_lo, i_hi=i_hi,
                               channel_bytes=channel_bytes)
                    with code.if_else(nc >= rows) as (across, down):
                        with across:
                            _fill_across_channels(code, item, **row)
                        with down:
                            _fill_down_rows(code, item, **row)
    code.ret()
    return code.function


def _fill_across_channels(code, item, src, dst, j1, lo, hi, i_lo, i_hi, channel_bytes):
    """One call per slab row, down the channels (``define_fill_slab``)."""
    W, src_step, nc, sh, sw, Ws, rows, copy_rows = code.args("W", "src_step", "nc", "sh", "sw",
                                                             "Ws", "rows", "copy_rows")
    with code.range(0, rows) as i:
        inside = (i >= i_lo) & (i < i_hi)
        code.call((copy_rows, row_copy.FUNCTION_TYPE), dst + i * Ws * item, channel_bytes,
                  src + i * sh * W * item, src_step, nc, sw, 0, j1,
                  code.choose(inside, lo, 0), code.choose(inside, hi, 0))


def _fill_down_rows(code, item, src, dst, j1, lo, hi, i_lo, i_hi, channel_bytes):
    """Per channel, down the rows, the padding rows zeroed (``define_fill_slab``)."""
    W, src_step, nc, sh, sw, Ws, rows, copy_rows = code.args("W", "src_step", "nc", "sh", "sw",
                                                             "Ws", "rows", "copy_rows")
    copy = (copy_rows, row_copy.FUNCTION_TYPE)
    with code.range(0, nc) as ch:
        at = dst + ch * channel_bytes
        with code.if_(i_lo != 0):
            code.call(copy, at, Ws * item, src, 0, i_lo, sw, 0, j1, 0, 0)
        code.call(copy, at + i_lo * Ws * item, Ws * item,
                  src + ch * src_step + i_lo * sh * W * item, sh * W * item, i_hi - i_lo, sw, 0,
                  j1, lo, hi)
        with code.if_(rows > i_hi):
            code.call(copy, at + i_hi * Ws * item, Ws * item, src, 0, rows - i_hi, sw, 0, j1, 0, 0)


def pack_input_tile(x, n, c_first, nc, p0, nwin_used, window, dst_addr, nwin, copy_rows, copy_taps):
    """``define_pack_input_tile``'s packer called from Python (tests): ``x`` a 4-D
    C-contiguous array, ``window`` its WINDOW_FIELDS, ``dst_addr`` the tile's address."""
    packer = native_function(define_pack_input_tile, dtype_name(x.dtype), False)
    function = packer.module.function(packer.name, None, *[ctypes.c_int64] * len(PACK_ARGS))
    function(x.ctypes.data, *x.shape[1:], n, c_first, nc, p0, nwin_used,
             *(int(v) for v in window[:len(WINDOW_FIELDS)]), dst_addr, nwin, copy_rows, copy_taps)
