"""The slicing loop nests, one generator per variant over shared loops.

A variant is how a plan's micro-kernel meets its operands (``lowering.loop_nest`` picks it):

- ``define_windows_packed``: windows in vectors, each input tile packed right before the
  filter tiles use it in turn (or read in place where the input already is one: a 1x1
  convolution at stride 1, ``unpacked``);
- ``define_windows_slab``: windows in vectors, read in place from a slab;
- ``define_filters_packed``: filters in vectors, a block's input tiles packed ahead;
- ``define_filters_direct``: filters in vectors, windows broadcast from a slab;
- ``define_filters_blocked``: on channel-blocked activations (``cso.layouts``), filters in
  vectors, windows broadcast from the input's blocks (in place, or from a slab of them when the
  convolution pads), each tile stored into the output's blocks.

Each generates the C entry ``conv_{variant}_{dtype}(args, part)`` (``cso.entry``) around the
micro-kernel ``geom`` names (``lowering.geometry``), computing the output part ``part`` =
(first window tile, end window tile, first filter tile, end filter tile): window tiles
numbered over all images (image n's tile t is n*T_in + t), filter tiles within each group.
Parts share no output element and each element's channel tiles run in the same order whatever
the part: parts run on several threads give the same result as one.

The shared loops (``_LoopNest.loops``): images; output bands (``band`` window tiles: every
channel tile of a band runs before the next band, so that the band's partial outputs stay in
L2); groups; channel tiles; the IS / WS blocks within the band (IS: K3 window tiles x K2 filter
tiles, WS: K3 filter tiles x K2 window tiles); then the vector operand's tiles, and inside them
the broadcast operand's. The schedule (IS or WS) is a run-time argument: it only orders the
same loops.

With filters in vectors the kernel accumulates one group's output of the band transposed
(windows x K_g) in ``out_t``, which a pass after the group's channel tiles turns into NCHW with
bias and activation while it is hot.

A slab plan packs no tiles: per output band, each channel tile's rows that the band reads (that
the part's own tiles read, where a part covers less than a band) are copied once, zero-padded
and split into stride phases, into ``scratch`` (planes of Hb x Ws,
see ``csa.layout.slab_shape`` and ``slab_band_rows``); the output rows lie on the Hs x Ws
phase planes (the last Ws - Q columns padding), and the kernel reads its row (c, r, s) in
place at the offset ``slab_offsets`` gives from the band's first slab row. With windows in
vectors a window tile is NWIN consecutive positions on the planes (straddling rows); in a
direct plan it is at most NWIN consecutive windows of one output row, ``row_tiles`` tiles to a
row, each window broadcast from the slab.
"""
from types import SimpleNamespace

from microkernels import ACCUMULATE, outer_product, transpose
from microkernels.dtypes import DTYPES
from microkernels.loop_ir import LoopCode
from packing.inputs import define_fill_slab, define_pack_input_tile

from .entry import PART_WORDS, EntryCode, Geom

# the loop nests' ``geom``: the convolution's shape, the plan's tiling and the geometry it
# implies, and the addresses of the functions the loop nest calls
GEOM = Geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q", "P", "groups", "Cg", "Kg", "nc",
            "k2", "k3", "is_input_stationary", "epilogue", "unpacked", "phases", "Hs", "Ws",
            "windows", "slots", "band", "Hb", "planes", "row_tiles", "nwin", "nf", "lanes",
            "kernel", "transpose", "copy_rows", "copy_taps", "fill_width", "tail_kernel",
            "filter_tail_kernel", "filter_tail_short_kernel", "params", "in_block",
            "out_block", "subsample")

# The loop nest's phases (geom "phases"): a call runs all of them; the benchmark's time
# breakdown runs some alone on the same tiles (ConvBench's packing / micro-kernel / post-conv).
PACK, KERNEL, POST = 1, 2, 4
ALL_PHASES = PACK | KERNEL | POST


def define_windows_packed(module, dtype):
    """Windows in vectors, input tiles packed: each window tile packed (or, ``unpacked``, read
    in place but for a last partial tile) before the filter tiles of its block use it in turn
    while it is hot in L1; IS packs a block's tiles on its first pass over the filter blocks
    and keeps K3 of them."""
    nest = _LoopNest(module, dtype, "windows_packed")
    code = nest.code

    def window_tile(at, wt):
        tile, in_place = nest.packed_tile(at, wt)
        with code.if_(~in_place & nest.packing & (at.first_pass | ~nest.input_stationary)):
            nest.pack_tile(at, tile.first, tile.windows, tile.address)
        return tile

    nest.loops(window_tile, nest.kernel_into_output, windows_innermost=False)
    return nest.finish()


