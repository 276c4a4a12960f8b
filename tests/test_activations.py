"""Activations: the compiled kernels (every kind, dtype and ISA of this CPU) against the float64
reference over a grid of their edges (dense on [-100, 100], near zero, the exponential's over-
and underflow thresholds, the branch points, infinities, NaN, -0.0, subnormals), their tails
against guard pages, their parameters; then ``cso.Activation`` and ``cso.activate``.

Accuracy: within 1e-6 (float32) or 1e-13 (float64) of the reference, relative; results below
the smallest normal number absolutely (a subnormal has fewer digits). Two kinds are allowed
1e-7 (float32) or 1e-15 (float64) absolutely near zero, where their values are tiny:
hardsigmoid, whose alpha * x + beta rounds where it vanishes (alpha = 1/6 is not exact), and
gelu_tanh, whose argument 2u rounds and exp(2u) carries that error times |2u| for very
negative x."""
import math
import pickle

import numpy as np
import pytest

import cso
import microkernels as mk
from microkernels.activation import ERF_SMALL, TANH_SMALL
from microkernels.reference import activation_values

from .guarded import guarded_copy, guarded_empty

ISAS = [isa.name for isa in mk.supported_isas()]
DTYPES = ("f32", "f64")
KINDS = sorted(mk.ACTIVATIONS)
RTOL = {"f32": 1e-6, "f64": 1e-13}
NEAR_ZERO = {"hardsigmoid", "gelu_tanh"}
ATOL_NEAR_ZERO = {"f32": 1e-7, "f64": 1e-15}
# parameters each kind is tried with, beyond its defaults
PARAMETERS = {
    "clip": [(0.0, 6.0), (-1.0, 1.0), (-math.inf, 0.5), (-2.0, math.inf), (3.0, -3.0),
             (2.0, 2.0), (-math.inf, math.inf)],
    "leaky_relu": [(0.01,), (0.2,), (0.0,), (-0.5,), (3.0,)],
    "hardsigmoid": [(1 / 6, 0.5), (0.2, 0.5), (-0.3, 0.1), (0.0, 0.7), (2.0, -1.0)],
}


def default_params(kind):
    return cso.Activation(kind).values


def grid(dtype):
    """The inputs every kernel is checked on, in ``dtype`` (a short name)."""
    dt = np.dtype(mk.ActivationSpec(dtype, "relu", "generic").np_dtype)
    info = np.finfo(dt)
    near_zero = np.geomspace(1e-30, 1e-3, 2000)
    # exp over- and underflows (to subnormals, then to zero) past these
    thresholds = [np.log(info.max), np.log(info.tiny), np.log(info.smallest_subnormal)]
    # the kernels' branch points (gelu's erf at x / sqrt 2), the hard functions' corners
    corners = [TANH_SMALL, ERF_SMALL, ERF_SMALL * math.sqrt(2), 3.0, 6.0, 1.0, 2.5]
    around = [dt.type(c) + k * np.spacing(dt.type(c)) for c in thresholds + corners
              for k in range(-3, 4)]
    around += [dt.type(c) + d for c in thresholds for d in (-1.0, -0.01, 0.01, 1.0)]
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny,
               info.smallest_subnormal, -info.smallest_subnormal, 1e30, -1e30, 1e20, -1e20]
    values = np.concatenate([np.linspace(-100, 100, 200001), near_zero, -near_zero,
                             np.linspace(-800, 800, 16001), np.float64(around),
                             -np.float64(around)]).astype(dt)
    with np.errstate(over="ignore"):
        return np.concatenate([values, np.array(special).astype(dt)])


GRIDS = {dtype: grid(dtype) for dtype in DTYPES}
_references = {}


def reference(kind, dtype, params):
    key = (kind, dtype, params)
    if key not in _references:
        _references[key] = activation_values(kind, GRIDS[dtype].astype(np.float64), params)
    return _references[key]


