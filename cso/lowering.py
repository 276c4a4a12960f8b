"""Lowering: the compiled macro-kernel loop nest (IS and WS orders) around one micro-kernel.

One loop nest is compiled per KernelSpec (dtype, micro-tile, ISA); every shape, stride, padding,
dilation, group count and tiling is a run-time argument, so a model with many distinct
convolutions compiles it once. No Python runs per tile: packing and micro-kernel calls happen
inside the numba-compiled function.
"""
from functools import lru_cache

import numpy as np
from numba import njit, types
from numba.np.numpy_support import from_dtype

from microkernels import ACCUMULATE
from microkernels.numba_bridge import kernel_intrinsic, row_copy_intrinsic
from packing import input_packer

# Layout of the int64 ``geom`` vector passed to the loop nest: the first nine entries are the
# window geometry the input packer reads.
GEOM_FIELDS = ("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q",
               "P", "groups", "Cg", "Kg", "nc", "k2", "k3", "is_input_stationary", "epilogue",
               "unpacked")


def reads_input_unpacked(spec):
    """1x1, stride 1, no padding: the NCHW input already is the C x (H*W) matrix the kernel
    streams, so full window tiles need no packing."""
    return (spec.r, spec.s, spec.stride, spec.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def geometry(plan, epilogue_flags):
    """The ``geom`` vector for ``plan``; ``epilogue_flags`` (BIAS | RELU) apply on the last
    channel tile."""
    s = plan.spec
    values = dict(R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
                  pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, groups=s.groups,
                  Cg=s.c_per_group, Kg=s.k_per_group, nc=plan.nc, k2=plan.k2, k3=plan.k3,
                  is_input_stationary=int(plan.schedule == "IS"), epilogue=epilogue_flags,
                  unpacked=int(reads_input_unpacked(s)))
    return np.array([values[f] for f in GEOM_FIELDS], dtype=np.int64)


def scratch_elements(plan):
    """Packed input tiles held at once: K2 for WS; for IS, K3 when several filter blocks reuse
    them, else one."""
    s = plan.spec
    if plan.schedule == "IS":
        tiles = plan.k3 if plan.filter_tiles > plan.k2 else 1
    else:
        tiles = plan.k2
    return tiles * plan.nwin * plan.nc * s.r * s.s


def loop_nest_signature(dtype):
    """One explicit signature: inputs typed read-only (a writeable array converts to it), so
    read-only, writeable, sliced or copied arguments never trigger another compilation."""
    def array(ndim, dt=from_dtype(dtype), readonly=False):
        return types.Array(dt, ndim, "C", readonly=readonly)
    return types.void(array(4, readonly=True), array(1, readonly=True), array(1, readonly=True),
                      array(4), array(1, types.int64, readonly=True), array(1))


@lru_cache(maxsize=None)
def conv_loop_nest(kspec):
    """The compiled ``run(x, packed_w, bias, out, geom, scratch)`` for micro-kernel ``kspec``."""
    ukernel = kernel_intrinsic(kspec)
    pack = input_packer(row_copy_intrinsic(kspec), kspec.nwin)
    NWIN, NF = kspec.nwin, kspec.nf

    @njit(loop_nest_signature(kspec.np_dtype), nogil=True)
    def run(x, packed_w, bias, out, geom, scratch):
        R, S = geom[0], geom[1]
        Q, P, G, Cg, Kg = geom[8], geom[9], geom[10], geom[11], geom[12]
        nc_max, k2, k3, input_stationary = geom[13], geom[14], geom[15], geom[16]
        epilogue, unpacked = geom[17], geom[18]
        N, C, K = x.shape[0], x.shape[1], out.shape[1]
        PQ = P * Q
        t_in = (PQ + NWIN - 1) // NWIN
        t_w = (Kg + NF - 1) // NF
        item = x.itemsize
        x_addr, w_addr, out_addr = x.ctypes.data, packed_w.ctypes.data, out.ctypes.data
        bias_addr, scratch_addr = bias.ctypes.data, scratch.ctypes.data
        # blocks: IS = K3 window tiles (packed together) x K2 filter tiles;
        #         WS = K3 filter tiles x K2 window tiles (packed together)
        w_block, f_block = (k3, k2) if input_stationary else (k2, k3)
        for n in range(N):
            for g in range(G):
                for c0 in range(0, Cg, nc_max):
                    nc = min(nc_max, Cg - c0)
                    flags = ACCUMULATE if c0 > 0 else 0
                    if c0 + nc == Cg:
                        flags |= epilogue
                    depth = nc * R * S                      # rows of the packed tiles (kernel k)
                    tile_bytes = depth * NWIN * item
                    w_base = w_addr + (g * t_w * Cg + c0) * R * S * NF * item
                    w_tile_bytes = Cg * R * S * NF * item   # stride between filter tiles
                    out_base = out_addr + (n * K + g * Kg) * PQ * item
                    x_base = x_addr + ((n * C + g * Cg + c0) * PQ) * item   # unpacked 1x1 only
                    for outer in range(0, t_in if input_stationary else t_w,
                                       w_block if input_stationary else f_block):
                        for inner in range(0, t_w if input_stationary else t_in,
                                           f_block if input_stationary else w_block):
                            wb, fb = (outer, inner) if input_stationary else (inner, outer)
                            wend, fend = min(t_in, wb + w_block), min(t_w, fb + f_block)
                            if not input_stationary:
                                # WS: the K2 window tiles are packed together, then every filter
                                # tile of the K3 block streams over them
                                for wt in range(wb, wend):
                                    p0 = wt * NWIN
                                    if not unpacked or p0 + NWIN > PQ:
                                        pack(x, n, g * Cg + c0, nc, p0, min(NWIN, PQ - p0), geom,
                                             scratch_addr + (wt - wb) * tile_bytes)
                            for wt in range(wb, wend):
                                p0 = wt * NWIN
                                # IS keeps the K3 packed tiles only when several filter blocks
                                # reuse them; else one slot, still hot in L1 when used
                                slot = wt - wb if (not input_stationary or t_w > f_block) else 0
                                a_addr, lda = scratch_addr + slot * tile_bytes, NWIN
                                if unpacked and p0 + NWIN <= PQ:
                                    a_addr, lda = x_base + p0 * item, PQ
                                elif input_stationary and inner == 0:
                                    # IS packs on the first pass over the filter blocks, right
                                    # before the tile's first use
                                    pack(x, n, g * Cg + c0, nc, p0, min(NWIN, PQ - p0), geom, a_addr)
                                for ft in range(fb, fend):
                                    f0 = ft * NF
                                    ukernel(depth, a_addr, lda, w_base + ft * w_tile_bytes, NF,
                                            out_base + (f0 * PQ + p0) * item, PQ,
                                            min(NWIN, PQ - p0), min(NF, Kg - f0),
                                            bias_addr + (g * Kg + f0) * item, flags)

    return run


class Prepared:
    """A plan bound to its compiled loop nest and ``geom`` vector: what a call on one input
    shape needs besides the data. ``epilogue_flags`` (BIAS | RELU) apply on the last channel
    tile."""

    def __init__(self, plan, epilogue_flags):
        self.plan = plan
        self.geom = geometry(plan, epilogue_flags)
        self.scratch_elements = scratch_elements(plan)

    def run(self, kspec, x, packed_w, bias, out):
        """``x`` 4-D C-contiguous (N >= 1), ``packed_w`` from ``packing.pack_filters`` with
        ``kspec.nf``, ``bias`` 1-D (length K, or empty for none), ``out`` 4-D C-contiguous of
        the output shape. The scratch for packed tiles is per call: concurrent calls share
        nothing."""
        scratch = np.empty(self.scratch_elements, dtype=x.dtype)
        conv_loop_nest(kspec)(x, packed_w.reshape(-1), bias, out, self.geom, scratch)
