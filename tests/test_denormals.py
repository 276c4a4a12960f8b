"""Subnormal numbers are not flushed: cso computes them as IEEE arithmetic does (gradual
underflow), as NumPy does, on every path (see README, "Subnormal numbers")."""
import numpy as np
import pytest

import cso

from .reference import conv2d_reference

TINY = {np.float32: 1e-39, np.float64: 1e-309}   # below the smallest normal number


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight_shape,groups,overrides", [
    ((16, 8, 3, 3), 1, {"slab": False}), ((16, 8, 3, 3), 1, {"slab": True, "vectors_along": "windows"}),
    ((16, 8, 3, 3), 1, {"vectors_along": "filters"}), ((16, 8, 1, 1), 1, {}), ((8, 1, 3, 3), 8, {})])
def test_subnormal_inputs_are_computed_not_flushed(rng, dtype, weight_shape, groups, overrides):
    x = (rng.standard_normal((1, 8, 20, 40)) * TINY[dtype]).astype(dtype)
    assert np.all(np.abs(x[x != 0]) < np.finfo(dtype).smallest_normal)
    w = rng.standard_normal(weight_shape).astype(dtype)
    y = cso.Conv2d(w, padding=weight_shape[2] // 2, groups=groups, plan_overrides=overrides)(x)
    expected = conv2d_reference(x, w, padding=(weight_shape[2] // 2,) * 4, groups=groups)
    # each of the C*R*S rounded products and sums is off by at most half the subnormal step
    step = np.finfo(dtype).smallest_subnormal
    terms = np.prod(weight_shape[1:])
    assert np.count_nonzero(y) > 0.9 * y.size          # flushed to zero, they would all be 0
    np.testing.assert_allclose(y, expected, rtol=0, atol=2 * terms * step)