def assert_accurate(kind, dtype, x, got, expected):
    """``got`` (the kernel's, of ``x``) matches the float64 ``expected`` as the module's
    docstring says: NaN where it is NaN, infinities (those of ``expected`` in the dtype: it
    may overflow) exactly, finite values within the tolerance."""
    dt = np.float32 if dtype == "f32" else np.float64
    got = got.astype(np.float64)
    nan = np.isnan(expected)
    wrong_nan = np.flatnonzero(np.isnan(got) != nan)
    assert not wrong_nan.size, (f"{kind}: NaN mismatch at x = {x[wrong_nan[:5]]}: got "
                                f"{got[wrong_nan[:5]]}, expected {expected[wrong_nan[:5]]}")
    with np.errstate(over="ignore"):
        rounded = expected.astype(dt)
    infinite = np.isinf(rounded)
    np.testing.assert_array_equal(got[infinite], rounded[infinite],
                                  err_msg=f"{kind} at x = {x[infinite]}")
    finite = ~nan & ~infinite
    atol = ATOL_NEAR_ZERO[dtype] if kind in NEAR_ZERO else np.finfo(dt).tiny
    error = np.abs(got[finite] - expected[finite])
    bad = np.flatnonzero(error > RTOL[dtype] * np.abs(expected[finite]) + atol)
    assert not bad.size, (
        f"{kind} {dtype}: {bad.size} values out of tolerance, e.g. x = "
        f"{x[finite][bad[:4]].tolist()}: got {got[finite][bad[:4]].tolist()}, expected "
        f"{expected[finite][bad[:4]].tolist()}")


def max_relative_error(dtype, got, expected):
    """The largest relative error among results at least the smallest normal number."""
    dt = np.float32 if dtype == "f32" else np.float64
    at = np.isfinite(expected) & (np.abs(expected) >= np.finfo(dt).tiny)
    return float(np.max(np.abs(got[at].astype(np.float64) - expected[at]) / np.abs(expected[at])))


def spec_ids(specs):
    return [str(s) for s in specs]


SPECS = [mk.ActivationSpec(dtype, kind, isa) for isa in ISAS for dtype in DTYPES for kind in KINDS]


# the kernels

@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_accuracy_over_the_grid(spec):
    x = GRIDS[spec.dtype]
    params = default_params(spec.kind)
    out = np.full_like(x, 7.0)
    mk.compile(spec)(x, out, params)
    assert_accurate(spec.kind, spec.dtype, x, out, reference(spec.kind, spec.dtype, params))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.kind in PARAMETERS], ids=str)
def test_every_parameter(spec):
    x = GRIDS[spec.dtype]
    for params in PARAMETERS[spec.kind]:
        out = np.empty_like(x)
        mk.compile(spec)(x, out, params)
        assert_accurate(spec.kind, spec.dtype, x, out, reference(spec.kind, spec.dtype, params))


def test_clip_with_min_above_max_gives_max_everywhere_but_nan():
    x = GRIDS["f32"]
    out = np.empty_like(x)
    mk.compile(mk.ActivationSpec("f32", "clip", ISAS[0]))(x, out, (3.0, -3.0))
    assert np.all(out[~np.isnan(x)] == -3.0) and np.all(np.isnan(out[np.isnan(x)]))


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_tails_touch_only_their_elements(spec, rng):
    """Every length up to three vectors and one: the input flush against a guard page at either
    end (a read past it faults), the output too, in place as well."""
    kernel, params = mk.compile(spec), default_params(spec.kind)
    for n in range(3 * spec.lanes + 2):
        values = (rng.standard_normal(n) * 4).astype(spec.np_dtype)
        expected = activation_values(spec.kind, values, params)
        for at in ("start", "end"):
            x = guarded_copy(values, at)
            out = guarded_empty(n, spec.np_dtype, at)
            kernel(x, out, params)
            assert_accurate(spec.kind, spec.dtype, values, out, expected)
            kernel(x, x, params)   # in place
            np.testing.assert_array_equal(x, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["tanh", "erf"])
def test_odd_functions_keep_the_sign_of_zero(kind, dtype):
    spec = mk.ActivationSpec(dtype, kind, ISAS[0])
    x = np.array([-0.0, 0.0, -1e-30, 1e-30], spec.np_dtype)
    out = np.empty_like(x)
    mk.compile(spec)(x, out)
    assert list(np.signbit(out)) == [True, False, True, False]


