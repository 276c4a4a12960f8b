"""Activations applied as a convolution stores its output: the kernels' stores (outer product,
its transposing pass, depthwise) against the float64 reference on the activations' edge grid,
exactly as accurate as the standalone kernels (``test_activations``); then ``Conv2d(activation=)``
on every loop nest path, with several channel tiles (the activation on the last one only), a
residual, and what the argument refuses."""
import pickle

import numpy as np
import pytest

import cso
import microkernels as mk
from microkernels.activation import SELECTED
from microkernels.reference import activation_values

from .reference import conv2d_reference
from .test_activations import GRIDS, PARAMETERS, assert_accurate, default_params

STORE_KINDS = sorted(set(mk.ACTIVATIONS) - {"identity"})
HOST_ISA = mk.default_isa().name
OTHER_ISAS = [isa.name for isa in mk.supported_isas() if isa.name != HOST_ISA]


def edge_values(dtype):
    """A sample of the activations' grid: its special values and every 41st point."""
    grid = GRIDS[dtype]
    return np.concatenate([grid[::41], grid[-15:]])


def params_of(kind):
    """The parameters a kind is tried with: its defaults and one other set."""
    return [default_params(kind)] + PARAMETERS.get(kind, [])[1:2]


def through_outer_product(spec, x, params):
    """The kernel's store of ``x`` with ACTIVATE: k = 1 and B all ones, so that the tile is
    ``x`` exactly; every row of C holds the activation of the chunk. The last chunk is a
    partial (masked) tile."""
    dt, width, rows = spec.np_dtype, spec.width, spec.broadcasts
    kernel, out = mk.compile(spec), np.empty_like(x)
    b = np.ones(rows, dt)
    for start in range(0, x.size, width):
        used = min(width, x.size - start)
        a = np.zeros(width, dt)
        a[:used] = x[start:start + used]
        c = np.full(rows * width, 7.0, dt)
        kernel(1, a, b, c, width, used, rows, None, mk.ACTIVATE, params=params)
        tile = c.reshape(rows, width)
        assert np.all(tile[:, used:] == 7.0), "stored past the used windows"
        np.testing.assert_array_equal(tile, np.broadcast_to(tile[0], tile.shape))
        out[start:start + used] = tile[0, :used]
    return out


def through_transpose(spec, x, params):
    """The transposing pass's store of ``x`` with ACTIVATE, in lanes x lanes blocks (the last
    one partial)."""
    lanes, dt = spec.lanes, spec.np_dtype
    kernel, out = mk.compile(spec), np.empty_like(x)
    block = lanes * lanes
    for start in range(0, x.size, block):
        chunk = x[start:start + block]
        rows = -(-chunk.size // lanes)
        src = np.zeros(rows * lanes, dt)
        src[:chunk.size] = chunk
        dst = np.empty(lanes * rows, dt)
        kernel(src, lanes, dst, rows, rows, lanes, None, mk.ACTIVATE, params=params)
        out[start:start + chunk.size] = dst.reshape(lanes, rows).T.reshape(-1)[:chunk.size]
    return out


def through_depthwise(spec, x, params):
    """The depthwise kernel's store of ``x`` with ACTIVATE: one tap of weight 1 on one
    virtual row."""
    dt = spec.np_dtype
    slab = np.concatenate([x, np.zeros(2 * spec.lanes, dt)])
    out = np.empty_like(x)
    mk.compile(spec)(slab, np.zeros(1, np.int64), np.ones(1, dt), out, x.size, x.size, x.size,
                     None, mk.ACTIVATE, params=params)
    return out


def lanes(dtype, isa):
    return mk.ActivationSpec(dtype, "relu", isa).lanes


# store -> (its kernel's spec for (dtype, kind, isa), the function that runs values through it)
STORES = {
    "outer_product": (lambda dtype, kind, isa: mk.KernelSpec(
        dtype, 3, 2 * lanes(dtype, isa), isa, activation=kind), through_outer_product),
    "transpose": (lambda dtype, kind, isa: mk.TransposeSpec(dtype, isa, kind), through_transpose),
    "depthwise": (lambda dtype, kind, isa: mk.DepthwiseSpec(dtype, 2, isa, kind),
                  through_depthwise),
}
CASES = ([(store, dtype, kind, HOST_ISA) for store in STORES for dtype in ("f32", "f64")
          for kind in STORE_KINDS]
         + [(store, "f32", kind, isa) for store in STORES for kind in ("clip", "silu")
            for isa in OTHER_ISAS])


@pytest.mark.parametrize("store, dtype, kind, isa", CASES,
                         ids=["-".join(case) for case in CASES])
def test_store_applies_the_activation_exactly_as_its_kernel(store, dtype, kind, isa):
    make_spec, run = STORES[store]
    spec = make_spec(dtype, kind, isa)
    assert spec.activation == kind
    x = edge_values(dtype)
    for params in params_of(kind):
        expected = activation_values(kind, x.astype(np.float64), params)
        assert_accurate(kind, dtype, x, run(spec, x, params), expected)


@pytest.mark.parametrize("kind", ["relu", "clip", "silu", "gelu"])
def test_store_activation_after_accumulate_and_bias_edge_tiles(kind, rng):
    """act(C + A^T B + bias) for every tile width and row count, with ACTIVATE and without it
    (an earlier channel tile: the costly kinds' stores of their own, the cheap ones' select),
    nothing stored outside the used rows and windows."""
    spec = mk.KernelSpec("f32", 3, 2 * lanes("f32", HOST_ISA), HOST_ISA, activation=kind)
    kernel, reference = mk.compile(spec), mk.reference_kernel(spec)
    params = params_of(kind)[-1]
    k, ldc, guard = 5, spec.width + 3, 4
    for flags in (mk.ACTIVATE, mk.ACCUMULATE | mk.BIAS | mk.ACTIVATE, mk.ACCUMULATE | mk.BIAS):
        for rows in range(1, spec.broadcasts + 1):
            for width in range(1, spec.width + 1):
                a = rng.standard_normal(k * spec.width).astype(np.float32)
                b = rng.standard_normal(k * spec.broadcasts).astype(np.float32)
                bias = rng.standard_normal(rows).astype(np.float32)
                c = np.full(2 * guard + (rows - 1) * ldc + width, 7.0, np.float32)
                expected = c.copy()
                kernel(k, a, b, c[guard:-guard], ldc, width, rows, bias, flags, params=params)
                reference(k, a, b, expected[guard:-guard], ldc, width, rows, bias, flags,
                          params=params)
                np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5,
                                           err_msg=f"flags {flags}, {rows} x {width}")


