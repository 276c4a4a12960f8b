"""Lowering: the compiled macro-kernel loop nest (IS and WS orders) around a micro-kernel.

One loop nest is generated per dtype (``microkernels.loop_ir``) as the C entry every call runs
its parts through (``cso.entry``): the micro-kernel (its tile, ISA, slab or packed input), the
orientation (windows or filters in vectors), every shape, stride, padding, dilation, group
count and tiling are run-time arguments (``geom``), the kernel and packing functions called
through their addresses, so a model with many distinct convolutions compiles it once (0.3 s on
Zen 3). No Python runs per tile: packing and micro-kernel calls happen inside the compiled
function.
"""
from dataclasses import replace

import numpy as np

from microkernels import ACCUMULATE, KernelSpec, TransposeSpec, outer_product, row_copy, transpose
from microkernels.spec import STORE_ACTIVATION
from microkernels.jit import native_function
from microkernels.loop_ir import LoopCode
from microkernels.dtypes import DTYPES, dtype_name
from packing import row_copier, tile_copiers
from packing.inputs import define_fill_slab, define_pack_input_tile

from .entry import PART_WORDS, EntryCode, Geom

# the loop nest's ``geom``: the convolution's shape, the plan's tiling and the geometry it
# implies, and the addresses of the functions the loop nest calls
GEOM = Geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q", "P", "groups", "Cg", "Kg", "nc",
            "k2", "k3", "is_input_stationary", "epilogue", "unpacked", "phases", "Hs", "Ws",
            "windows", "slots", "band", "Hb", "planes", "row_tiles", "nwin", "nf", "lanes",
            "slab", "direct", "filters_in_vectors", "kernel", "transpose", "copy_rows",
            "copy_taps", "fill_width", "tail_kernel", "params")

# The loop nest's phases (geom "phases"): a call runs all of them; the benchmark's time
# breakdown runs some alone on the same tiles (ConvBench's packing / micro-kernel / post-conv).
PACK, KERNEL, POST = 1, 2, 4
ALL_PHASES = PACK | KERNEL | POST


def geometry(plan, kspec, epilogue_flags, params):
    """The ``geom`` vector for ``plan`` around micro-kernel ``kspec`` (``kernel_spec``),
    compiling the functions it calls on first use; ``epilogue_flags`` (BIAS | ACTIVATE) apply
    on the last channel tile (with filters in vectors, in the transposing pass), ACCUMULATE on
    the first: the output is added to what ``out`` holds (a residual) rather than written.
    ``params``: the address of the activation's parameters (``kspec.activation``'s), which the
    caller keeps."""
    s = plan.spec
    hs, ws = plan.slab_shape
    filters_in_vectors = plan.vectors_along == "filters"
    # a slab is filled in runs of the kernel's vector width (whole vectors stored: a direct
    # tile's few windows made every store a masked one, microcoded on AMD), tiles per window
    fill_width = kspec.width
    copy_rows, copy_taps = ((row_copier(kspec, fill_width), 0) if plan.slab
                            else tile_copiers(kspec, plan.nwin, s.s, s.stride[1], s.dilation[1]))
    return GEOM.pack(
        R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
        pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, groups=s.groups, Cg=s.c_per_group,
        Kg=s.k_per_group, nc=plan.nc, k2=plan.k2, k3=plan.k3,
        is_input_stationary=plan.schedule == "IS", epilogue=epilogue_flags,
        unpacked=plan.reads_input_unpacked, phases=ALL_PHASES, Hs=hs, Ws=ws,
        windows=plan.window_positions, slots=scratch_tiles(plan), band=plan.band,
        Hb=plan.band_rows, planes=plan.slab_planes, row_tiles=plan.row_tiles, nwin=plan.nwin,
        nf=plan.nf, lanes=kspec.lanes, slab=plan.slab, direct=plan.direct,
        filters_in_vectors=filters_in_vectors,
        kernel=native_function(outer_product.define_kernel, kspec).address,
        transpose=(native_function(transpose.define_transpose,
                                   TransposeSpec(kspec.dtype, kspec.isa, kspec.activation)).address
                   if filters_in_vectors else 0),
        copy_rows=copy_rows, copy_taps=copy_taps, fill_width=fill_width,
        tail_kernel=tail_kernel(plan, kspec), params=params)


