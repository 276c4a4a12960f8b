"""Lowering: a slicing plan to its loop nest (``loop_nests``: one per variant), the run-time
arguments that loop nest reads (``geom``), its workspaces and its output parts.

A loop nest is generated per variant and dtype (``microkernels.loop_ir``) as the C entry every
call runs its parts through (``cso.entry``): the micro-kernel (its tile and ISA), every shape,
stride, padding, dilation, group count, tiling and the schedule are run-time arguments
(``geom``), the kernel and packing functions called through their addresses, so a model with
many distinct convolutions compiles each variant it uses once. No Python runs per tile:
packing and micro-kernel calls happen inside the compiled function.
"""
from dataclasses import replace

import numpy as np

from csa.bands import band_buffers
from csa.layout import subsampled
from csa.thread_split import filter_part, group_runs
from csa.variants import last_tile_lanes

from microkernels import KernelSpec, TransposeSpec, outer_product, row_copy, transpose
from microkernels.spec import STORE_ACTIVATION
from microkernels.jit import native_function
from microkernels.dtypes import dtype_name
from packing import row_copier, tile_copiers

from .loop_nests import (ALL_PHASES, GEOM, define_filters_blocked, define_filters_direct,
                         define_filters_packed, define_windows_packed, define_windows_slab)


def geom_fields(plan):
    """The ``Geom`` of ``plan``'s loop nest's ``geom`` vector (every slicing loop nest's)."""
    return GEOM


def geometry(plan, kspec, epilogue_flags, params, in_block=1, out_block=1):
    """The ``geom`` vector for ``plan`` around micro-kernel ``kspec`` (``kernel_spec``),
    compiling the functions it calls on first use; ``epilogue_flags`` (BIAS | ACTIVATE) apply
    on the last channel tile (with filters in vectors, in the transposing pass), ACCUMULATE on
    the first: the output is added to what ``out`` holds (a residual) rather than written.
    ``params``: the address of the activation's parameters (``kspec.activation``'s), which the
    caller keeps. A blocked plan's input has ``in_block`` channels a block (1: NCHW; C:
    channels last), its output ``out_block`` (the lanes; K: channels last; 1: NCHW, each
    band's output transposed into the planes while hot, as with filters in vectors)."""
    s = plan.spec
    hs, ws = plan.slab_shape
    hb = plan.band_rows
    if plan.blocked and plan.reads_input_unpacked:   # the kernel's rows on the input's blocks
        hb, ws = s.h, s.w
    # the transposing pass's transpose (with the epilogue): filters in vectors, and a blocked
    # plan's NCHW output (whose slab of NCHW planes it fills too, with no epilogue)
    transposes_output = (plan.vectors_along == "filters" and not plan.blocked
                         or plan.blocked and out_block == 1)
    # a slab is filled in runs of the kernel's vector width (whole vectors stored: a direct
    # tile's few windows made every store a masked one, microcoded on AMD), tiles per window
    fill_width = kspec.width
    copy_rows, copy_taps = ((0, 0) if plan.blocked   # (its slab rows copied whole)
                            else (row_copier(kspec, fill_width), 0) if plan.slab
                            else tile_copiers(kspec, plan.nwin, s.s, s.stride[1], s.dilation[1]))
    return GEOM.pack(
        R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
        pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, groups=s.groups, Cg=s.c_per_group,
        Kg=s.k_per_group, nc=plan.nc, k2=plan.k2, k3=plan.k3,
        is_input_stationary=plan.schedule == "IS", epilogue=epilogue_flags,
        unpacked=plan.reads_input_unpacked, phases=ALL_PHASES, Hs=hs, Ws=ws,
        windows=plan.window_positions, slots=scratch_tiles(plan), band=plan.band,
        Hb=hb, planes=plan.slab_planes, row_tiles=plan.row_tiles, nwin=plan.nwin,
        nf=plan.nf, lanes=kspec.lanes,
        kernel=native_function(outer_product.define_kernel, kspec).address,
        transpose=(native_function(transpose.define_transpose,
                                   TransposeSpec(kspec.dtype, kspec.isa, kspec.activation)).address
                   if transposes_output
                   # (a blocked plan's slab of NCHW planes: their block transposes)
                   else native_function(transpose.define_transpose,
                                        TransposeSpec(kspec.dtype, kspec.isa)).address
                   if plan.blocked and in_block == 1 else 0),
        copy_rows=copy_rows, copy_taps=copy_taps, fill_width=fill_width,
        tail_kernel=tail_kernel(plan, kspec), **filter_tail_kernels(plan, kspec),
        params=params, in_block=in_block,
        out_block=out_block, subsample=plan.blocked and subsampled(s))


