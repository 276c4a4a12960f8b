"""Filter packing, done once per weight tensor (model load time).

Layout (G, T_w, C_g, R, S, Nf): for each group and tile of Nf filters, for each (c, r, s), the Nf
filter values the micro-kernel broadcasts, contiguous. Filters past K_g in the last tile are zero.
Any channel tile [c0, c0 + Nc) of a filter tile is the contiguous block starting at c0*R*S*Nf, so
the packed form does not depend on the channel tile CSA picks (nor on the input shape).
"""
from math import ceil

import numpy as np

from microkernels.aligned import aligned_empty


def packed_filters_shape(weight_shape, nf, groups):
    k, c_g, r, s = weight_shape
    return (groups, ceil(k // groups / nf), c_g, r, s, nf)


def pack_filters(w, nf, groups=1):
    """Pack OIHW weights ``w`` (K x C/groups x R x S) into tiles of ``nf`` filters; returns a
    C-contiguous array of ``packed_filters_shape`` in w's dtype, starting on a cache line: the
    kernels load its filter vectors whole, and a vector across two lines is two loads."""
    k, c_g, r, s = w.shape
    k_g = k // groups
    shape = packed_filters_shape(w.shape, nf, groups)
    # written tile by tile into the packed array, the last tile's missing filters left zero:
    # a padded copy of the weights first would cost their bytes again at load time (a
    # classifier of 1000 filters in tiles of 16: MobileNet v3's peak)
    packed = aligned_empty(shape, w.dtype)
    full = k_g // nf
    # (G, T_w*Nf, C, R, S) -> (G, T_w, Nf, C, R, S) -> (G, T_w, C, R, S, Nf)
    filters = w.reshape(groups, k_g, c_g, r, s)
    packed[:, :full] = filters[:, :full * nf].reshape(groups, full, nf, c_g, r, s).transpose(
        0, 1, 3, 4, 5, 2)
    if full < shape[1]:
        packed[:, full] = 0
        packed[:, full, ..., :k_g - full * nf] = filters[:, full * nf:].transpose(0, 2, 3, 4, 1)
    return packed


REPACK_BYTES = 8 << 20   # of filters unpacked at a time by repack_filters


def repack_filters(packed, k, nf, groups=1):
    """``pack_filters`` of the K filters ``packed`` holds (in tiles of any size), in tiles of
    ``nf``, unpacking a few MiB of them at a time: VGG-19's 4096 x 25088 classifier, packed
    again for another batch size, took a 392 MiB unpacked copy besides the two packings.
    Every tile of the result is written by one chunk's ``pack_filters``."""
    g, _, c_g, r, s, old_nf = packed.shape
    k_g = k // groups
    out = aligned_empty(packed_filters_shape((k, c_g, r, s), nf, groups), packed.dtype)
    step = max(1, REPACK_BYTES // (nf * g * c_g * r * s * packed.itemsize))   # new tiles a chunk
    for t0 in range(0, out.shape[1], step):
        first, end = t0 * nf, min((t0 + step) * nf, k_g)   # the chunk's filters in each group
        o0 = first // old_nf                                  # the old tile holding the first
        held = unpack_filters(packed[:, o0:-(-end // old_nf)], (end - o0 * old_nf) * groups)
        chunk = held.reshape(g, -1, c_g, r, s)[:, first - o0 * old_nf:]
        out[:, t0:t0 + -(-(end - first) // nf)] = pack_filters(chunk.reshape(-1, c_g, r, s), nf,
                                                               groups)
    return out


def unpack_filters(packed, k):
    """Inverse of ``pack_filters``: the K x C/groups x R x S weights."""
    groups, t_w, c_g, r, s, nf = packed.shape
    k_g = k // groups
    tiles = packed.transpose(0, 1, 5, 2, 3, 4).reshape(groups, t_w * nf, c_g, r, s)
    return np.ascontiguousarray(tiles[:, :k_g].reshape(k, c_g, r, s))


def other_group(dtype):
    """The value of all bits set in ``dtype`` (float32 or float64), a NaN of the sign bit,
    which ``merge_groups`` writes at a filter's other groups' channels."""
    dtype = np.dtype(dtype)
    return np.array(-1, f"i{dtype.itemsize}").view(dtype)[()]


def merge_groups(w, groups, m):
    """OIHW weights ``w`` of ``groups`` groups as those of groups // ``m`` groups, each the
    ``m`` consecutive groups it merges (block-diagonal): a filter's weights at its own
    group's channels, ``other_group`` (a NaN of the sign bit) at the others', where the
    merged kernels (``KernelSpec.merged``) mask their FMAs off. Read as zeros, the
    convolution, filters and output channels in the same order, is the same; its own NaNs
    are made positive, to stay its own."""
    k, c_g = w.shape[:2]
    merged = np.full((k, m * c_g) + w.shape[2:], other_group(w.dtype), w.dtype)
    own = np.where(np.isnan(w), np.array(np.nan, w.dtype), w)
    place = np.arange(k) // (k // groups) % m   # each filter's group's place in its merge
    for j in range(m):
        merged[place == j, j * c_g:(j + 1) * c_g] = own[place == j]
    return merged
