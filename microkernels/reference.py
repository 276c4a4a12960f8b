"""Every kernel family's contract in plain NumPy: the references generated kernels are tested
against. ``reference_kernel(spec)`` takes the same arguments as ``compile(spec)``
(``microkernels.wrappers``) and writes the same elements."""
import math

import numpy as np

from .ir import ACCUMULATE, ACTIVATE, BIAS
from .row_copy import TAP_STRIDES, max_taps
from .spec import (ACTIVATIONS, ActivationSpec, BlockedDepthwiseSpec, DepthwiseSpec, KernelSpec,
                   RowCopySpec, TapCopySpec, TransposeSpec)


def reference_kernel(spec):
    """The NumPy reference of kernel ``spec``: ``function(*args)`` as ``compile(spec)(*args)``."""
    function = REFERENCES[type(spec)]
    return lambda *args, **kwargs: function(spec, *args, **kwargs)


def _epilogue(spec, value, bias, flags, params):
    """(+ bias,) the spec's activation with ``params`` as the flags ask, in ``value``'s
    dtype."""
    if flags & BIAS:
        value = value + bias
    if not flags & ACTIVATE:
        return value
    return activation_values(spec.activation, value, params).astype(value.dtype)


def stored_windows(width_used, col0=0, row_width=None, gap=0):
    """(elements, offsets): the elements of a C row an outer-product kernel stores and their
    offsets in the row. Without ``row_width`` (not a slab kernel) 0..width_used-1 at offsets
    0..width_used-1; for a slab kernel, the windows on real columns of their virtual row at
    ``col0 + window``, the second row's ``gap`` elements earlier."""
    j = np.arange(width_used)
    if row_width is None:
        return j, j
    col = col0 + j
    second = col >= row_width
    real = np.where(second, col - row_width, col) < row_width - gap
    return j[real], (col - gap * second)[real]


def outer_product(spec, k, a, b, c, ldc, width_used, rows_used, bias=None, flags=0, lda=None,
                  ldb=None, slab_rows=None, col0=0, row_width=None, gap=0, params=(), ldv=None):
    """C rows f < rows_used, stored elements: act((C +) A^T B (+ bias)), a merged kernel's
    products at another group's lanes (``other_group_lanes``) dropped. A's rows
    are at ``slab_rows`` (element offsets) for a "slab" kernel, else every ``lda``; B's at
    ``slab_rows`` for a "direct" or "blocked" kernel, else every ``ldb``. A blocked kernel's
    broadcast f is ``ldb`` elements after f - 1, its element e of row f at ``f*ldc +
    (e // lanes)*ldv + e % lanes``, with bias[e]."""
    lda = spec.width if lda is None else lda
    ldb = spec.broadcasts if ldb is None else ldb
    blocked = spec.variant == "blocked"
    a_starts = slab_rows[:k] if spec.variant == "slab" else np.arange(k) * lda
    b_starts = slab_rows[:k] if spec.variant in ("direct", "blocked") else np.arange(k) * ldb
    step = ldb if blocked else 1
    A = np.stack([a[i: i + width_used] for i in a_starts])
    B = np.stack([b[i: i + rows_used * step: step] for i in b_starts])
    if spec.merged:   # each row's products at another group's lanes dropped
        with np.errstate(invalid="ignore"):
            products = B[:, :, None] * A[:, None, :]
            tile = np.where(other_group_lanes(A)[:, None, :], 0, products).sum(axis=0)
        tile = tile.astype(spec.np_dtype)
    else:
        tile = (B.T @ A).astype(spec.np_dtype)
    elements, offsets = stored_windows(width_used, col0,
                                       row_width if spec.variant == "slab" else None, gap)
    if blocked:
        offsets = elements // spec.lanes * ldv + elements % spec.lanes
    for f in range(rows_used):
        at = f * ldc + offsets
        value = tile[f, elements] + c[at] if flags & ACCUMULATE else tile[f, elements]
        row_bias = (bias[elements] if blocked else bias[f]) if flags & BIAS else 0
        c[at] = _epilogue(spec, value, row_bias, flags, params)


def other_group_lanes(filters):
    """Where a merged kernel's ``filters`` hold another group's lanes: a NaN of the sign bit
    (``packing.other_group``; ``KernelSpec.merged``)."""
    bits = filters.view(f"u{filters.itemsize}")
    return np.isnan(filters) & (bits >> (8 * filters.itemsize - 1) == 1)


def blocked_depthwise(spec, x, offsets, step, weights, out, bias=None, flags=0, params=()):
    """out[t*lanes + j] = act(sum_i x[offsets[i] + t*step + j] * weights[i*lanes + j]
    (+ bias[j])) for windows t < spec.windows and lanes j."""
    lanes, taps = spec.lanes, offsets.size
    j = np.arange(lanes)
    w = weights[:taps * lanes].reshape(taps, lanes).astype(np.float64)
    for t in range(spec.windows):
        value = (x[offsets[:, None] + t * step + j].astype(np.float64) * w).sum(axis=0)
        out[t * lanes + j] = _epilogue(spec, value, bias[:lanes] if flags & BIAS else 0,
                                       flags, params)


def depthwise(spec, slab, offsets, weights, out, positions, row_width, q, bias=None, flags=0,
              params=()):
    """out[v - (v // row_width) * (row_width - q)] = act(sum_t weights[t] * slab[v + offsets[t]]
    (+ bias[0])) for the positions v < ``positions`` on real columns (v % row_width < q)."""
    v = np.arange(positions)
    v = v[v % row_width < q]
    value = slab[v[:, None] + offsets[None, :]].astype(np.float64) @ weights.astype(np.float64)
    out[v - v // row_width * (row_width - q)] = _epilogue(
        spec, value, bias[0] if flags & BIAS else 0, flags, params)


