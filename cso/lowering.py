"""Lowering: the compiled macro-kernel loop nest (IS and WS orders) around a micro-kernel.

One loop nest is compiled per dtype: the micro-kernel (its tile, ISA, slab or packed input),
the orientation (windows or filters in vectors), every shape, stride, padding, dilation,
group count and tiling are run-time arguments (``geom``), the kernel and packing functions
called through their addresses (``microkernels.numba_bridge``), so a model with many distinct
convolutions compiles it once. No Python runs per tile: packing and micro-kernel calls happen
inside the numba-compiled function.
"""
from dataclasses import replace

import numpy as np
from numba import njit

from csa.plan import (reads_input_unpacked, slab_band_rows, slab_planes, slab_shape,
                      window_positions, window_units)
from microkernels import ACCUMULATE, KernelSpec, ir_gen, row_copy, transpose
from microkernels.jit import native_function
from microkernels.numba_bridge import caller
from microkernels.once import compiled_once
from packing import fill_slab, pack_input_tile, row_copier, tile_copiers

# Layout of the int64 ``geom`` vector passed to the loop nest: the first nine entries are the
# window geometry the input packer reads; the last ones the micro-tile (nwin windows x nf
# filters), its kind and the addresses of the functions the loop nest calls.
GEOM_FIELDS = ("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q",
               "P", "groups", "Cg", "Kg", "nc", "k2", "k3", "is_input_stationary", "epilogue",
               "unpacked", "phases", "Hs", "Ws", "windows", "slots", "band", "Hb", "planes",
               "row_tiles", "nwin", "nf", "lanes", "slab", "direct", "filters_in_vectors",
               "kernel", "transpose", "copy_rows", "copy_taps", "slab_run", "tail_kernel")
call_kernel = caller(ir_gen.FUNCTION_TYPE)
call_transpose = caller(transpose.FUNCTION_TYPE)

# The loop nest's phases (geom "phases"): a call runs all of them; the benchmark's time
# breakdown runs some alone on the same tiles (ConvBench's packing / micro-kernel / post-conv).
PACK, KERNEL, POST = 1, 2, 4
ALL_PHASES = PACK | KERNEL | POST


def geometry(plan, kspec, epilogue_flags):
    """The ``geom`` vector for ``plan`` around micro-kernel ``kspec`` (``kernel_spec``),
    compiling the functions it calls on first use; ``epilogue_flags`` (BIAS | RELU) apply on
    the last channel tile (with filters in vectors, in the transposing pass)."""
    s = plan.spec
    hs, ws = slab_shape(s)
    filters_in_vectors = plan.vector == "filters"
    # a slab is filled in runs of the kernel's vector width (whole vectors stored: a direct
    # tile's few windows made every store a masked one, microcoded on AMD), tiles per window
    slab_run = kspec.nwin
    copy_rows, copy_taps = ((row_copier(kspec, slab_run), 0) if plan.slab
                            else tile_copiers(kspec, plan.nwin, s.s, s.stride[1], s.dilation[1]))
    unpacked = reads_input_unpacked(s, plan.vector, plan.machine.tuning)
    values = dict(Hs=hs, Ws=ws, windows=window_positions(s, plan.slab), slots=scratch_tiles(plan),
                  band=plan.band, Hb=slab_band_rows(s, plan.nwin, plan.band, plan.row_tiles),
                  planes=slab_planes(s), row_tiles=plan.row_tiles,
                  R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
                  pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, groups=s.groups,
                  Cg=s.c_per_group, Kg=s.k_per_group, nc=plan.nc, k2=plan.k2, k3=plan.k3,
                  is_input_stationary=int(plan.schedule == "IS"), epilogue=epilogue_flags,
                  unpacked=int(unpacked), phases=ALL_PHASES,
                  nwin=plan.nwin, nf=plan.nf, lanes=kspec.lanes, slab=int(plan.slab),
                  direct=int(kspec.slab == "broadcast"), filters_in_vectors=int(filters_in_vectors),
                  kernel=native_function(ir_gen.define_kernel, kspec).address,
                  transpose=(native_function(transpose.define_transpose, kspec).address
                             if filters_in_vectors else 0),
                  copy_rows=copy_rows, copy_taps=copy_taps, slab_run=slab_run,
                  tail_kernel=tail_kernel(plan, kspec))
    return np.array([values[f] for f in GEOM_FIELDS], dtype=np.int64)