def test_limits_at_the_infinities():
    """The infinities give the functions' limits, never NaN (x * f(x) where f(-inf) = 0)."""
    expected = {"sigmoid": (0, 1), "silu": (0, np.inf), "tanh": (-1, 1), "gelu": (0, np.inf),
                "gelu_tanh": (0, np.inf), "erf": (-1, 1), "hardswish": (0, np.inf),
                "hardsigmoid": (0, 1), "relu": (0, np.inf), "identity": (-np.inf, np.inf)}
    for isa in ISAS:
        for dtype in DTYPES:
            for kind, limits in expected.items():
                spec = mk.ActivationSpec(dtype, kind, isa)
                out = np.empty(2, spec.np_dtype)
                mk.compile(spec)(np.array([-np.inf, np.inf], spec.np_dtype), out,
                                 default_params(kind))
                assert tuple(out) == limits, f"{spec}: {out}"


@pytest.mark.parametrize("spec", [mk.ActivationSpec(d, k, i) for i in ISAS for d in DTYPES
                                  for k in ("sigmoid", "tanh", "gelu", "erf")], ids=str)
def test_relative_accuracy_near_zero(spec):
    """Tiny inputs keep their digits: odd polynomials near 0, no 1 - (1 - x)."""
    x = np.concatenate([np.geomspace(1e-30, 1e-4, 500), -np.geomspace(1e-30, 1e-4, 500)])
    x = x.astype(spec.np_dtype)
    out = np.empty_like(x)
    mk.compile(spec)(x, out)
    expected = activation_values(spec.kind, x)
    assert np.all(np.abs(out - expected) <= RTOL[spec.dtype] * np.abs(expected))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_keeps_its_relative_accuracy_in_the_negative_tail(dtype):
    """gelu(x) for x down to where it underflows: from erfc, not 1 + erf(x / sqrt 2)."""
    spec = mk.ActivationSpec(dtype, "gelu", ISAS[0])
    x = -np.linspace(3, 12.5 if dtype == "f32" else 37.5, 5001).astype(spec.np_dtype)
    out = np.empty_like(x)
    mk.compile(spec)(x, out)
    expected = activation_values("gelu", x)
    assert np.all(np.abs(expected) > np.finfo(spec.np_dtype).tiny)
    assert max_relative_error(dtype, out, expected) < RTOL[dtype]


def test_the_kernels_are_vector_code_without_calls():
    """No scalar libm (or any other) call: exp, erf and the rest are vector instructions."""
    for kind in ("gelu", "gelu_tanh", "tanh", "sigmoid", "erf"):
        for dtype in DTYPES:
            spec = mk.ActivationSpec(dtype, kind, ISAS[0])
            asm = mk.compile(spec).asm
            body = asm[asm.index(spec.name + ":"):]
            assert "call" not in body, f"{spec} calls out:\n{body}"
            if ISAS[0] == "avx2":
                assert "ymm" in body and "vdivp" in body


def test_the_kernel_refuses_a_wrong_parameter_count():
    kernel = mk.compile(mk.ActivationSpec("f32", "clip", ISAS[0]))
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="clip takes 2 parameters"):
        kernel(x, x, (1.0,))


def test_activation_spec_names():
    spec = mk.ActivationSpec("f32", "gelu_tanh", "avx2")
    assert spec.name == "f32_activation_gelu_tanh__avx2"
    assert mk.parse_name(spec.name) == spec == mk.ActivationSpec.parse(spec.name)
    for spec in SPECS:
        assert mk.parse_name(spec.name) == spec
    for name in ("f32_activation_softmax__avx2", "f32_activation___avx2",
                 "f16_activation_relu__avx2", "f32_activation_relu__sse"):
        with pytest.raises(ValueError):
            mk.parse_name(name)


def test_apply_checks_its_parameter_count():
    from llvmlite import ir
    from microkernels.activation import apply
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
    bld = ir.IRBuilder(fn.append_basic_block())
    value = ir.Constant(ir.VectorType(ir.FloatType(), 4), [0.0] * 4)
    with pytest.raises(ValueError, match="leaky_relu"):
        apply(bld, "leaky_relu", value, [])


# cso.Activation