def transpose(spec, src, lds, dst, ldd, rows, cols, bias=None, flags=0, params=()):
    """dst[j*ldd + i] = act(src[i*lds + j] (+ dst[j*ldd + i]) (+ bias[j])) for i < rows,
    j < cols."""
    block = np.stack([src[i * lds: i * lds + cols] for i in range(rows)]).T
    if flags & ACCUMULATE:
        block = block + np.stack([dst[j * ldd: j * ldd + rows] for j in range(cols)])
    result = _epilogue(spec, block, bias[:cols, None] if flags & BIAS else 0, flags, params)
    for j in range(cols):
        dst[j * ldd: j * ldd + rows] = result[j]


def row_copy(spec, dst, dst_start, dst_step, src, src_start, src_step, count, stride, j0, j1,
             lo, hi):
    """For each row i < count: elements j0 <= j < j1 of dst's row (at dst_start +
    i*dst_step) get src[src_start + i*src_step + j*stride] when lo <= j < hi, else zero."""
    for i in range(count):
        for j in range(j0, j1):
            dst[dst_start + i * dst_step + j] = (src[src_start + i * src_step + j * stride]
                                                 if lo <= j < hi else 0)


def tap_copy(spec, dst, dst_start, dst_step, tap_step, src, src_start, src_step, count, taps,
             stride, j0, j1, end, lo, hi):
    """For each row i < count and tap s < taps: elements j0 <= j < end of the tap's row (at
    dst_start + i*dst_step + s*tap_step) get src[src_start + i*src_step + j*stride + s] when
    j < j1 and lo <= j*stride + s < hi, else zero; nothing for tap counts or strides the
    kernel does not handle."""
    if not (2 <= taps <= max_taps(spec) and stride in TAP_STRIDES):
        return
    for i in range(count):
        for s in range(taps):
            for j in range(j0, end):
                at = j * stride + s
                dst[dst_start + i * dst_step + s * tap_step + j] = (
                    src[src_start + i * src_step + at] if j < j1 and lo <= at < hi else 0)


def activation(spec, x, out, params=()):
    """out[:x.size] = activation ``spec.kind`` of ``x`` (``activation_values``); ``out`` may
    be ``x``."""
    out[:x.size] = activation_values(spec.kind, x, params)


_erf, _erfc = (np.vectorize(f, otypes=[np.float64]) for f in (math.erf, math.erfc))
_SQRT_HALF = 0.7071067811865476             # 1/sqrt(2) rounded, and what it lacks:
_SQRT_HALF_LO = -4.833646656726457e-17      # 1/sqrt(2) - _SQRT_HALF


def _split(a):
    """(hi, lo) = a with hi holding its top 26 bits (Veltkamp), for exact products."""
    c = a * 134217729.0   # 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _times_sqrt_half(a):
    """(z, d): a / sqrt(2) = z + d to about 2**-100 relative (Dekker's exact product)."""
    z = a * _SQRT_HALF
    (a1, a2), (b1, b2) = _split(a), _split(np.float64(_SQRT_HALF))
    error = ((a1 * b1 - z) + a1 * b2 + a2 * b1) + a2 * b2
    return z, error + a * _SQRT_HALF_LO


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x < 0, e, 1.0) / (1 + e)


def _gelu(x):
    """x Phi(x), from erfc on the negative side; erfc(z + d) = erfc(z) - d 2/sqrt(pi)
    exp(-z**2) for the part d of |x| / sqrt(2) that z's rounding loses, which matters in the
    far tail: erfc's relative slope there is -2z."""
    z, d = _times_sqrt_half(np.minimum(np.abs(x), 64.0))   # erf(z) = 1, erfc(z) = 0 past 45
    upper = 0.5 * x * (1 + _erf(z))
    tail = 0.5 * x * (_erfc(z) - d * (2 / math.sqrt(math.pi)) * np.exp(-z * z))
    return np.where(x < 0, np.where(np.isneginf(x), 0.0, tail), upper)


def _clip(x, low, high):
    """min(max(x, low), high), NaN passing: all ``high`` when low > high."""
    x = np.where(x < low, low, x)
    return np.where(x > high, high, x)


def _gelu_tanh(x):
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
    return np.where(np.isneginf(x), 0.0, x * _sigmoid(2 * u))


_ACTIVATION_VALUES = {
    "identity": lambda x: x,
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "clip": _clip,
    "leaky_relu": lambda x, alpha: np.where(x > 0, x, alpha * x),
    "sigmoid": _sigmoid,
    "silu": lambda x: np.where(np.isneginf(x), 0.0, x * _sigmoid(x)),
    "tanh": np.tanh,
    "hardsigmoid": lambda x, alpha, beta: np.minimum(np.maximum(alpha * x + beta, 0), 1),
    "hardswish": lambda x: np.where(np.isneginf(x), 0.0,
                                    x * (np.minimum(np.maximum(x + 3, 0), 6) / 6)),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "erf": _erf,
}


def activation_values(kind, x, params=()):
    """Activation ``kind`` (``ACTIVATIONS``) of ``x`` with ``params`` in float64, the
    semantics of PyTorch (NaN in, NaN out; the limits at the infinities)."""
    if len(params) != len(ACTIVATIONS[kind]):
        raise ValueError(f"activation {kind!r} takes parameters {ACTIVATIONS[kind]}")
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        return np.asarray(_ACTIVATION_VALUES[kind](x, *(float(p) for p in params)), np.float64)


REFERENCES = {KernelSpec: outer_product, DepthwiseSpec: depthwise,
              BlockedDepthwiseSpec: blocked_depthwise, TransposeSpec: transpose,
              RowCopySpec: row_copy, TapCopySpec: tap_copy, ActivationSpec: activation}