def tail_kernel(plan, kspec):
    """The address of the kernel of a direct plan's last tile in each output row, when the row
    does not divide into tiles: a tile of Q % nwin windows (28 = 4*6 + 4: 4 x 16 there, where
    the row's tiles padded to 30 windows wasted 7% of the FMAs); else 0."""
    tail = plan.spec.q % plan.nwin if plan.direct else 0
    return native_function(ir_gen.define_kernel, replace(kspec, nf=tail)).address if tail else 0


def scratch_tiles(plan):
    """Packed input tiles held at once: one with windows in vectors, each packed right before
    the filter tiles of its block use it in turn (still hot in L1), unless IS sweeps it again
    for several filter blocks (then K3); with filters in vectors (window tiles innermost, packed
    ahead) K2 for WS, K3 for IS; none for a slab."""
    if plan.slab:
        return 0
    if plan.vector == "windows" and (plan.schedule == "WS" or plan.filter_tiles <= plan.k2):
        return 1
    return plan.k3 if plan.schedule == "IS" else plan.k2


def scratch_elements(plan):
    """The packed tiles, or a slab: one channel tile's padded planes, the rows of one output
    band (``csa.plan.slab_band_rows``), and a tail a row and a tile long (a band's last tile
    reads up to a tile past its last window, its padding columns a row further); then the
    slack the packers' blended stores may rewrite (``row_copy.SCRATCH_SLACK``)."""
    s = plan.spec
    slack = row_copy.SCRATCH_SLACK // s.itemsize
    if plan.slab:
        ws = slab_shape(s)[1]
        hb = slab_band_rows(s, plan.nwin, plan.band, plan.row_tiles)
        return plan.nc * s.stride[0] * s.stride[1] * hb * ws + ws + plan.nwin + slack
    return scratch_tiles(plan) * plan.nwin * plan.nc * s.r * s.s + slack


def kernel_spec(plan, isa):
    """The micro-kernel a plan runs: windows x filters when windows are the vector dimension,
    else filters (vector) x windows (broadcast): KernelSpec's ``nwin`` is always its vector
    width and ``nf`` its broadcast count. A slab plan's kernel reads its windows in place, as
    vectors or (direct) as broadcasts."""
    vector, broadcast = (plan.nwin, plan.nf) if plan.vector == "windows" else (plan.nf, plan.nwin)
    slab = ("broadcast" if plan.direct else "vector") if plan.slab else ""
    return KernelSpec.for_dtype(plan.spec.dtype, broadcast, vector, isa, slab)