def test_activation_names_and_parameters():
    A = cso.Activation
    assert A("relu6") == A("clip", min=0, max=6.0) == A("clip", min=0.0, max=np.float32(6))
    assert A("relu6").params == {"min": 0.0, "max": 6.0}
    assert A("clip").params == {"min": -math.inf, "max": math.inf}
    assert A("hardtanh") == A("clip", min=-1, max=1)
    assert A("swish") == A("silu")
    assert A("leaky_relu").params == {"alpha": 0.01}
    assert A("leaky_relu", alpha=0.1).params == {"alpha": 0.1}
    assert A("hardsigmoid").params == {"alpha": 1 / 6, "beta": 0.5}
    assert A("hardsigmoid", alpha=0.2).params == {"alpha": 0.2, "beta": 0.5}
    assert A("gelu", approximate="tanh") == A("gelu_tanh") != A("gelu")
    assert A("gelu", approximate="none") == A("gelu")
    assert A("hardsigmoid", alpha=0.2, beta=0.5).vector(np.float32).tolist() == [
        np.float32(0.2), 0.5]
    assert A("relu").vector(np.float64).shape == (0,)
    assert len({A("relu6"), A("clip", min=0, max=6), A("relu")}) == 2
    assert repr(A("leaky_relu", alpha=0.5)) == "Activation('leaky_relu', alpha=0.5)"
    assert pickle.loads(pickle.dumps(A("hardsigmoid", alpha=0.2))) == A("hardsigmoid", alpha=0.2)
    for kind in KINDS:
        assert A(kind).kind == kind
    with pytest.raises(AttributeError):
        A("relu").kind = "tanh"


def test_activation_of():
    A = cso.Activation
    assert A.of(None) == A("identity")
    assert A.of("relu") == A("relu")
    act = A("clip", min=-2, max=2)
    assert A.of(act) is act
    with pytest.raises(TypeError, match="activation must be None, a name or a cso.Activation"):
        A.of(3)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("softmax",), {}, ValueError, "unknown activation 'softmax'"),
    ((None,), {}, TypeError, "kind must be a str"),
    (("relu",), {"alpha": 0.1}, TypeError, "unexpected parameter.*alpha"),
    (("clip",), {"low": 0.0}, TypeError, "unexpected parameter.*low.*min, max"),
    (("relu6",), {"max": 5.0}, TypeError, "takes no parameters"),
    (("clip",), {"min": math.nan}, ValueError, "min must be a number"),
    (("clip",), {"max": "6"}, TypeError, "max must be a real number"),
    (("leaky_relu",), {"alpha": True}, TypeError, "alpha must be a real number"),
    (("leaky_relu",), {"alpha": math.inf}, ValueError, "alpha must be finite"),
    (("hardsigmoid",), {"beta": math.nan}, ValueError, "beta must be finite"),
    (("hardsigmoid",), {"alpha": None}, TypeError, "alpha must be a real number"),
    (("gelu",), {"approximate": "erf"}, ValueError, "approximate must be 'none' or 'tanh'"),
    (("gelu_tanh",), {"approximate": "tanh"}, TypeError, "unexpected parameter"),
])
def test_activation_refuses_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        cso.Activation(*args, **kwargs)


# cso.activate

def expected_of(activation, x):
    activation = cso.Activation.of(activation)
    return activation_values(activation.kind, x, activation.values)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activate_on_each_isa(isa, dtype, monkeypatch, rng):
    monkeypatch.setenv("CSO_ISA", isa)
    x = (rng.standard_normal((3, 5, 7)) * 5).astype(dtype)
    for activation in ("gelu", "silu", cso.Activation("leaky_relu", alpha=0.3), "relu6"):
        y = cso.activate(x, activation)
        assert y.shape == x.shape and y.dtype == x.dtype and y.flags.c_contiguous
        assert_accurate(cso.Activation.of(activation).kind,
                        "f32" if dtype == np.float32 else "f64", x.ravel(), y.ravel(),
                        expected_of(activation, x).ravel())


def test_activate_splits_large_arrays_into_parts(rng):
    """Several parts on two threads give what one kernel call gives, bit for bit."""
    x = (rng.standard_normal(5 * cso.activations.MIN_PART + 77) * 10).astype(np.float32)
    single = np.empty_like(x)
    mk.compile(mk.ActivationSpec("f32", "gelu", mk.default_isa().name))(x, single)
    threads = cso.get_num_threads()
    try:
        for n in (1, 2, 3):
            cso.set_num_threads(n)
            np.testing.assert_array_equal(cso.activate(x, "gelu"), single)
    finally:
        cso.set_num_threads(threads)