def tail_kernel(plan, kspec):
    """The address of the kernel of a direct plan's short tiles, when its rows do not divide
    into tiles of nwin: the rows' tiles are evened out (``csa.layout.balanced_row_windows``),
    some of nwin - 1 windows, which this kernel computes without padding their FMAs; else 0."""
    short = plan.direct and plan.spec.q % plan.row_tiles
    return (native_function(outer_product.define_kernel,
                            replace(kspec, broadcasts=plan.nwin - 1)).address if short else 0)


def filter_tail_kernels(plan, kspec):
    """With filters in vectors (not on blocks), the kernels of a group's last filter tile
    where its filters fill fewer vectors than a tile's (112 filters: three tiles of 32 and
    one of 16, not 128 lanes of FMAs), for full and (direct) short window tiles; else 0."""
    width = last_tile_lanes(plan.spec.k_per_group, plan.nf, kspec.lanes)
    if plan.vectors_along != "filters" or plan.blocked or not 0 < width < plan.nf:
        return {"filter_tail_kernel": 0, "filter_tail_short_kernel": 0}
    narrow = replace(kspec, width=width)
    short = tail_kernel(plan, narrow)
    return {"filter_tail_kernel": native_function(outer_product.define_kernel, narrow).address,
            "filter_tail_short_kernel": short}


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
    if plan.blocked:
        return plan.band_buffers[0] and plan.band_buffers[0] + slack
    if plan.slab:
        return plan.band_buffers[0] + plan.slab_shape[1] + plan.nwin + slack
    return scratch_tiles(plan) * plan.nwin * plan.nc * s.r * s.s + slack


def kernel_spec(plan, isa, activation=STORE_ACTIVATION):
    """The micro-kernel a plan runs: windows x filters when windows are the vector dimension,
    else filters (vector) x windows (broadcast). A slab plan's kernel reads its windows in
    place, as vectors ("slab") or as broadcasts ("direct"). With windows in vectors it
    prefetches the output rows of the window tiles after it (``plan.output_prefetch``), with
    filters in vectors the next filter tile (``plan.prefetch_filters``). Its store applies
    ``activation`` (a kind) on the ACTIVATE flag."""
    width, broadcasts = ((plan.nwin, plan.nf) if plan.vectors_along == "windows"
                         else (plan.nf, plan.nwin))
    return KernelSpec(dtype_name(plan.spec.dtype), broadcasts, width, isa, plan.variant,
                      plan.output_prefetch, activation, plan.prefetch_filters)


def loop_nest(plan):
    """The generator of ``plan``'s loop nest: its variant's (``loop_nests``)."""
    if plan.blocked:
        return define_filters_blocked
    if plan.vectors_along == "windows":
        return define_windows_slab if plan.slab else define_windows_packed
    return define_filters_direct if plan.slab else define_filters_packed


def rows_elements(plan):
    """The int64 row offsets a slab kernel reads (one channel tile's), else none."""
    return plan.nc * plan.spec.r * plan.spec.s if plan.slab else 0


def out_t_elements(plan, out_block=None):
    """With filters in vectors, the transposed output of one band (a group's), else none; a
    blocked plan writing NCHW planes (``out_block`` 1) needs one too, as a filters-in-vectors
    plan's (``csa.bands.band_buffers``)."""
    if plan.blocked and out_block == 1:
        return band_buffers(plan.spec, plan.nwin, plan.nc, plan.band, False, "filters")[1]
    return plan.band_buffers[1]


def output_parts(plan):
    """The plan's output parts (``parts``: window parts x filter parts) as the loop nest's
    ``part`` vectors: window tiles over all images in near-equal runs of whole units (output
    rows for a direct plan, else tiles), filter tiles numbered over all groups
    (``csa.thread_split.filter_part``: whole groups where there are enough). Filter part by
    filter part: the pool's lanes (``cso.pool``) give each thread a run of parts, so that a
    thread's window parts share its filters. A plan whose threads take runs of the groups
    (``plan.group_runs``) has each thread's rectangles of ``csa.thread_split.group_runs``, as
    many a thread."""
    units = plan.window_units
    per_unit = plan.row_tiles or 1
    if plan.group_runs:
        tiles = plan.filter_tiles
        return np.array([(u0 * per_unit, u1 * per_unit, g0 * tiles, g1 * tiles)
                         for run in group_runs(plan.spec.groups, units, plan.threads)
                         for u0, u1, g0, g1 in run], np.int64)
    a, b = plan.parts
    return np.array([(units * i // a * per_unit, units * (i + 1) // a * per_unit,
                      *filter_part(plan.spec.groups, plan.filter_tiles, b, j))
                     for j in range(b) for i in range(a)], np.int64)