def tail_kernel(plan, kspec):
    """The address of the kernel of a direct plan's short tiles, when its rows do not divide
    into tiles of nwin: the rows' tiles are evened out (``csa.layout.balanced_row_windows``),
    some of nwin - 1 windows, which this kernel computes without padding their FMAs; else 0."""
    short = plan.direct and plan.spec.q % plan.row_tiles
    return (native_function(outer_product.define_kernel,
                            replace(kspec, broadcasts=plan.nwin - 1)).address if short else 0)


def scratch_tiles(plan):
    """Packed input tiles held at once: one with windows in vectors, each packed right before
    the filter tiles of its block use it in turn (still hot in L1), unless IS sweeps it again
    for several filter blocks (then K3); with filters in vectors (window tiles innermost, packed
    ahead) K2 for WS, K3 for IS; none for a slab."""
    if plan.slab:
        return 0
    if plan.vectors_along == "windows" and (plan.schedule == "WS" or plan.filter_tiles <= plan.k2):
        return 1
    return plan.k3 if plan.schedule == "IS" else plan.k2


def scratch_elements(plan):
    """The packed tiles, or a slab: one band's (``plan.band_buffers``) and a tail a row and a
    tile long (a band's last tile reads up to a tile past its last window, its padding columns
    a row further); then the slack the packers' blended stores may rewrite
    (``row_copy.SCRATCH_SLACK``)."""
    s = plan.spec
    slack = row_copy.SCRATCH_SLACK // s.itemsize
    if plan.slab:
        return plan.band_buffers[0] + plan.slab_shape[1] + plan.nwin + slack
    return scratch_tiles(plan) * plan.nwin * plan.nc * s.r * s.s + slack


