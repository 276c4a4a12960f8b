"""The micro-kernel contract in plain NumPy: the reference every generated kernel is tested against."""
import numpy as np

from .ir_gen import ACCUMULATE, BIAS, RELU


def stored_windows(nwin_used, col0=0, width=None, gap=0):
    """(windows, offsets): the windows a kernel stores and their element offsets in a C row.
    Without ``width`` (non-slab kernels) windows 0..nwin_used-1 at offsets 0..nwin_used-1; for
    a slab kernel, the windows on real columns of their virtual row at ``col0 + window``, the
    second row's ``gap`` elements earlier."""
    j = np.arange(nwin_used)
    if width is None:
        return j, j
    col = col0 + j
    second = col >= width
    real = np.where(second, col - width, col) < width - gap
    return j[real], (col - gap * second)[real]


def reference_kernel(spec, k, a, b, c, ldc, nwin_used, nf_used, bias=None, flags=0, lda=None,
                     ldb=None, a_rows=None, col0=0, width=None, gap=0):
    """C rows f < nf_used, stored windows: (C +) A^T B (+ bias), optionally ReLU. A's rows are
    at ``a_rows`` (element offsets) for a vector slab kernel, else every ``lda``; B's at
    ``a_rows`` for a broadcast slab kernel, else every ``ldb``."""
    lda = spec.nwin if lda is None else lda
    ldb = spec.nf if ldb is None else ldb
    a_starts = a_rows[:k] if spec.slab == "vector" else np.arange(k) * lda
    b_starts = a_rows[:k] if spec.slab == "broadcast" else np.arange(k) * ldb
    A = np.stack([a[i: i + nwin_used] for i in a_starts])
    B = np.stack([b[i: i + nf_used] for i in b_starts])
    tile = (B.T @ A).astype(spec.np_dtype)
    windows, offsets = stored_windows(nwin_used, col0, width if spec.slab == "vector" else None, gap)
    for f in range(nf_used):
        at = f * ldc + offsets
        val = tile[f, windows] + c[at] if flags & ACCUMULATE else tile[f, windows]
        if flags & BIAS:
            val = val + bias[f]
        if flags & RELU:
            val = np.where(val < 0, 0, val)
        c[at] = val