def test_activate_in_place_and_into_out(rng):
    x = rng.standard_normal(1000)
    expected = expected_of("tanh", x)
    out = np.empty_like(x)
    assert cso.activate(x, "tanh", out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-13)
    y = x.copy()
    assert cso.activate(y, "tanh", out=y) is y
    np.testing.assert_array_equal(y, out)
    y = x.copy()
    view = y.reshape(10, 100)[:]   # the same memory through another array object
    cso.activate(y.reshape(10, 100), "tanh", out=view)
    np.testing.assert_array_equal(y, out)


def test_activate_is_recorded_and_replayed():
    """A recorded call is a job like a convolution's: its replay reads what x holds then."""
    x = np.linspace(-3, 3, 101)
    out = np.empty_like(x)
    recording = cso.jobs.Recording()
    with recording:
        cso.activate(x, "silu", out=out)
    assert len(recording) == 1
    x *= -2
    out[:] = np.nan
    recording.replay(2)
    np.testing.assert_allclose(out, expected_of("silu", x), rtol=1e-13)


def test_activate_on_any_layout(rng):
    base = rng.standard_normal((40, 30))
    expected = expected_of("sigmoid", base)
    # a transposed and a strided input, into a new array, a strided out, and in place
    for x, e in ((base.T, expected.T), (base[::3, 1::2], expected[::3, 1::2]), (base, expected)):
        np.testing.assert_allclose(cso.activate(x, "sigmoid"), e, rtol=1e-13)
        for out in (np.zeros(x.shape, order="F"), np.zeros(x.shape + (2,))[..., 1]):
            assert cso.activate(x, "sigmoid", out=out) is out
            np.testing.assert_allclose(out, e, rtol=1e-13)
    y = base.copy()
    view = y[::2, ::3]
    assert cso.activate(view, "sigmoid", out=view) is view
    np.testing.assert_allclose(view, expected[::2, ::3], rtol=1e-13)
    np.testing.assert_array_equal(y[1::2], base[1::2])   # the rest untouched


def test_activate_with_overlapping_arrays(rng):
    """out overlapping x elsewhere than exactly: computed from x as it was."""
    buffer = rng.standard_normal(1001)
    x, out = buffer[:-1], buffer[1:]
    expected = expected_of("erf", x.copy())
    cso.activate(x, "erf", out=out)
    np.testing.assert_allclose(out, expected, rtol=1e-13)


def test_activate_small_and_empty_arrays():
    for shape in ((), (0,), (3, 0, 2), (1,)):
        x = np.full(shape, -2.0, np.float32)
        y = cso.activate(x, "relu")
        assert y.shape == shape and y.dtype == np.float32 and np.all(y == 0)
    x = np.float32([1.5, -2.0])
    np.testing.assert_array_equal(cso.activate(x, None), x)   # None: the identity


def test_activate_refuses_bad_arrays():
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="x must be a numpy.ndarray"):
        cso.activate([1.0, 2.0], "relu")
    with pytest.raises(TypeError, match="x must be float32 or float64"):
        cso.activate(np.zeros(4, np.int32), "relu")
    with pytest.raises(TypeError, match="x must be float32 or float64"):
        cso.activate(np.zeros(4, np.float16), "relu")
    with pytest.raises(TypeError, match="out must be of x's dtype float32"):
        cso.activate(x, "relu", out=np.zeros(4))
    with pytest.raises(ValueError, match=r"out must be of x's shape \(4,\)"):
        cso.activate(x, "relu", out=np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        cso.activate(x, "relu", out=[0.0] * 4)
    readonly = np.zeros(4, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        cso.activate(x, "relu", out=readonly)
    with pytest.raises(ValueError, match="unknown activation"):
        cso.activate(x, "mish")
    with pytest.raises(TypeError, match="activation must be"):
        cso.activate(x, 1)


def test_a_recording_keeps_the_job_not_the_callers_arrays(rng):
    """A recorded activation keeps its arguments, not ``x`` and ``out`` (which a model's
    buffers hand out again once nothing else refers to them), and replays on new values."""
    import sys
    from cso.jobs import Recording
    x = rng.standard_normal(1000).astype(np.float32)
    out = np.empty_like(x)
    before = sys.getrefcount(x), sys.getrefcount(out)
    with Recording() as recording:
        cso.activate(x, "silu", out)
    assert len(recording) == 1 and (sys.getrefcount(x), sys.getrefcount(out)) == before
    x[...] = rng.standard_normal(1000)
    recording.replay(1)
    np.testing.assert_allclose(out, activation_values("silu", x), rtol=1e-6, atol=1e-7)
