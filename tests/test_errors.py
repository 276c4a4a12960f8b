"""Every bad argument raises ValueError or TypeError naming the argument and the shapes."""
import numpy as np
import pytest

import cso

X = np.zeros((1, 4, 8, 8), np.float32)
W = np.zeros((6, 4, 3, 3), np.float32)


def err(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        cso.conv2d(*args, **kwargs)


def test_channel_mismatch_names_shapes():
    err(ValueError, r"expected input with 4 channels for weight \(6, 4, 3, 3\) and groups=1, got "
                    r"input of shape \(1, 5, 8, 8\)", np.zeros((1, 5, 8, 8), np.float32), W)
    err(ValueError, r"expected input with 8 channels .* groups=2", X, W[:, :, :, :], groups=2)


def test_group_count_must_divide_filters():
    err(ValueError, r"groups=4 must divide the 6 filters", X, np.zeros((6, 1, 3, 3), np.float32), groups=4)


@pytest.mark.parametrize("x,match", [
    (np.zeros((4, 8, 8, 1, 1), np.float32), r"3-D \(C, H, W\) or 4-D .* shape \(4, 8, 8, 1, 1\)"),
    (np.zeros((8, 8), np.float32), r"3-D \(C, H, W\) or 4-D .* shape \(8, 8\)"),
    (np.zeros((1, 4, 0, 8), np.float32), r"height and width must be >= 1.*\(1, 4, 0, 8\)"),
])
def test_input_rank_and_empty_dims(x, match):
    err(ValueError, match, x, W)


def test_weight_rank_and_empty():
    err(ValueError, r"4-D weight .* shape \(6, 4, 3\)", X, np.zeros((6, 4, 3), np.float32))
    err(ValueError, r"weight dimensions must be >= 1.*\(6, 4, 0, 3\)", X, np.zeros((6, 4, 0, 3), np.float32))


def test_bias():
    err(ValueError, r"expected bias of shape \(6,\) for weight \(6, 4, 3, 3\), got bias of shape \(5,\)",
        X, W, np.zeros(5, np.float32))
    err(ValueError, r"bias of shape \(6,\).*\(1, 6\)", X, W, np.zeros((1, 6), np.float32))
    err(TypeError, r"bias dtype float64 differs", X, W, np.zeros(6))
    err(TypeError, r"bias must be a numpy.ndarray, got list", X, W, [0.0] * 6)


@pytest.mark.parametrize("name", ["stride", "dilation"])
@pytest.mark.parametrize("value,exc", [(0, ValueError), (-1, ValueError), ((1, 0), ValueError),
                                       ((1, 2, 3), ValueError), (1.5, TypeError), (True, TypeError),
                                       ("2", TypeError), (None, TypeError)])
def test_stride_and_dilation(name, value, exc):
    err(exc, name, X, W, **{name: value})


@pytest.mark.parametrize("value,exc", [(-1, ValueError), ((1, -1), ValueError), (((1, 1), (0, -2)), ValueError),
                                       ("full", ValueError), (1.0, TypeError), ((1, 2, 3), ValueError),
                                       (((1, 1, 1), (0, 0)), ValueError)])
def test_padding(value, exc):
    err(exc, "padding", X, W, padding=value)


def test_kernel_larger_than_padded_input():
    err(ValueError, r"kernel of extent 3x3 .* larger than the padded input 2x8", np.zeros((1, 4, 2, 8), np.float32), W)
    err(ValueError, r"kernel of extent 5x5 .* dilation \(2, 2\)", np.zeros((1, 4, 4, 4), np.float32), W, dilation=2)


def test_groups_argument():
    err(ValueError, "groups must be >= 1", X, W, groups=0)
    err(TypeError, "groups must be an int", X, W, groups=1.0)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.complex64, np.bool_])
def test_unsupported_dtypes(dtype):
    err(TypeError, r"input must be float32 or float64, got", X.astype(dtype), W.astype(dtype))
    err(TypeError, r"weight must be float32 or float64", X, W.astype(dtype))


def test_mixed_dtypes():
    err(TypeError, r"input dtype float64 differs from weight dtype float32", X.astype(np.float64), W)
    conv = cso.Conv2d(W)
    with pytest.raises(TypeError, match="differs"):
        conv(X.astype(np.float64))


