"""The engines compared, each built once per layer as ``engine(spec, w) -> run(x)``, plus an
independent float64 reference that every engine's output is checked against before timing."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import cso


def cso_engine(spec, w):
    """cso.Conv2d: filters packed here, outside the timed calls."""
    t, b, l, r = spec.padding
    return cso.Conv2d(w, stride=spec.stride, padding=((t, b), (l, r)), dilation=spec.dilation,
                      groups=spec.groups)


def im2col_engine(spec, w):
    """The classic lowering: copy every window into a (C/g*R*S) x (P*Q) matrix per group, then
    one BLAS GEMM per image and group."""
    g, kg = spec.groups, spec.k_per_group
    w_mat = w.reshape(g, kg, -1)
    t, b, l, r = spec.padding

    def run(x):
        xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
        cols = _windows(spec, xp)                                  # view: N, C, P, Q, R, S
        cols = cols.reshape(spec.n, g, spec.c_per_group, spec.p, spec.q, spec.r, spec.s)
        cols = cols.transpose(0, 1, 2, 5, 6, 3, 4).reshape(spec.n, g, -1, spec.p * spec.q)
        return (w_mat @ cols).reshape(spec.output_shape)          # N, G, Kg, P*Q

    return run


def _windows(spec, xp):
    """Strided view of every window of the padded input: (N, C, P, Q, R, S), no copy."""
    (dh, dw), (sh, sw) = spec.dilation, spec.stride
    span = (dh * (spec.r - 1) + 1, dw * (spec.s - 1) + 1)
    return sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]


ENGINES = {"cso": cso_engine, "im2col": im2col_engine}


def reference(spec, x, w):
    """Direct float64 convolution, one tap (r, s) at a time; shares no code with the engines."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    t, b, l, r = spec.padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    xg = xp.reshape(spec.n, spec.groups, spec.c_per_group, *xp.shape[2:])
    wg = w.astype(np.float64).reshape(spec.groups, spec.k_per_group, spec.c_per_group,
                                      spec.r, spec.s)
    out = np.zeros((spec.n, spec.groups, spec.k_per_group, spec.p, spec.q))
    for i in range(spec.r):
        for j in range(spec.s):
            tap = xg[..., i * dh: i * dh + sh * (spec.p - 1) + 1: sh,
                     j * dw: j * dw + sw * (spec.q - 1) + 1: sw]
            out += np.einsum("gkc,ngcpq->ngkpq", wg[..., i, j], tap, optimize=True)
    return out.reshape(spec.output_shape)


def check(name, spec, out, ref, rtol=1e-4):
    """Raise unless ``out`` matches ``ref`` to ``rtol`` of the reference's largest magnitude."""
    err = np.max(np.abs(out - ref)) if out.shape == ref.shape else np.inf
    if not err <= rtol * np.max(np.abs(ref)):
        raise AssertionError(f"{name} is wrong on {spec}: shape {out.shape} vs {ref.shape}, "
                             f"max error {err:.3g}, max |ref| {np.max(np.abs(ref)):.3g}")
