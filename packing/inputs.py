"""Input-tile packing, done on the fly inside the compiled loop nest.

A packed input tile holds, for each (c, r, s) of a channel tile, the ``nwin`` window values the
micro-kernel loads as vectors. Windows are flattened over the output plane (window j of a tile
starting at p0 is output position p0 + j, row (p0 + j) // Q, column (p0 + j) % Q), so a tile can
span several output rows. Zero padding is produced here: out-of-image taps and windows past the
end of the plane are written as zeros, and the input is never copied whole.

The copy goes by runs of windows that share an output row: for a fixed (c, r, s) such a run reads
one input row at stride ``sw``, and the part of it inside the image is a plain strided copy
(contiguous for stride 1, which LLVM vectorises), with zeros written on either side.
"""
from numba import njit


@njit(nogil=True, cache=True)
def pack_input_tile(x, n, c_first, nc, p0, nwin_used, geom, dst, off, nwin):
    """Pack windows p0 .. p0+nwin_used-1 of image ``n``, channels c_first .. c_first+nc-1 of the
    4-D C-contiguous input ``x`` into ``dst[off : off + nc*R*S*nwin]``; ``geom`` holds
    (R, S, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, Q)."""
    R, S, sh, sw, dh, dw, pt, pl, Q = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8]
    H, W = x.shape[2], x.shape[3]
    j = 0
    while j < nwin_used:
        p = p0 + j
        oh, ow0 = p // Q, p % Q
        run = min(Q - ow0, nwin_used - j)
        for c in range(nc):
            for r in range(R):
                ih = oh * sh - pt + r * dh
                for s in range(S):
                    base = off + ((c * R + r) * S + s) * nwin + j
                    iw0 = ow0 * sw - pl + s * dw
                    if ih < 0 or ih >= H:
                        lo = hi = run
                    else:
                        # windows t in [lo, hi) read inside the row: 0 <= iw0 + t*sw < W
                        lo = min(run, max(0, (-iw0 + sw - 1) // sw))
                        hi = max(lo, min(run, (W - iw0 + sw - 1) // sw))
                    for t in range(lo):
                        dst[base + t] = 0
                    for t in range(lo, hi):
                        dst[base + t] = x[n, c_first + c, ih, iw0 + t * sw]
                    for t in range(hi, run):
                        dst[base + t] = 0
        j += run
    if nwin_used < nwin:  # windows past the end of the output plane
        for crs in range(nc * R * S):
            for t in range(off + crs * nwin + nwin_used, off + (crs + 1) * nwin):
                dst[t] = 0