def test_non_arrays():
    err(TypeError, r"input must be a numpy.ndarray, got list", X.tolist(), W)
    err(TypeError, r"weight must be a numpy.ndarray, got int", X, 3)
    with pytest.raises(TypeError, match="input must be a numpy.ndarray"):
        cso.Conv2d(W)(None)


def test_activation():
    err(ValueError, r"unknown activation 'gelu_exact'; known: clip, ", X, W,
        activation="gelu_exact")
    err(TypeError, r"activation must be None, a name or a cso.Activation, got float", X, W,
        activation=0.5)


def test_out_checks():
    good = np.zeros((1, 6, 6, 6), np.float32)
    err(ValueError, r"expected out of shape \(1, 6, 6, 6\), got out of shape \(1, 6, 6, 5\)", X, W,
        out=np.zeros((1, 6, 6, 5), np.float32))
    err(TypeError, r"out must have dtype float32, got float64", X, W, out=good.astype(np.float64))
    readonly = good.copy()
    readonly.flags.writeable = False
    err(ValueError, r"writeable", X, W, out=readonly)
    err(TypeError, r"out must be a plain numpy.ndarray", X, W, out=[0])
    err(TypeError, r"out must be a plain numpy.ndarray", X, W, out=np.ma.masked_array(good))
    shared = np.zeros((1, 4, 8, 8), np.float32)
    err(ValueError, r"out .* overlaps input", shared, np.zeros((4, 4, 3, 3), np.float32), padding=1, out=shared)


@pytest.mark.parametrize("kwargs,match", [
    (dict(stride=(2 ** 62, 1), padding=((0, 2 ** 64), (0, 0))), "stride must be < 2\\*\\*31"),
    (dict(dilation=(2 ** 63 - 1, 1)), "dilation must be < 2\\*\\*31"),
    (dict(padding=2 ** 63), "padding must be < 2\\*\\*31"),
    (dict(stride=2 ** 64), "stride must be < 2\\*\\*31"),
])
def test_index_range_is_bounded(kwargs, match):
    """Huge strides, paddings or dilations would overflow the compiled int64 index math."""
    err(ValueError, match, np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1), np.float32), **kwargs)


def test_unbatched_input_errors_show_the_given_shape():
    err(ValueError, r"got input of shape \(5, 6, 7\)$", np.zeros((5, 6, 7), np.float32), W)


def test_masked_arrays_are_refused():
    err(TypeError, "input is a masked array", np.ma.masked_array(X), W)
    err(TypeError, "weight is a masked array", X, np.ma.masked_array(W))


def test_padding_strings_are_exact():
    err(ValueError, "padding must be", X, W, padding="SAME")


def test_plan_overrides_and_isa_are_checked():
    for bad, exc in (({"microtile_shape": (16.0, 8)}, TypeError), ({"microtile_shape": (32,)}, ValueError),
                     ({"nc": True}, TypeError), ({"k2": 0}, ValueError), ({"schedule": "is"}, ValueError),
                     ({"slab": "yes"}, TypeError)):
        with pytest.raises(exc, match="plan_overrides"):
            cso.Conv2d(W, plan_overrides=bad)
    conv = cso.Conv2d(W, plan_overrides={"nc": np.int64(2), "microtile_shape": [32, 8]})
    assert conv.plan_for(X.shape).nc == 2 and conv.kernel_for(X.shape).width == 32
    with pytest.raises(ValueError, match="unknown ISA"):
        cso.Conv2d(W, isa="sse9")
    with pytest.raises(ValueError, match="schedule"):
        cso.Conv2d(W, plan_overrides={"schedule": "XS"})(X)
    with pytest.raises(TypeError, match="plan_overrides"):
        cso.Conv2d(W, plan_overrides={"bogus": 1})
    # valid alone, but not for the kernel (windows a multiple of the vector) or the shape
    for bad in ({"microtile_shape": (5, 8), "vectors_along": "windows", "slab": False},
                {"slab": True, "vectors_along": "windows"}):
        with pytest.raises(ValueError, match=r"plan_overrides .* for input of shape"):
            cso.Conv2d(W, plan_overrides=bad)(np.ones((1, W.shape[1], 5, 5), W.dtype))