@njit(nogil=True)
def slab_rows(rows, nc, R, S, sh, sw, dh, dw, Hs, Ws):
    """Offsets of the kernel's rows (c, r, s) on a slab of sh*sw phase planes of Hs x Ws per
    channel: tap (r, s) reads plane (r*dh % sh, s*dw % sw) shifted by (r*dh // sh, s*dw // sw)."""
    plane = Hs * Ws
    for c in range(nc):
        for r in range(R):
            for s in range(S):
                phase = (r * dh % sh) * sw + s * dw % sw
                rows[(c * R + r) * S + s] = ((c * sh * sw + phase) * plane
                                             + r * dh // sh * Ws + s * dw // sw)


@njit(nogil=True)
def first_window(tile, row_tiles, Q, nwin):
    """The output position (p = oh*Q + ow) of a window tile's first window: direct tiles lie
    ``row_tiles`` to an output row (``row_tiles`` > 0), other tiles back to back."""
    if row_tiles:
        return tile // row_tiles * Q + tile % row_tiles * nwin
    return tile * nwin


@compiled_once
def conv_loop_nest():
    """The loop nest ``run(x, packed_w, bias, out, geom, part, scratch, out_t, rows)`` (numba,
    compiled for the arrays of the C entry that calls it: ``cso.prepared``), around the
    micro-kernel ``geom`` names (``geometry``), computing the output part
    ``part`` = (first window tile, end window tile, first filter tile, end filter tile): window
    tiles numbered over all images (image n's tile t is n*T_in + t), filter tiles within each
    group. Parts share no output element and each
    element's channel tiles run in the same order whatever the part: parts run on several
    threads give the same result as one.

    With filters in vectors the kernel's vector operand is the filter tile and its
    broadcast operand the input tile; it accumulates one output band transposed (windows x K)
    in ``out_t``, which a pass at the end of the band turns into NCHW with bias and ReLU while
    it is hot in L2.

    A slab kernel packs no tiles: per output band, each channel tile's rows that the band reads
    are copied once, zero-padded and split into stride phases, into ``scratch`` (planes of
    Hb x Ws, see ``csa.plan.slab_shape`` and ``slab_band_rows``); the output rows lie on the
    Hs x Ws phase planes (the last Ws - Q columns padding), and the kernel reads its row
    (c, r, s) in place at the offset ``slab_rows`` gives from the band's first slab row. With
    windows in vectors a window tile is NWIN consecutive positions on the planes (straddling
    rows); in a direct plan (filters in vectors, a ``"broadcast"`` slab kernel) it is at most
    NWIN consecutive windows of one output row, ``row_tiles`` tiles to a row, each window
    broadcast from the slab.

    Output bands (``band`` window tiles): every channel tile of a band runs before the next
    band, so that the band's partial outputs stay in L2; the IS / WS blocks lie within a band."""
    def run(x, packed_w, bias, out, geom, part, scratch, out_t, rows):
        R, S = geom[0], geom[1]
        Q, P, G, Cg, Kg = geom[8], geom[9], geom[10], geom[11], geom[12]
        nc_max, k2, k3, input_stationary = geom[13], geom[14], geom[15], geom[16]
        epilogue, unpacked, phases = geom[17], geom[18], geom[19]
        Hs, Ws, windows, slots = geom[20], geom[21], geom[22], geom[23]   # slab planes (slab only)
        band, Hb = geom[24], geom[25]   # window tiles per output band; slab rows a band holds
        planes = geom[26]               # bit mask of the slab phase planes the taps read
        row_tiles = geom[27]            # window tiles per output row (direct only)
        NWIN, NF, LANES, slab, direct, filters_in_vectors = (geom[28], geom[29], geom[30],
                                                             geom[31], geom[32], geom[33])
        ukernel, transpose_block, copy_rows, copy_taps = geom[34], geom[35], geom[36], geom[37]
        slab_run = geom[38]             # width of the runs a slab is filled in
        tail_kernel = geom[39]          # a direct row's last tile when it is short (else 0)
        packing, kernels, post = phases & PACK, phases & KERNEL, phases & POST
        N, C, K = x.shape[0], x.shape[1], out.shape[1]
        PQ = P * Q
        sh, sw, dh, dw = geom[2], geom[3], geom[4], geom[5]
        # ``rows``: the slab kernel's row offsets (``rows_elements``), nothing allocated here
        if slab:
            slab_rows(rows, nc_max, R, S, sh, sw, dh, dw, Hb, Ws)
            scratch[nc_max * sh * sw * Hb * Ws:] = 0   # the tail the last tile reads past its end
        t_in = P * row_tiles if direct else (windows + NWIN - 1) // NWIN
        t_w = (Kg + NF - 1) // NF
        item = x.itemsize
        x_addr, w_addr, out_addr = x.ctypes.data, packed_w.ctypes.data, out.ctypes.data
        bias_addr, scratch_addr = bias.ctypes.data, scratch.ctypes.data
        out_t_addr = out_t.ctypes.data
        # blocks: IS = K3 window tiles x K2 filter tiles; WS = K3 filter tiles x K2 window tiles
        w_block, f_block = (k3, k2) if input_stationary else (k2, k3)
        f_lo, f_hi = part[2], part[3]
        for n in range(part[0] // t_in, min(N, (part[1] + t_in - 1) // t_in)):
            out_base_n = out_addr + n * K * PQ * item
            t_lo, t_hi = max(0, part[0] - n * t_in), min(t_in, part[1] - n * t_in)
            # output bands: all channel tiles of a band's window tiles before the next band, so
            # that its partial outputs stay in L2
            for b0 in range(t_lo, t_hi, band):
                b1 = min(t_hi, b0 + band)
                # the band's first slab row, and first window (out_t holds the band's windows)
                row0 = b0 // row_tiles if direct else b0 * NWIN // Ws if slab else 0
                p_lo = first_window(b0, row_tiles, Q, NWIN)
                if input_stationary:   # window blocks of the band, then filter blocks
                    outer_lo, outer_hi, outer_step = b0, b1, w_block
                    inner_lo, inner_hi, inner_step = f_lo, f_hi, f_block
                else:                  # filter blocks, then window blocks of the band
                    outer_lo, outer_hi, outer_step = f_lo, f_hi, f_block
                    inner_lo, inner_hi, inner_step = b0, b1, w_block
                for g in range(G):
                    for c0 in range(0, Cg, nc_max):
                        nc = min(nc_max, Cg - c0)
                        flags = ACCUMULATE if c0 > 0 else 0
                        if c0 + nc == Cg and not filters_in_vectors:
                            flags |= epilogue
                        depth = nc * R * S                   # rows of the packed tiles (kernel k)
                        tile_bytes = depth * NWIN * item
                        w_base = w_addr + (g * t_w * Cg + c0) * R * S * NF * item
                        w_tile_bytes = Cg * R * S * NF * item   # stride between filter tiles
                        out_base = out_addr + (n * K + g * Kg) * PQ * item
                        x_base = x_addr + (n * C + g * Cg + c0) * PQ * item   # unpacked 1x1 only
                        if slab and packing:
                            fill_slab(x, n, g * Cg + c0, nc, sh, sw, Hb, Ws, row0,
                                      min(Hb, Hs - row0), geom[6], geom[7], planes, scratch_addr,
                                      slab_run, copy_rows)
                        for outer in range(outer_lo, outer_hi, outer_step):
                            for inner in range(inner_lo, inner_hi, inner_step):
                                wb, fb = (outer, inner) if input_stationary else (inner, outer)
                                wend, fend = min(b1, wb + w_block), min(f_hi, fb + f_block)
                                # with filters in vectors the block's window tiles are packed
                                # together before the filter tiles sweep them (WS), or before the
                                # first filter block does (IS; K3 tiles stay packed)
                                ahead = filters_in_vectors and (not input_stationary
                                                                or inner == inner_lo)
                                for wt in range(wb, wend if ahead and packing and not slab else wb):
                                    p0 = wt * NWIN
                                    if not unpacked or p0 + NWIN > PQ:
                                        pack_input_tile(x, n, g * Cg + c0, nc, p0,
                                                        min(NWIN, PQ - p0), geom,
                                                        scratch_addr + (wt - wb) * tile_bytes,
                                                        NWIN, copy_rows, copy_taps)
                                # the vector operand's tile stays in L1 while the broadcast
                                # operand's tiles stream past it: filter tiles innermost with
                                # windows in vectors, window tiles innermost with filters in vectors
                                nw, nfb = wend - wb, fend - fb
                                for i in range(nw * nfb):
                                    if filters_in_vectors:
                                        ft, wt = fb + i // nw, wb + i % nw
                                    else:
                                        wt, ft = wb + i // nfb, fb + i % nfb
                                    p0 = wt * NWIN
                                    slot = wt - wb if slots > 1 else 0   # see scratch_tiles
                                    in_addr, ld_in = scratch_addr + slot * tile_bytes, NWIN
                                    # c_at: C's first window (slab: its output row, col0 on it)
                                    nwin_used, c_at, col0 = min(NWIN, windows - p0), p0, 0
                                    if direct:   # the tile's windows: part of one output row
                                        oh, ow0 = wt // row_tiles, wt % row_tiles * NWIN
                                        in_addr = scratch_addr + ((oh - row0) * Ws + ow0) * item
                                        nwin_used, c_at = min(NWIN, Q - ow0), oh * Q + ow0
                                    elif slab:
                                        in_addr = scratch_addr + (p0 - row0 * Ws) * item
                                        c_at = p0 // Ws * Q
                                        col0 = p0 % Ws
                                    elif unpacked and p0 + NWIN <= PQ:
                                        in_addr, ld_in = x_base + p0 * item, PQ
                                    elif (not filters_in_vectors and ft == fb and packing
                                          and (inner == inner_lo or not input_stationary)):
                                        # with windows in vectors a tile is packed right before
                                        # the block's filter tiles use it, in turn (WS; still
                                        # hot in L1), or on the first pass over the filter blocks (IS)
                                        pack_input_tile(x, n, g * Cg + c0, nc, p0, nwin_used,
                                                        geom, in_addr, NWIN, copy_rows, copy_taps)
                                    if not kernels:
                                        continue
                                    f0 = ft * NF
                                    w_tile = w_base + ft * w_tile_bytes
                                    if filters_in_vectors:
                                        c_t = out_t_addr + ((c_at - p_lo) * K + g * Kg + f0) * item
                                        kernel = (tail_kernel if tail_kernel and nwin_used < NWIN
                                                  else ukernel)
                                        call_kernel(kernel, depth, w_tile, NF, in_addr, ld_in,
                                                    c_t, K, min(NF, Kg - f0), nwin_used,
                                                    bias_addr, flags, rows.ctypes.data, 0, 0, 0)
                                    else:
                                        call_kernel(ukernel, depth, in_addr, ld_in, w_tile, NF,
                                                    out_base + (f0 * PQ + c_at) * item, PQ,
                                                    nwin_used, min(NF, Kg - f0),
                                                    bias_addr + (g * Kg + f0) * item, flags,
                                                    rows.ctypes.data, col0, Ws, Ws - Q)
                if filters_in_vectors and post:
                    # the band's out[n, k, p] = out_t[p - p_lo, k] (+ bias[k], ReLU) while its
                    # rows are hot in L2, one vector-square block at a time (the part's filters:
                    # a plan splits the filters of one group only, in whole filter tiles)
                    p_hi = first_window(b1, row_tiles, Q, NWIN) if b1 < t_in else PQ
                    k_hi = min(K, f_hi * NF) if G == 1 else K
                    for p0 in range(p_lo, p_hi, LANES):
                        for k0 in range(f_lo * NF if G == 1 else 0, k_hi, LANES):
                            call_transpose(transpose_block,
                                           out_t_addr + ((p0 - p_lo) * K + k0) * item, K,
                                           out_base_n + (k0 * PQ + p0) * item, PQ,
                                           min(LANES, p_hi - p0), min(LANES, k_hi - k0),
                                           bias_addr + k0 * item, epilogue)

    return njit(nogil=True)(run)


def loop_nest(plan):
    """The loop nest of ``plan`` (see ``conv_loop_nest``)."""
    return conv_loop_nest


def rows_elements(plan):
    """The int64 row offsets a slab kernel reads (one channel tile's), else none."""
    return plan.nc * plan.spec.r * plan.spec.s if plan.slab else 0


def out_t_elements(plan):
    """With filters in vectors, the transposed output of one band (at most band*Nwin windows
    of K filters), else none."""
    spec = plan.spec
    return min(spec.p * spec.q, plan.band * plan.nwin) * spec.k if plan.vector == "filters" else 0


def output_parts(plan):
    """The plan's output parts (``split``: window parts x filter parts) as the loop nest's
    ``part`` vectors: window tiles over all images in near-equal runs of whole units (output
    rows for a direct plan, else tiles), filter tiles in near-equal runs."""
    spec = plan.spec
    units = window_units(spec, plan.nwin, plan.slab, plan.vector)
    per_unit = plan.row_tiles or 1
    a, b = plan.split
    return np.array([(units * i // a * per_unit, units * (i + 1) // a * per_unit,
                      plan.filter_tiles * j // b, plan.filter_tiles * (j + 1) // b)
                     for i in range(a) for j in range(b)], np.int64)
