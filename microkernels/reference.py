"""The micro-kernel contract in plain NumPy: the reference every generated kernel is tested against."""
import numpy as np

from .ir_gen import ACCUMULATE, BIAS, RELU


def reference_kernel(spec, k, a, b, c, ldc, nwin_used, nf_used, bias=None, flags=0, lda=None,
                     ldb=None):
    """C rows f < nf_used, windows < nwin_used: (C +) A^T B (+ bias), optionally ReLU."""
    lda = spec.nwin if lda is None else lda
    ldb = spec.nf if ldb is None else ldb
    A = np.stack([a[i * lda: i * lda + nwin_used] for i in range(k)])
    B = np.stack([b[i * ldb: i * ldb + nf_used] for i in range(k)])
    tile = (B.T @ A).astype(spec.np_dtype)
    for f in range(nf_used):
        row = c[f * ldc: f * ldc + nwin_used]
        val = tile[f] + row if flags & ACCUMULATE else tile[f]
        if flags & BIAS:
            val = val + bias[f]
        if flags & RELU:
            val = np.where(val < 0, 0, val)
        row[...] = val