def define_windows_slab(module, dtype):
    """Windows in vectors, read in place from the band's slab: a window tile is NWIN
    consecutive positions on the phase planes, straddling rows."""
    nest = _LoopNest(module, dtype, "windows_slab")

    def window_tile(at, wt):
        p0 = wt * nest.NWIN
        return SimpleNamespace(address=nest.scratch + (p0 - at.row0 * nest.Ws) * nest.item,
                               stride=nest.NWIN, windows=nest.code.min(nest.NWIN,
                                                                      nest.windows - p0),
                               first=p0 // nest.Ws * nest.Q, column=p0 % nest.Ws)

    # a tile's last windows are a row's padding columns, whose taps reach a row further
    # (``csa.layout.slab_band_rows``)
    nest.loops(window_tile, nest.kernel_into_output, windows_innermost=False,
               slab_rows=lambda b0, b1: (b0 * nest.NWIN // nest.Ws,
                                         (b1 * nest.NWIN - 1) // nest.Ws + 2 + nest.reach))
    return nest.finish()


def define_filters_packed(module, dtype):
    """Filters in vectors, input tiles packed: a block's window tiles packed together before
    the filter tiles sweep them (WS), or before the first filter block does (IS: K3 tiles stay
    packed); window tiles innermost."""
    nest = _LoopNest(module, dtype, "filters_packed")
    code = nest.code

    def pack_block(at):
        with code.if_((~nest.input_stationary | at.first_pass) & nest.packing):
            with code.range(at.wb, at.wend) as wt:
                p0 = wt * nest.NWIN
                with code.if_(~nest.unpacked | (p0 + nest.NWIN > nest.PQ)):
                    nest.pack_tile(at, p0, code.min(nest.NWIN, nest.PQ - p0),
                                   nest.scratch + (wt - at.wb) * at.tile_bytes)

    def window_tile(at, wt):
        return nest.packed_tile(at, wt)[0]

    nest.loops(window_tile, nest.kernel_into_band, windows_innermost=True,
               band_pass=nest.transpose_band, block=pack_block)
    return nest.finish()


def define_filters_direct(module, dtype):
    """Filters in vectors, each window broadcast from the band's slab: a window tile is at most
    NWIN consecutive windows of one output row, ``row_tiles`` of them to a row (evened out:
    ``row_column``), stepped along the row from one tile to the next (a division per call
    would cost a shallow kernel call up to a tenth of its time); a row's short tiles run
    ``tail_kernel``."""
    nest = _LoopNest(module, dtype, "filters_direct", direct=True)

    def window_tile(at, wt, row):
        oh, ow0, ow1 = nest.step_along_row(row)
        return SimpleNamespace(address=nest.scratch + ((oh - at.row0) * nest.Ws + ow0) * nest.item,
                               stride=nest.NWIN, windows=ow1 - ow0, first=oh * nest.Q + ow0,
                               column=0)

    nest.loops(window_tile, nest.kernel_into_band, windows_innermost=True,
               band_pass=nest.transpose_band,
               slab_rows=lambda b0, b1: (b0 // nest.row_tiles,
                                         (b1 - 1) // nest.row_tiles + 1 + nest.reach),
               start_row=nest.start_row)
    return nest.finish()


def define_filters_blocked(module, dtype):
    """Filters in vectors on channel-blocked activations: the input is ``block`` channels a
    pixel-block (its geom field; 1 for an NCHW input), the output the kernel's lanes a block.
    Window tiles are a direct plan's, at most NWIN windows of one output row (``row_tiles`` to
    a row), each window broadcast every ``sw`` blocks from the input itself when the
    convolution has no padding (``unpacked``), else from the band's slab: each channel tile's
    blocks over the rows the band reads, copied once per band with their zero padding
    (``csa.layout.blocked_slab_shape``: Hb x Ws blocks a block of channels). The kernel stores
    every tile into the output's blocks, the epilogue on the last channel tile: no transposing
    pass; or, for an NCHW output (``out_block`` 1), into the band's transposed output, which
    the transposing pass writes into the planes."""
    nest = _BlockedNest(module, dtype, "filters_blocked", direct=True)
    code, B = nest.code, nest.read_block

    def window_tile(at, wt, row):
        oh, ow0, ow1 = nest.step_along_row(row)
        address = (at.base + ((oh * nest.step_h - at.row0) * nest.Ws + ow0 * nest.step_w) * B
                   * nest.item)
        return SimpleNamespace(address=address, windows=ow1 - ow0, first=oh * nest.Q + ow0)

    # a short tile's windows past its row's end read the next slab row where no tail kernel
    # takes it (the kernel broadcasts NWIN windows): that row is filled too, not left as an
    # earlier band had it
    spill = code.choose((nest.Q != nest.row_tiles * nest.NWIN)
                        & (code.geom("tail_kernel") == 0), 1, 0)

    def slab_rows(b0, b1):
        # the rows that output rows b0 // row_tiles .. (b1 - 1) // row_tiles read: the last
        # one's taps reach Hs - (P - 1) * step_h rows
        last = (b1 - 1) // nest.row_tiles
        return (code.choose(nest.unpacked, 0, b0 // nest.row_tiles * nest.step_h),
                code.min(nest.Hs, nest.Hs + spill - (nest.P - 1 - last) * nest.step_h))

    nest.loops(window_tile, nest.kernel_into_blocks, windows_innermost=True,
               band_pass=nest.transpose_into_planes, slab_rows=slab_rows,
               start_row=nest.start_row)
    return nest.finish()


def row_column(tile_in_row, row_tiles, Q):
    """The first column of a direct row's tile: the row's ``row_tiles`` tiles even, of
    Q // row_tiles or one more windows each (``csa.layout.balanced_row_windows``)."""
    return tile_in_row * Q // row_tiles


def define_blocked_offsets(module):
    """``blocked_offsets(rows, nc, R, S, dh, dw, Hb, Ws, B)`` in ``module`` (defined once):
    the offsets of the kernel's rows (c, r, s) on blocks of ``B`` channels of Hb x Ws pixels
    (the input's, or a slab of them), written as int64 at address ``rows``: channel c's lane
    of its block, shifted by the tap's rows and columns."""
    if "blocked_offsets" in module.globals:
        return module.globals["blocked_offsets"]
    code = LoopCode(module, "blocked_offsets", ("rows", "nc", "R", "S", "dh", "dw", "Hb", "Ws",
                                                "B"), internal=True)
    rows, nc, R, S, dh, dw, Hb, Ws, B = code.args(*code.arg_names)
    with code.range(0, R) as r:
        with code.range(0, S) as s:
            code.store(rows, r * S + s, (r * dh * Ws + s * dw) * B)
    _each_channel(code, rows, nc, R * S, lambda c: c // B * Hb * Ws * B + c % B)
    code.ret()
    return code.function


def _each_channel(code, rows, nc, taps, channel_offset):
    """Rows ``taps`` .. ``nc * taps`` of an offsets table whose first ``taps`` rows hold
    channel 0's: channel c's taps are those shifted by ``channel_offset(c)``. (Divisions
    once a tap, not once a row: every part sets its table up at its start, which cost a
    64-channel 3x3 1.9 us a part when each row had its own.)"""
    with code.range(1, nc) as c:
        offset = channel_offset(c)
        with code.range(0, taps) as t:
            code.store(rows, c * taps + t, code.load(rows, t) + offset)


def define_fill_blocks(module):
    """``fill_blocks(src, src_step, blocks, H, W, pixel, Hb, Ws, row0, rows, pt, pl, dst)`` in
    ``module`` (defined once): a blocked slab (``csa.layout.blocked_slab_shape``): of
    ``blocks`` blocks of H x W pixels of ``pixel`` bytes (the first at ``src``, each
    ``src_step`` bytes after the one before), padded rows row0 .. row0+rows-1 (input row
    row - pt) written as rows of Ws pixels a block (Hb rows apart), each the input row's
    pixels from column pl on and zeros around them (rows outside the input all zeros): a
    memcpy and two memsets a row."""
    if "fill_blocks" in module.globals:
        return module.globals["fill_blocks"]
    code = LoopCode(module, "fill_blocks", ("src", "src_step", "blocks", "H", "W", "pixel",
                                            "Hb", "Ws", "row0", "rows", "pt", "pl", "dst"),
                    internal=True)
    src, src_step, blocks, H, W, pixel, Hb, Ws, row0, rows, pt, pl, dst = code.args(
        *code.arg_names)
    left = code.min(pl, Ws)
    copied = code.max(0, code.min(W, Ws - left))   # pixels of an input row the slab holds
    with code.range(0, blocks) as b:
        with code.range(0, rows) as i:
            ih = row0 + i - pt
            target = dst + (b * Hb + i) * Ws * pixel
            with code.if_else((ih >= 0) & (ih < H)) as (inside, outside):
                with inside:
                    code.zero(target, left * pixel)
                    code.copy(target + left * pixel, src + b * src_step + ih * W * pixel,
                              copied * pixel)
                    code.zero(target + (left + copied) * pixel, (Ws - left - copied) * pixel)
                with outside:
                    code.zero(target, Ws * pixel)
    code.ret()
    return code.function


# how the input a slab filler reads holds its channels (``define_fill_slab_of``)
BLOCKS, PLANES, CHANNELS_LAST = 0, 1, 2


def define_fill_slab_of(module):
    """``fill_slab_of(layout, src, C, held, H, W, L, item, Hb, Ws, row0, rows, pt, pl, dst,
    transpose)`` in ``module`` (defined once): ``define_fill_blocks``'s slab of one
    block of L channels (``held`` of them real, the rest zero), from a block of the input's
    (``layout`` BLOCKS: a row a copy), its NCHW planes (PLANES: L x L block transposes, the
    function at ``transpose``, ``microkernels.transpose``) or its channels-last pixels
    (CHANNELS_LAST: a vector a pixel); ``src`` its first value."""
    if "fill_slab_of" in module.globals:
        return module.globals["fill_slab_of"]
    code = LoopCode(module, "fill_slab_of", ("layout", "src", "C", "held", "H", "W", "L", "item",
                                             "Hb", "Ws", "row0", "rows", "pt", "pl", "dst",
                                             "transpose"), internal=True)
    (layout, src, C, held, H, W, L, item, Hb, Ws, row0, rows, pt, pl, dst,
     block_transpose) = code.args(*code.arg_names)
    pixel = L * item
    left = code.min(pl, Ws)
    copied = code.max(0, code.min(W, Ws - left))   # pixels of an input row the slab holds
    with code.range(0, rows) as i:
        ih = row0 + i - pt
        target = dst + i * Ws * pixel
        with code.if_else((ih >= 0) & (ih < H)) as (inside, outside):
            with inside:   # (a block's lanes past ``held``: zero, as no copy writes them)
                code.zero(target, code.choose(held < L, Ws, left) * pixel)
                into = target + left * pixel
                with code.if_(layout == BLOCKS):
                    code.copy(into, src + ih * W * pixel, copied * pixel)
                with code.if_(layout == PLANES):
                    with code.range(0, copied, L) as c0:
                        code.call((block_transpose, transpose.FUNCTION_TYPE),
                                  src + (ih * W + c0) * item, H * W, into + c0 * pixel, L, held,
                                  code.min(L, copied - c0), 0, 0, 0)
                with code.if_(layout == CHANNELS_LAST):
                    pixel_copies(code, into, pixel, src + ih * W * C * item, C * item, copied,
                                 held * item, pixel)
                code.zero(target + (left + copied) * pixel, (Ws - left - copied) * pixel)
            with outside:
                code.zero(target, Ws * pixel)
    code.ret()
    return code.function


def pixel_copies(code, dst, dst_step, src, src_step, count, size, whole):
    """``count`` copies of ``size`` bytes, ``dst_step`` and ``src_step`` bytes apart: of a
    constant size ``whole`` (a vector's moves) when ``size`` is, else a call to memcpy."""
    with code.if_else(size == whole) as (vectors, fewer):
        with vectors:
            with code.range(0, count) as j:
                code.copy(dst + j * dst_step, src + j * src_step, whole)
        with fewer:
            with code.range(0, count) as j:
                code.copy(dst + j * dst_step, src + j * src_step, size)


def define_subsample_blocks(module, dtype):
    """``subsample_blocks(src, src_step, blocks, W, B, sh, sw, row0, rows, Q, Hb, dst)`` in
    ``module`` (defined once): a subsampled 1x1's slab (``csa.layout.subsampled``): of
    ``blocks`` blocks of ``B`` channels, H x W pixels each (the first at ``src``, each
    ``src_step`` bytes after the one before), the pixels output rows row0 .. row0+rows-1 read
    (every ``sh``-th row, every ``sw``-th column), written as Hb x Q pixels a block at
    ``dst``."""
    name = f"subsample_blocks_{dtype}"
    if name in module.globals:
        return module.globals[name]
    item = DTYPES[dtype].itemsize
    code = LoopCode(module, name, ("src", "src_step", "blocks", "W", "B", "sh", "sw", "row0",
                                   "rows", "Q", "Hb", "dst"), internal=True)
    src, src_step, blocks, W, B, sh, sw, row0, rows, Q, Hb, dst = code.args(*code.arg_names)
    with code.range(0, blocks) as b:
        with code.range(0, rows) as i:
            source = src + b * src_step + (row0 + i) * sh * W * B * item
            target = dst + (b * Hb + i) * Q * B * item
            with code.range(0, Q) as q:
                with code.range(0, B) as lane:
                    code.move(target, q * B + lane, source, q * sw * B + lane, item)
    code.ret()
    return code.function


def define_slab_offsets(module):
    """``slab_offsets(rows, nc, R, S, sh, sw, dh, dw, Hs, Ws)`` in ``module`` (defined once):
    the offsets of the kernel's rows (c, r, s) on a slab of sh*sw phase planes of Hs x Ws per
    channel, written as int64 at address ``rows``: tap (r, s) reads plane (r*dh % sh,
    s*dw % sw) shifted by (r*dh // sh, s*dw // sw)."""
    if "slab_offsets" in module.globals:
        return module.globals["slab_offsets"]
    code = LoopCode(module, "slab_offsets", ("rows", "nc", "R", "S", "sh", "sw", "dh", "dw", "Hs",
                                          "Ws"), internal=True)
    rows, nc, R, S, sh, sw, dh, dw, Hs, Ws = code.args(*code.arg_names)
    plane = Hs * Ws
    with code.range(0, R) as r:
        with code.range(0, S) as s:
            phase = (r * dh % sh) * sw + s * dw % sw
            code.store(rows, r * S + s, phase * plane + r * dh // sh * Ws + s * dw // sw)
    _each_channel(code, rows, nc, R * S, lambda c: c * sh * sw * plane)
    code.ret()
    return code.function


class _LoopNest:
    """The entry being generated and what every variant reads: the ``geom`` fields and call
    arguments (as attributes), the shared loops (``loops``) and the steps variants share."""

    def __init__(self, module, dtype, variant, direct=False):
        self.module, self.dtype, self.direct = module, dtype, direct
        self.code = code = EntryCode(module, f"conv_{variant}_{dtype}", GEOM)
        self.item = DTYPES[dtype].itemsize
        for name in ("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q", "P", "Cg", "Kg", "k2",
                     "k3", "epilogue", "Hs", "Ws", "windows", "slots", "band", "Hb", "planes",
                     "row_tiles", "fill_width", "params"):
            setattr(self, name, code.geom(name))
        self.reach = self.Hs - self.P   # slab rows a window's taps reach below its own
        self.G, self.nc_max = code.geom("groups", "nc")
        self.NWIN, self.NF, self.LANES = code.geom("nwin", "nf", "lanes")
        self.input_stationary, self.unpacked = (code.geom(f) != 0
                                                for f in ("is_input_stationary", "unpacked"))
        self.packing, self.kernels, self.post = ((code.geom("phases") & phase) != 0
                                                 for phase in (PACK, KERNEL, POST))
        self.x, self.N, self.C, self.H, self.W, self.weights, self.bias, self.out, self.K = (
            code.call_arg(a) for a in ("x", "n", "c", "h", "w", "weights", "bias", "out",
                                       "out_k"))
        self.scratch, self.out_t = code.workspace("scratch", self.item), code.workspace(
            "out_t", self.item)
        self.rows = code.workspace("rows", 8)
        self.part = [code.part_field(i) for i in range(PART_WORDS)]
        self.PQ = self.P * self.Q
        self.t_w = (self.Kg + self.NF - 1) // self.NF   # filter tiles per group

    def first_window(self, tile):
        """The output position (p = oh*Q + ow) of a window tile's first window."""
        if self.direct:
            return (tile // self.row_tiles * self.Q
                    + row_column(tile % self.row_tiles, self.row_tiles, self.Q))
        return tile * self.NWIN

    def loops(self, window_tile, kernel, windows_innermost, band_pass=None, slab_rows=None,
              block=None, start_row=None):
        """The shared loops around ``kernel(at, filter_tile, tile)`` on the window tile
        ``window_tile(at, wt[, row])`` describes (its address and row stride, windows used,
        first output position, and column on its slab row), over the part's window tiles and
        filter tiles (numbered over all groups: the groups it has, each's tiles of it). ``at``
        holds the loops' values: the image, band, group, channel tile and block. The
        variant's steps:
        ``windows_innermost``, the loop order (the vector operand's tiles outside);
        ``band_pass(at, b1, t_in, f_lo, f_hi)``, a pass over a group's output of the band
        (its filter tiles f_lo .. f_hi-1) after its channel tiles, which then applies the
        epilogue (else the kernel's store does, on the last channel tile);
        ``slab_rows(b0, b1)``, the first slab row that window tiles b0 .. b1-1 read and the row
        past their last (the slab is filled per channel tile with those rows alone: a part
        that covers part of a band fills no more of it); ``block(at)``, before a block's
        tiles; ``start_row(at)``, a direct block's first row, which ``window_tile`` steps
        along."""
        code = self.code
        if slab_rows is not None:
            self.set_up_slab()
        t_in = (self.P * self.row_tiles if self.direct
                else (self.windows + self.NWIN - 1) // self.NWIN)
        IS = self.input_stationary
        w_block, f_block = code.choose(IS, self.k3, self.k2), code.choose(IS, self.k2, self.k3)
        # the part's filter tiles, numbered over all groups: its groups, each's tiles
        part_lo, part_hi, t_w = self.part[2], self.part[3], self.t_w
        at = SimpleNamespace()
        with code.range(self.part[0] // t_in,
                        code.min(self.N, (self.part[1] + t_in - 1) // t_in)) as n:
            at.n = n
            t_lo = code.max(0, self.part[0] - n * t_in)
            t_hi = code.min(t_in, self.part[1] - n * t_in)
            with code.range(t_lo, t_hi, self.band) as b0:
                b1 = code.min(t_hi, b0 + self.band)
                if slab_rows is None:
                    at.row0 = 0
                else:
                    # rows past the padded input too (zero): windows past the plane's end
                    # read them, and a row left as the workspace had it (subnormals, say,
                    # from an earlier job) would slow every FMA on it
                    at.row0, row_end = slab_rows(b0, b1)
                    at.slab_rows = code.min(self.Hb, row_end - at.row0)
                at.p_lo = self.first_window(b0)
                with code.range(part_lo // t_w, (part_hi + t_w - 1) // t_w) as g:
                    f_lo = code.max(0, part_lo - g * t_w)
                    f_hi = code.min(t_w, part_hi - g * t_w)
                    # IS: window blocks of the band, then filter blocks; WS: filter blocks,
                    # then window blocks of the band
                    outer_lo, outer_hi, outer_step, inner_lo, inner_hi, inner_step = (
                        code.choose(IS, a, b) for a, b in
                        ((b0, f_lo), (b1, f_hi), (w_block, f_block), (f_lo, b0), (f_hi, b1),
                         (f_block, w_block)))
                    with code.range(0, self.Cg, self.nc_max) as c0:
                        self._channel_tile(at, g, c0, band_pass is None)
                        if slab_rows is not None:
                            self.fill_slab(at)
                        with code.range(outer_lo, outer_hi, outer_step) as outer:
                            with code.range(inner_lo, inner_hi, inner_step) as inner:
                                at.wb, at.fb = code.choose(IS, outer, inner), code.choose(
                                    IS, inner, outer)
                                at.wend = code.min(b1, at.wb + w_block)
                                at.fend = code.min(f_hi, at.fb + f_block)
                                at.first_pass = inner == inner_lo
                                if block is not None:
                                    block(at)
                                self._tiles(at, window_tile, kernel, windows_innermost,
                                            start_row)
                    if band_pass is not None:   # the group's outputs, while hot
                        with code.if_(self.post):
                            band_pass(at, b1, t_in, f_lo, f_hi)

    def _channel_tile(self, at, g, c0, stores_output):
        """``at``'s values for channel tile ``c0`` of group ``g``: its kernel flags (the
        ``epilogue`` on the last channel tile when the kernel ``stores_output``; else its tiles
        start from zero and a band pass applies it), the packed tiles' depth and size, the
        filters', the output's and the unpacked input's addresses."""
        code, item = self.code, self.item
        at.g, at.c0 = g, c0
        at.nc = nc = code.min(self.nc_max, self.Cg - c0)
        at.flags = code.choose(c0 > 0, ACCUMULATE, 0)
        if stores_output:
            at.flags = (at.flags | (self.epilogue & ACCUMULATE)
                        | code.choose(c0 + nc == self.Cg, self.epilogue, 0))
        at.depth = nc * self.R * self.S                   # rows of the packed tiles (kernel k)
        at.tile_bytes = at.depth * self.NWIN * item
        at.w_base = self.weights + (g * self.t_w * self.Cg + c0) * self.R * self.S * self.NF * item
        at.out_base = self.out + (at.n * self.K + g * self.Kg) * self.PQ * item
        at.x_base = self.x + (at.n * self.C + g * self.Cg + c0) * self.PQ * item  # unpacked only

    def _tiles(self, at, window_tile, kernel, windows_innermost, start_row):
        """A block's tiles: the vector operand's tile stays in L1 while the broadcast operand's
        tiles stream past it (filter tiles innermost with windows in vectors, each window tile
        set up once for them; window tiles innermost with filters in vectors)."""
        code = self.code
        if not windows_innermost:
            with code.range(at.wb, at.wend) as wt:
                tile = window_tile(at, wt)
                with code.range(at.fb, at.fend) as ft:
                    kernel(at, ft, tile)
            return
        self.next_filter_runs(at)
        with code.range(at.fb, at.fend) as ft:
            row = () if start_row is None else (start_row(at),)
            with code.range(at.wb, at.wend) as wt:
                at.wt = wt
                kernel(at, ft, window_tile(at, wt, *row))

    def packed_tile(self, at, wt):
        """(window tile ``wt`` of a packed variant, whether it is read in place): its slot of
        packed tiles (see ``lowering.scratch_tiles``), or the input itself where the plan
        reads it ``unpacked`` and the tile is whole."""
        code, p0 = self.code, wt * self.NWIN
        in_place = self.unpacked & (p0 + self.NWIN <= self.PQ)
        slot = code.choose(self.slots > 1, wt - at.wb, 0)
        tile = SimpleNamespace(address=code.choose(in_place, at.x_base + p0 * self.item,
                                                   self.scratch + slot * at.tile_bytes),
                               stride=code.choose(in_place, self.PQ, self.NWIN),
                               windows=code.min(self.NWIN, self.windows - p0), first=p0,
                               column=0)
        return tile, in_place

    def pack_tile(self, at, p0, nwin_used, dst):
        """Pack the input tile of ``nwin_used`` windows from position ``p0`` at ``dst``."""
        self.code.call(define_pack_input_tile(self.module, self.dtype), self.x, self.C, self.H,
                       self.W, at.n, at.g * self.Cg + at.c0, at.nc, p0, nwin_used, self.R,
                       self.S, self.sh, self.sw, self.dh, self.dw, self.pt, self.pl, self.Q, dst,
                       self.NWIN, self.code.geom("copy_rows"), self.code.geom("copy_taps"))

    def set_up_slab(self):
        """The kernel's row offsets on the slab, its tail zeroed."""
        code = self.code
        code.call(define_slab_offsets(self.module), self.rows, self.nc_max, self.R, self.S,
                  self.sh, self.sw, self.dh, self.dw, self.Hb, self.Ws)
        slab_end = self.nc_max * self.sh * self.sw * self.Hb * self.Ws
        code.zero(self.scratch + slab_end * self.item,
                  (code.call_arg("scratch_row") - slab_end) * self.item)

    def start_row(self, at):
        """A direct block's first window tile: its output row, tile in that row and first
        column, which ``step_along_row`` steps."""
        code = self.code
        row = (code.var(at.wb // self.row_tiles), code.var(at.wb % self.row_tiles), code.var())
        row[2].set(row_column(row[1], self.row_tiles, self.Q))
        return row

    def step_along_row(self, row):
        """(output row, first column, end column) of the direct tile at ``row``, which steps
        to the next tile's, along the row (a division per call would cost a shallow kernel
        call up to a tenth of its time)."""
        code, (oh, j, ow0) = self.code, row
        tile = oh + 0, ow0 + 0, row_column(j + 1, self.row_tiles, self.Q)
        row_end = j + 1 == self.row_tiles
        oh.set(oh + code.choose(row_end, 1, 0))
        j.set(code.choose(row_end, 0, j + 1))
        ow0.set(code.choose(row_end, 0, tile[2]))
        return tile

    def fill_slab(self, at):
        """The band's slab rows of the channel tile, zero-padded and split into phases."""
        code, item = self.code, self.item
        with code.if_(self.packing):
            code.call(define_fill_slab(self.module, self.dtype),
                      self.x + (at.n * self.C + at.g * self.Cg + at.c0) * self.H * self.W * item,
                      self.H * self.W * item, self.H, self.W, at.nc, self.sh, self.sw, self.Hb,
                      self.Ws, at.row0, at.slab_rows, self.pt, self.pl,
                      self.planes, self.scratch, self.fill_width, code.geom("copy_rows"))

    def kernel_into_output(self, at, ft, tile):
        """The kernel (windows in vectors) on filter tile ``ft``, into ``out`` in place."""
        code, item = self.code, self.item
        f0 = ft * self.NF
        with code.if_(self.kernels):
            code.call((code.geom("kernel"), outer_product.FUNCTION_TYPE), at.depth, tile.address,
                      tile.stride, at.w_base + ft * self._filter_tile_bytes(), self.NF,
                      at.out_base + (f0 * self.PQ + tile.first) * item, self.PQ, self.LANES,
                      tile.windows,
                      code.min(self.NF, self.Kg - f0), self.bias + (at.g * self.Kg + f0) * item,
                      at.flags, self.rows, tile.column, self.Ws, self.Ws - self.Q, self.params,
                      0, 0)

    def kernel_into_band(self, at, ft, tile):
        """The kernel (filters in vectors) on filter tile ``ft``, into the band's transposed
        output; a direct row's short tile runs ``tail_kernel`` (when there is one), a group's
        last filter tile of fewer vectors ``filter_tail_kernel`` (its short tiles
        ``filter_tail_short_kernel``)."""
        code, item = self.code, self.item
        f0 = ft * self.NF
        kernel, filter_tail = code.geom("kernel", "filter_tail_kernel")
        last = (filter_tail != 0) & (f0 + self.NF > self.Kg)
        if self.direct:
            tail = code.geom("tail_kernel")
            short = (tail != 0) & (tile.windows < self.NWIN)
            kernel = code.choose(short, tail, kernel)
            filter_tail = code.choose(short, code.geom("filter_tail_short_kernel"), filter_tail)
        kernel = code.choose(last, filter_tail, kernel)
        with code.if_(self.kernels):
            code.call((kernel, outer_product.FUNCTION_TYPE), at.depth,
                      at.w_base + ft * self._filter_tile_bytes(), self.NF, tile.address,
                      tile.stride,
                      self.out_t + ((tile.first - at.p_lo) * self.Kg + f0) * item,
                      self.Kg, self.LANES, code.min(self.NF, self.Kg - f0), tile.windows, self.bias,
                      at.flags,
                      self.rows, 0, 0, 0, self.params, *self.next_filters(at, ft))

    def _filter_tile_bytes(self):
        """The stride between filter tiles."""
        return self.Cg * self.R * self.S * self.NF * self.item

    def next_filter_runs(self, at):
        """A block's runs of the filter tile after each (``next_filters``), set on ``at`` once
        for its calls (divisions a call cost a shallow kernel call a few percent): the
        channel tile's rows of a filter tile split into equal runs of bytes, one per window
        tile, and the bytes a kernel row (depth step) advances along its run."""
        at.run_bytes = ((at.depth * self.NF * self.item + at.wend - at.wb - 1)
                        // (at.wend - at.wb))
        at.run_step = (at.run_bytes + at.depth - 1) // at.depth

    def next_filters(self, at, ft):
        """(next, next_step) of a filters-in-vectors kernel call on filter tile ``ft`` and
        window tile ``at.wt``, for a ``prefetch_next`` kernel: its run of the filter tile the
        block runs next (``next_filter_runs``; one line a trip of the kernel's depth loop:
        all of it where a run is at most a line a trip), or, after the block's last, the tile
        itself (already here)."""
        code = self.code
        tile_bytes = self._filter_tile_bytes()
        current = at.w_base + ft * tile_bytes
        has_next = ft + 1 < at.fend
        return (code.choose(has_next, current + tile_bytes + (at.wt - at.wb) * at.run_bytes,
                            current),
                code.choose(has_next, at.run_step, 0))

    def transpose_band(self, at, b1, t_in, f_lo, f_hi):
        """Group ``at.g``'s part of the band, its filter tiles f_lo .. f_hi-1: out[n, g*Kg + k,
        p] = act(out_t[p - p_lo, k] (+ bias)) while hot, one vector-square block at a time."""
        code, item, LANES = self.code, self.item, self.LANES
        p_hi = code.cond(b1 < t_in, lambda: self.first_window(b1), lambda: self.PQ)
        first = at.g * self.Kg   # the group's first filter
        # the output's filters alone (a merge padded with a zero group has filters past K)
        k_hi = code.min(self.Kg, f_hi * self.NF, self.K - first)
        out_n = self.out + (at.n * self.K + first) * self.PQ * item
        with code.range(at.p_lo, p_hi, LANES) as p0:
            with code.range(f_lo * self.NF, k_hi, LANES) as k0:
                code.call((code.geom("transpose"), transpose.FUNCTION_TYPE),
                          self.out_t + ((p0 - at.p_lo) * self.Kg + k0) * item, self.Kg,
                          out_n + (k0 * self.PQ + p0) * item, self.PQ,
                          code.min(LANES, p_hi - p0), code.min(LANES, k_hi - k0),
                          self.bias + (first + k0) * item, self.epilogue, self.params)

    def finish(self):
        self.code.ret()
        return self.code.function


class _BlockedNest(_LoopNest):
    """A loop nest on channel-blocked activations (``define_filters_blocked``): its input is
    blocks of ``in_block`` channels (``C`` its padded channel count, a whole number of
    blocks), its output of ``out_block``: the lanes, or all K channels (channels last; ``K``
    likewise padded): the slab holds blocks, the kernel stores into the output's blocks; or
    NCHW planes (``out_block`` 1): the kernel stores the band's output channels last into
    ``out_t``, which the transposing pass writes into the planes while hot (a reorder's pass
    over the whole output saved)."""

    def __init__(self, module, dtype, variant, direct=True):
        super().__init__(module, dtype, variant, direct)
        code = self.code
        self.block, self.out_block = code.geom("in_block", "out_block")
        self.planes_out = self.out_block == 1
        # a subsampled 1x1's slab holds its windows alone: read as a stride-1 1x1's
        self.subsample = code.geom("subsample") != 0
        self.step_h, self.step_w = (code.choose(self.subsample, 1, s) for s in (self.sh, self.sw))
        # a slab of channels-last pixels holds a channel tile narrower than the pixel (a
        # group's, or one of several) alone, in blocks of the lanes (a whole one, whole
        # pixels); one of NCHW planes, a tile of a block or more, in blocks of the lanes too:
        # L x L transposes, where a copy a channel and row cost 2.6-3.5x as much on 14 x 14
        # planes (Xeon); fewer channels (a stem's 3) keep their planes' rows, whose pixels
        # would fill a few lanes of each block
        planes = self.block == 1
        self.into_blocks = (~self.unpacked & ~self.subsample & (self.block != self.LANES)
                            & code.choose(planes, self.nc_max >= self.LANES,
                                          self.nc_max < self.C))
        self.fill_layout = code.choose(planes, PLANES, CHANNELS_LAST)
        self.read_block = code.choose(self.into_blocks, self.LANES, self.block)

    def _channel_tile(self, at, g, c0, stores_output):
        """``_LoopNest._channel_tile``, the kernel's store applying the epilogue unless the
        output is NCHW planes (the transposing pass applies it then)."""
        super()._channel_tile(at, g, c0, True)
        at.flags = self.code.choose(self.planes_out, self.code.choose(c0 > 0, ACCUMULATE, 0),
                                    at.flags)

    def transpose_into_planes(self, at, b1, t_in, f_lo, f_hi):
        """The band pass of an NCHW output (``transpose_band``); none for blocks."""
        with self.code.if_(self.planes_out):
            self.transpose_band(at, b1, t_in, f_lo, f_hi)

    def set_up_slab(self):
        """The kernel's row offsets on the input's blocks, or on the slab's."""
        self.code.call(define_blocked_offsets(self.module), self.rows, self.nc_max, self.R,
                       self.S, self.dh, self.dw, self.Hb, self.Ws, self.read_block)

    def fill_slab(self, at):
        """``at.base``: the channel tile's first block (its first channel's, in the block),
        in the input (read in place) or copied with the band's rows into the slab
        (``define_fill_blocks``; NCHW planes by block transposes and channels-last pixels a
        vector a pixel, into blocks of the lanes, ``define_fill_slab_of``; a subsampled 1x1's
        windows alone, ``define_subsample_blocks``)."""
        code, item, B, L = self.code, self.item, self.block, self.LANES
        channel = at.g * self.Cg + at.c0   # in its block: channels last's tiles read in place
        first_block = self.x + (at.n * self.C * self.H * self.W + channel // B * B * self.H
                                * self.W + channel % B) * item
        at.base = code.choose(self.unpacked, first_block, self.scratch)
        blocks = (at.nc + B - 1) // B
        with code.if_(~self.unpacked & self.packing & ~self.subsample & ~self.into_blocks):
            code.call(define_fill_blocks(self.module), first_block, self.H * self.W * B * item,
                      blocks, self.H, self.W, B * item, self.Hb, self.Ws, at.row0,
                      at.slab_rows, self.pt, self.pl, self.scratch)
        with code.if_(self.packing & self.into_blocks):
            # a block's L channels: L planes, or L values of a pixel, after the last's; those
            # of the input alone (a merge padded with a zero group has channels past C: the
            # fill zeroes a block's lanes past ``held``, which its zero filters then meet)
            block_step = code.choose(B == 1, self.H * self.W, 1) * L * item
            with code.range(0, (at.nc + L - 1) // L) as b:
                held = code.max(0, code.min(L, at.nc - b * L, self.C - channel - b * L))
                code.call(define_fill_slab_of(self.module), self.fill_layout,
                          first_block + b * block_step, self.C, held,
                          self.H, self.W, L, item, self.Hb, self.Ws, at.row0, at.slab_rows,
                          self.pt, self.pl, self.scratch + b * self.Hb * self.Ws * L * item,
                          code.geom("transpose"))
        with code.if_(self.packing & self.subsample):
            code.call(define_subsample_blocks(self.module, self.dtype), first_block,
                      self.H * self.W * B * item, blocks, self.W, B, self.sh,
                      self.sw, at.row0, at.slab_rows, self.Q, self.Hb, self.scratch)

    def kernel_into_blocks(self, at, ft, tile):
        """The kernel on filter tile ``ft``, stored into the output's blocks: a window every
        block, a vector every block plane (blocks of the lanes) or every lanes (channels
        last); its lanes up to the group's filters, or with one group up to the padded
        channels (the padding lanes get the zero filters' outputs)."""
        code, item, LANES, Bo = self.code, self.item, self.LANES, self.out_block
        f0 = ft * self.NF
        tail = code.geom("tail_kernel")
        kernel = code.choose((tail != 0) & (tile.windows < self.NWIN), tail,
                             code.geom("kernel"))
        filters = code.choose(self.G == 1, self.K, self.Kg)
        k0 = at.g * self.Kg + f0   # the tile's first channel, on a vector of its block
        out = code.choose(
            self.planes_out, self.out_t + ((tile.first - at.p_lo) * self.Kg + f0) * item,
            self.out + (at.n * self.K * self.PQ + k0 // Bo * self.PQ * Bo + k0 % Bo
                        + tile.first * Bo) * item)
        with code.if_(self.kernels):
            code.call((kernel, outer_product.FUNCTION_TYPE), at.depth,
                      at.w_base + ft * self._filter_tile_bytes(), self.NF, tile.address,
                      self.step_w * self.read_block, out,
                      code.choose(self.planes_out, self.Kg, Bo),
                      code.choose(Bo == LANES, self.PQ * LANES, LANES),
                      code.min(self.NF, filters - f0), tile.windows,
                      self.bias + (at.g * self.Kg + f0) * item, at.flags, self.rows, 0, 0, 0,
                      self.params, *self.next_filters(at, ft))