def test_cheap_kinds_select_and_costly_ones_branch():
    """A costly activation's stores are code of their own behind the flag (a branch to them),
    a cheap one's a select: the selecting kernel has as many stores as a ReLU kernel, the
    branching one twice as many."""
    assert {"relu", "clip", "leaky_relu"} <= SELECTED and not {"silu", "gelu"} & SELECTED

    def stores(kind):
        spec = mk.KernelSpec("f32", 3, 2 * lanes("f32", HOST_ISA), HOST_ISA, activation=kind)
        return mk.compile(spec).ir.count("store <")

    assert stores("clip") == stores("relu")
    assert stores("silu") == 2 * stores("relu")


def test_kernel_names_say_their_activation():
    spec = mk.KernelSpec("f32", 6, 16, "avx2", "slab", 2, "gelu_tanh")
    assert spec.name == "f32_conv_ukernel_6x16_slab_pf2_gelu_tanh__avx2"
    assert mk.KernelSpec("f32", 6, 16, "avx2").name == "f32_conv_ukernel_6x16__avx2"
    for spec in (spec, mk.KernelSpec("f64", 4, 8, "avx2", activation="tanh"),
                 mk.KernelSpec("f32", 4, 16, "avx2", "direct", activation="hardsigmoid"),
                 mk.DepthwiseSpec("f32", 3, "avx2", "leaky_relu"),
                 mk.TransposeSpec("f64", "neon", "silu")):
        assert type(spec).parse(spec.name) == spec == mk.parse_name(spec.name)
    for bad in ("f32_conv_ukernel_6x16_relu__avx2", "f32_conv_ukernel_6x16_swish__avx2",
                "f32_conv_ukernel_6x16_identity__avx2", "f32_dw_ukernel_3v_gelu_gelu__avx2"):
        with pytest.raises(ValueError):
            mk.parse_name(bad)
    with pytest.raises(ValueError, match="activation must be one of"):
        mk.KernelSpec("f32", 6, 16, "avx2", activation="identity")


# Conv2d(activation=...): every loop nest path

def expected_conv(x, w, b, activation, **geometry):
    activation = cso.Activation.of(activation)
    pre = conv2d_reference(x.astype(np.float64), w.astype(np.float64),
                           None if b is None else b.astype(np.float64), **geometry)
    return activation_values(activation.kind, pre, activation.values)


ACTIVATIONS = ["relu6", cso.Activation("leaky_relu", alpha=0.2), "sigmoid", "silu",
               cso.Activation("hardsigmoid", alpha=0.2, beta=0.5), "hardswish", "gelu",
               cso.Activation("gelu", approximate="tanh"), "tanh", "erf"]