def kernel_spec(plan, isa, activation=STORE_ACTIVATION):
    """The micro-kernel a plan runs: windows x filters when windows are the vector dimension,
    else filters (vector) x windows (broadcast). A slab plan's kernel reads its windows in
    place, as vectors ("slab") or as broadcasts ("direct"). With windows in vectors it
    prefetches the output rows of the window tiles after it (``plan.output_prefetch``). Its
    store applies ``activation`` (a kind) on the ACTIVATE flag."""
    width, broadcasts = ((plan.nwin, plan.nf) if plan.vectors_along == "windows"
                         else (plan.nf, plan.nwin))
    return KernelSpec(dtype_name(plan.spec.dtype), broadcasts, width, isa, plan.variant,
                      plan.output_prefetch, activation)


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
    with code.range(0, nc) as c:
        with code.range(0, R) as r:
            with code.range(0, S) as s:
                phase = (r * dh % sh) * sw + s * dw % sw
                code.store(rows, (c * R + r) * S + s,
                           (c * sh * sw + phase) * plane + r * dh // sh * Ws + s * dw // sw)
    code.ret()
    return code.function


def row_column(tile_in_row, row_tiles, Q):
    """The first column of a direct row's tile: the row's ``row_tiles`` tiles even, of
    Q // row_tiles or one more windows each (``csa.layout.balanced_row_windows``)."""
    return tile_in_row * Q // row_tiles


def first_window(code, tile, row_tiles, Q, nwin):
    """The output position (p = oh*Q + ow) of a window tile's first window: direct tiles lie
    ``row_tiles`` to an output row (``row_tiles`` > 0), other tiles back to back."""
    return code.cond(row_tiles != 0,
                     lambda: tile // row_tiles * Q + row_column(tile % row_tiles, row_tiles, Q),
                     lambda: tile * nwin)


def define_conv_loop_nest(module, dtype):
    """The loop nest as the C entry ``conv_loop_nest_{dtype}(args, part)`` (``cso.entry``)
    around the micro-kernel ``geom`` names (``geometry``), computing the output part
    ``part`` = (first window tile, end window tile, first filter tile, end filter tile): window
    tiles numbered over all images (image n's tile t is n*T_in + t), filter tiles within each
    group. Parts share no output element and each element's channel tiles run in the same
    order whatever the part: parts run on several threads give the same result as one.

    With filters in vectors the kernel's vector operand is the filter tile and its
    broadcast operand the input tile; it accumulates one output band transposed (windows x K)
    in ``out_t``, which a pass at the end of the band turns into NCHW with bias and activation while
    it is hot in L2.

    A slab kernel packs no tiles: per output band, each channel tile's rows that the band reads
    are copied once, zero-padded and split into stride phases, into ``scratch`` (planes of
    Hb x Ws, see ``csa.layout.slab_shape`` and ``slab_band_rows``); the output rows lie on the
    Hs x Ws phase planes (the last Ws - Q columns padding), and the kernel reads its row
    (c, r, s) in place at the offset ``slab_offsets`` gives from the band's first slab row. With
    windows in vectors a window tile is NWIN consecutive positions on the planes (straddling
    rows); in a direct plan (filters in vectors, a ``"direct"`` kernel) it is at most
    NWIN consecutive windows of one output row, ``row_tiles`` tiles to a row, each window
    broadcast from the slab.

    Output bands (``band`` window tiles): every channel tile of a band runs before the next
    band, so that the band's partial outputs stay in L2; the IS / WS blocks lie within a band."""
    code = EntryCode(module, f"conv_loop_nest_{dtype}", GEOM)
    item = DTYPES[dtype].itemsize
    pack = define_pack_input_tile(module, dtype)
    R, S, sh, sw, dh, dw, pt, pl, Q, P = code.geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl",
                                                   "Q", "P")
    G, Cg, Kg, nc_max, k2, k3 = code.geom("groups", "Cg", "Kg", "nc", "k2", "k3")
    epilogue, phases = code.geom("epilogue", "phases")
    Hs, Ws, windows, slots = code.geom("Hs", "Ws", "windows", "slots")  # slab planes: slab only
    band, Hb = code.geom("band", "Hb")   # window tiles per output band; slab rows a band holds
    planes = code.geom("planes")         # bit mask of the slab phase planes the taps read
    row_tiles = code.geom("row_tiles")   # window tiles per output row (direct only)
    NWIN, NF, LANES, fill_width = code.geom("nwin", "nf", "lanes", "fill_width")
    ukernel, tail_kernel = code.geom("kernel", "tail_kernel")   # tail: a direct row's short tile
    transpose_block, copy_rows, copy_taps = code.geom("transpose", "copy_rows", "copy_taps")
    params = code.geom("params")         # the activation's parameters
    input_stationary, unpacked, slab, direct, filters_in_vectors = (
        code.geom(f) != 0 for f in ("is_input_stationary", "unpacked", "slab", "direct",
                                    "filters_in_vectors"))
    packing, kernels, post = ((phases & phase) != 0 for phase in (PACK, KERNEL, POST))
    x_addr, N, C, H, W, w_addr, bias_addr, out_addr, K = (
        code.call_arg(a) for a in ("x", "n", "c", "h", "w", "weights", "bias", "out", "out_k"))
    scratch_addr, out_t_addr = code.workspace("scratch", item), code.workspace("out_t", item)
    rows_addr = code.workspace("rows", 8)
    part = [code.part_field(i) for i in range(PART_WORDS)]
    PQ = P * Q
    # ``rows``: the slab kernel's row offsets (``rows_elements``); past the slab, the tail the
    # last tile reads past its end zeroed
    with code.if_(slab):
        code.call(define_slab_offsets(module), rows_addr, nc_max, R, S, sh, sw, dh, dw, Hb, Ws)
        slab_end = nc_max * sh * sw * Hb * Ws
        code.zero(scratch_addr + slab_end * item,
                  (code.call_arg("scratch_row") - slab_end) * item)
    t_in = code.cond(direct, lambda: P * row_tiles, lambda: (windows + NWIN - 1) // NWIN)
    t_w = (Kg + NF - 1) // NF
    # blocks: IS = K3 window tiles x K2 filter tiles; WS = K3 filter tiles x K2 window tiles
    w_block, f_block = code.choose(input_stationary, k3, k2), code.choose(input_stationary, k2, k3)
    f_lo, f_hi = part[2], part[3]
    with code.range(part[0] // t_in, code.min(N, (part[1] + t_in - 1) // t_in)) as n:
        out_base_n = out_addr + n * K * PQ * item
        t_lo, t_hi = code.max(0, part[0] - n * t_in), code.min(t_in, part[1] - n * t_in)
        # output bands: all channel tiles of a band's window tiles before the next band, so
        # that its partial outputs stay in L2
        with code.range(t_lo, t_hi, band) as b0:
            b1 = code.min(t_hi, b0 + band)
            # the band's first slab row, and first window (out_t holds the band's windows)
            row0 = code.cond(direct, lambda: b0 // row_tiles,
                             lambda: code.cond(slab, lambda: b0 * NWIN // Ws, lambda: 0))
            p_lo = first_window(code, b0, row_tiles, Q, NWIN)
            # IS: window blocks of the band, then filter blocks; WS: filter blocks, then window
            # blocks of the band
            outer_lo, outer_hi, outer_step, inner_lo, inner_hi, inner_step = (
                code.choose(input_stationary, a, b) for a, b in
                ((b0, f_lo), (b1, f_hi), (w_block, f_block), (f_lo, b0), (f_hi, b1),
                 (f_block, w_block)))
            with code.range(0, G) as g:
                with code.range(0, Cg, nc_max) as c0:
                    nc = code.min(nc_max, Cg - c0)
                    # the transposed windows x filters tiles start from zero; the transposing
                    # pass adds them to ``out`` (``epilogue``'s ACCUMULATE)
                    flags = (code.choose(c0 > 0, ACCUMULATE, 0)
                             | code.choose(filters_in_vectors, 0, epilogue & ACCUMULATE)
                             | code.choose((c0 + nc == Cg) & ~filters_in_vectors, epilogue, 0))
                    depth = nc * R * S                   # rows of the packed tiles (kernel k)
                    tile_bytes = depth * NWIN * item
                    w_base = w_addr + (g * t_w * Cg + c0) * R * S * NF * item
                    w_tile_bytes = Cg * R * S * NF * item   # stride between filter tiles
                    out_base = out_addr + (n * K + g * Kg) * PQ * item
                    x_base = x_addr + (n * C + g * Cg + c0) * PQ * item   # unpacked 1x1 only
                    window_args = (R, S, sh, sw, dh, dw, pt, pl, Q)

                    def pack_tile(p0, nwin_used, dst):
                        code.call(pack, x_addr, C, H, W, n, g * Cg + c0, nc, p0, nwin_used,
                                  *window_args, dst, NWIN, copy_rows, copy_taps)

                    with code.if_(slab & packing):
                        code.call(define_fill_slab(module, dtype),
                                  x_addr + (n * C + g * Cg + c0) * H * W * item,
                                  H * W * item, H, W, nc, sh, sw, Hb, Ws, row0,
                                  code.min(Hb, Hs - row0), pt, pl, planes, scratch_addr,
                                  fill_width, copy_rows)
                    with code.range(outer_lo, outer_hi, outer_step) as outer:
                        with code.range(inner_lo, inner_hi, inner_step) as inner:
                            wb = code.choose(input_stationary, outer, inner)
                            fb = code.choose(input_stationary, inner, outer)
                            wend, fend = code.min(b1, wb + w_block), code.min(f_hi, fb + f_block)
                            # with filters in vectors the block's window tiles are packed
                            # together before the filter tiles sweep them (WS), or before the
                            # first filter block does (IS; K3 tiles stay packed)
                            ahead = filters_in_vectors & (~input_stationary | (inner == inner_lo))
                            with code.if_(ahead & packing & ~slab):
                                with code.range(wb, wend) as wt:
                                    p0 = wt * NWIN
                                    with code.if_(~unpacked | (p0 + NWIN > PQ)):
                                        pack_tile(p0, code.min(NWIN, PQ - p0),
                                                  scratch_addr + (wt - wb) * tile_bytes)

                            def window_tile(wt, row, tile):
                                """Set ``tile`` (Vars: the input tile's address and row
                                stride, windows used, C's first window, and for a slab its
                                column on that row) to window tile ``wt``'s, a direct one at
                                ``row`` (Vars: its output row, tile in the row and first
                                column, stepped here to the next tile's); with windows in
                                vectors, pack it for the block's filter tiles (WS; they use
                                it in turn while it is hot in L1), or on the first pass over
                                the filter blocks (IS)."""
                                in_addr, ld_in, nwin_used, c_at, col0 = tile
                                p0 = wt * NWIN
                                slot = code.choose(slots > 1, wt - wb, 0)   # see scratch_tiles
                                in_addr.set(scratch_addr + slot * tile_bytes)
                                ld_in.set(NWIN)
                                nwin_used.set(code.min(NWIN, windows - p0))
                                c_at.set(p0)
                                col0.set(0)
                                in_place = ~direct & ~slab & unpacked & (p0 + NWIN <= PQ)
                                with code.if_(direct):   # the tile's windows: part of one row
                                    oh, j, ow0 = row
                                    ow1 = row_column(j + 1, row_tiles, Q)
                                    in_addr.set(scratch_addr + ((oh - row0) * Ws + ow0) * item)
                                    nwin_used.set(ow1 - ow0)
                                    c_at.set(oh * Q + ow0)
                                    row_end = j + 1 == row_tiles   # the next tile's, along it
                                    oh.set(oh + code.choose(row_end, 1, 0))
                                    j.set(code.choose(row_end, 0, j + 1))
                                    ow0.set(code.choose(row_end, 0, ow1))
                                with code.if_(slab & ~direct):
                                    in_addr.set(scratch_addr + (p0 - row0 * Ws) * item)
                                    c_at.set(p0 // Ws * Q)
                                    col0.set(p0 % Ws)
                                with code.if_(in_place):
                                    in_addr.set(x_base + p0 * item)
                                    ld_in.set(PQ)
                                with code.if_(~direct & ~slab & ~in_place & ~filters_in_vectors
                                              & packing
                                              & ((inner == inner_lo) | ~input_stationary)):
                                    pack_tile(p0, nwin_used, in_addr)

                            def call_kernel(ft, tile):
                                """The kernel on filter tile ``ft`` and the window tile."""
                                in_addr, ld_in, nwin_used, c_at, col0 = tile
                                f0 = ft * NF
                                w_tile = w_base + ft * w_tile_bytes
                                with code.if_(kernels):
                                    with code.if_else(filters_in_vectors) as (transposed, plain):
                                        with transposed:
                                            kernel = code.choose(
                                                (tail_kernel != 0) & (nwin_used < NWIN),
                                                tail_kernel, ukernel)
                                            c_t = out_t_addr + ((c_at - p_lo) * K + g * Kg
                                                                + f0) * item
                                            code.call(
                                                (kernel, outer_product.FUNCTION_TYPE), depth, w_tile,
                                                NF, in_addr, ld_in, c_t, K, code.min(NF, Kg - f0),
                                                nwin_used, bias_addr, flags, rows_addr, 0, 0, 0,
                                                params)
                                        with plain:
                                            code.call(
                                                (ukernel, outer_product.FUNCTION_TYPE), depth, in_addr,
                                                ld_in, w_tile, NF,
                                                out_base + (f0 * PQ + c_at) * item, PQ,
                                                nwin_used, code.min(NF, Kg - f0),
                                                bias_addr + (g * Kg + f0) * item, flags,
                                                rows_addr, col0, Ws, Ws - Q, params)

                            # the vector operand's tile stays in L1 while the broadcast
                            # operand's tiles stream past it: filter tiles innermost with
                            # windows in vectors (each window tile set up once for them),
                            # window tiles innermost with filters in vectors (a direct tile's
                            # row stepped along: a division per call costs a shallow kernel
                            # call up to a tenth of its time)
                            with code.range(code.choose(filters_in_vectors, fb, wb),
                                            code.choose(filters_in_vectors, fend, wend)) as a:
                                row = code.var(), code.var(), code.var()
                                with code.if_(direct):
                                    row[0].set(wb // row_tiles)
                                    row[1].set(wb % row_tiles)
                                    row[2].set(row_column(wb % row_tiles, row_tiles, Q))
                                tile = tuple(code.var() for _ in range(5))
                                with code.if_(~filters_in_vectors):
                                    window_tile(a, row, tile)
                                with code.range(code.choose(filters_in_vectors, wb, fb),
                                                code.choose(filters_in_vectors, wend, fend)) as b:
                                    with code.if_(filters_in_vectors):
                                        window_tile(b, row, tile)
                                    call_kernel(code.choose(filters_in_vectors, a, b), tile)
            with code.if_(filters_in_vectors & post):
                # the band's out[n, k, p] = act(out_t[p - p_lo, k] (+ bias[k])) while its rows
                # are hot in L2, one vector-square block at a time (the part's filters: a plan
                # splits the filters of one group only, in whole filter tiles)
                p_hi = code.cond(b1 < t_in, lambda: first_window(code, b1, row_tiles, Q, NWIN),
                                 lambda: PQ)
                k_lo = code.choose(G == 1, f_lo * NF, 0)
                k_hi = code.choose(G == 1, code.min(K, f_hi * NF), K)
                with code.range(p_lo, p_hi, LANES) as p0:
                    with code.range(k_lo, k_hi, LANES) as k0:
                        code.call((transpose_block, transpose.FUNCTION_TYPE),
                                  out_t_addr + ((p0 - p_lo) * K + k0) * item, K,
                                  out_base_n + (k0 * PQ + p0) * item, PQ,
                                  code.min(LANES, p_hi - p0), code.min(LANES, k_hi - k0),
                                  bias_addr + k0 * item, epilogue, params)
    code.ret()
    return code.function


def loop_nest(plan):
    """The generator of ``plan``'s loop nest (see ``define_conv_loop_nest``)."""
    return define_conv_loop_nest


def rows_elements(plan):
    """The int64 row offsets a slab kernel reads (one channel tile's), else none."""
    return plan.nc * plan.spec.r * plan.spec.s if plan.slab else 0


def out_t_elements(plan):
    """With filters in vectors, the transposed output of one band, else none."""
    return plan.band_buffers[1]


def output_parts(plan):
    """The plan's output parts (``parts``: window parts x filter parts) as the loop nest's
    ``part`` vectors: window tiles over all images in near-equal runs of whole units (output
    rows for a direct plan, else tiles), filter tiles in near-equal runs."""
    units = plan.window_units
    per_unit = plan.row_tiles or 1
    a, b = plan.parts
    return np.array([(units * i // a * per_unit, units * (i + 1) // a * per_unit,
                      plan.filter_tiles * j // b, plan.filter_tiles * (j + 1) // b)
                     for i in range(a) for j in range(b)], np.int64)
