"""Plain NumPy reference convolution (PyTorch conv2d semantics), computed in float64."""
import numpy as np


def conv2d_reference(x, w, bias=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                     groups=1, relu=False):
    """x (N, C, H, W), w (K, C/groups, R, S), padding (top, bottom, left, right) -> float64
    (N, K, P, Q). Loops over filter taps only; each tap is one strided slice and one einsum."""
    n, c, h, wd = x.shape
    k, c_g, r, s = w.shape
    t, b, left, right = padding
    xp = np.zeros((n, c, h + t + b, wd + left + right))
    xp[:, :, t:t + h, left:left + wd] = x
    p = (h + t + b - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + left + right - dilation[1] * (s - 1) - 1) // stride[1] + 1
    k_g = k // groups
    out = np.zeros((n, k, p, q))
    for g in range(groups):
        xs = xp[:, g * c_g:(g + 1) * c_g]
        ws = w[g * k_g:(g + 1) * k_g].astype(np.float64)
        for i in range(r):
            for j in range(s):
                rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (p - 1) + 1, stride[0])
                cols = slice(j * dilation[1], j * dilation[1] + stride[1] * (q - 1) + 1, stride[1])
                out[:, g * k_g:(g + 1) * k_g] += np.einsum("ncpq,kc->nkpq", xs[:, :, rows, cols],
                                                          ws[:, :, i, j])
    if bias is not None:
        out += bias[None, :, None, None]
    return np.maximum(out, 0) if relu else out


def assert_conv_close(actual, x, w, bias=None, relu=False, **geometry):
    """``actual`` matches the reference within float rounding: per element, the error is at most
    tol * sqrt(C/groups * R * S) times the magnitude sum(|x| * |w|) + |bias| that fed it
    (tol 1e-5 for float32, 1e-13 for float64)."""
    expected = conv2d_reference(x, w, bias, relu=relu, **geometry)
    magnitude = conv2d_reference(np.abs(x), np.abs(w), None if bias is None else np.abs(bias),
                                 **geometry)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == x.dtype
    depth = w.shape[1] * w.shape[2] * w.shape[3]
    tol = (1e-5 if x.dtype == np.float32 else 1e-13) * np.sqrt(depth)
    err = np.abs(actual.astype(np.float64) - expected)
    bound = tol * magnitude + np.finfo(x.dtype).tiny
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert np.all(err <= bound), (f"max error {err.max():.3g} vs bound {bound[worst]:.3g} at {worst}: "
                                  f"got {actual[worst]}, expected {expected[worst]}")