# (input shape, weight shape, groups, padding, plan overrides): windows in vectors over
# several channel tiles, on packed tiles and on a slab; filters in vectors (the transposing
# pass); grouped; depthwise
PATHS = {
    "packed_channel_tiles": ((1, 20, 9, 11), (19, 20, 3, 3), 1, 1,
                             dict(vectors_along="windows", slab=False, nc=7)),
    "slab_channel_tiles": ((2, 12, 13, 33), (10, 12, 3, 3), 1, 1,
                           dict(vectors_along="windows", slab=True, nc=5)),
    "filters_in_vectors": ((1, 18, 5, 6), (37, 18, 1, 1), 1, 0,
                           dict(vectors_along="filters", nc=8)),
    "grouped": ((1, 12, 8, 8), (12, 4, 3, 3), 3, 1, {}),
    "depthwise": ((2, 9, 11, 13), (9, 1, 3, 3), 9, 1, {}),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_conv2d_applies_the_activation_once_on_every_path(path, activation, rng):
    x_shape, w_shape, groups, padding, overrides = PATHS[path]
    x = (2 * rng.standard_normal(x_shape)).astype(np.float32)
    w = (0.3 * rng.standard_normal(w_shape)).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    conv = cso.Conv2d(w, b, padding=padding, groups=groups, activation=activation,
                      plan_overrides=overrides)
    assert conv.kernel_for(x.shape).activation == cso.Activation.of(activation).kind
    expected = expected_conv(x, w, b, activation, padding=(padding,) * 4, groups=groups)
    np.testing.assert_allclose(conv(x), expected, rtol=2e-5, atol=2e-5)


def test_conv2d_directly_read_rows(rng):
    """Direct tiles (a slab's windows broadcast, filters in vectors) store through the
    transposing pass too."""
    x = rng.standard_normal((1, 8, 30, 30)).astype(np.float32)
    w = (0.3 * rng.standard_normal((40, 8, 3, 3))).astype(np.float32)
    conv = cso.Conv2d(w, None, padding=1, activation="silu",
                      plan_overrides=dict(vectors_along="filters", slab=True))
    assert conv.kernel_for(x.shape).variant == "direct"
    np.testing.assert_allclose(conv(x), expected_conv(x, w, None, "silu", padding=(1,) * 4),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("vectors_along", ["windows", "filters"])
def test_activation_after_a_residual_sum(vectors_along, rng):
    """accumulate=True: out = act(out + conv(x) + bias), the activation of the whole sum."""
    x = rng.standard_normal((1, 16, 7, 9))
    w = 0.3 * rng.standard_normal((24, 16, 3, 3))
    b = rng.standard_normal(24)
    residual = rng.standard_normal((1, 24, 7, 9))
    conv = cso.Conv2d(w, b, padding=1, activation="gelu", accumulate=True,
                      plan_overrides=dict(vectors_along=vectors_along, nc=6))
    out = residual.copy()
    conv(x, out=out)
    pre = conv2d_reference(x, w, b, padding=(1,) * 4) + residual
    np.testing.assert_allclose(out, activation_values("gelu", pre), rtol=1e-12, atol=1e-12)


def test_conv2d_activation_nan_and_infinities():
    """NaN stays NaN through every activation; an infinite sum gives the activation's limit."""
    x = np.zeros((1, 1, 1, 4), np.float32)
    w = np.ones((3, 1, 1, 1), np.float32)
    b = np.array([np.nan, np.inf, -np.inf], np.float32)
    for activation in ACTIVATIONS:
        got = cso.conv2d(x, w, b, activation=activation)
        a = cso.Activation.of(activation)
        expected = activation_values(a.kind, b.astype(np.float64), a.values)
        np.testing.assert_array_equal(got[0, :, 0, 0], expected.astype(np.float32), str(a))


def test_conv2d_activation_argument(rng):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, activation=cso.Activation("clip", min=-1.0, max=0.5))
    copy = pickle.loads(pickle.dumps(conv))
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(copy(x), conv(x))
    assert copy.activation == conv.activation == cso.Activation("clip", min=-1.0, max=0.5)
    assert cso.Conv2d(w, activation="identity").activation is None
    assert cso.Conv2d(w, activation="relu6").activation == cso.Activation("clip", min=0.0,
                                                                          max=6.0)
    with pytest.raises(ValueError, match="unknown activation 'RELU'"):
        cso.Conv2d(w, activation="RELU")
    with pytest.raises(TypeError, match="activation must be None, a name or a cso.Activation"):
        cso.conv2d(x, w, activation=1)
