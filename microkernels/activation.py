"""Activation functions as LLVM IR on vectors, and the elementwise kernel that applies one.

``apply(bld, kind, value, params)`` returns activation ``kind`` (``spec.ACTIVATIONS``) of the
float vector ``value``; ``params`` are its parameters as run-time vectors of ``value``'s type,
in the order ``ACTIVATIONS[kind]`` names them. Anything that writes vectors can call it (a
kernel's store as well as ``define_activation``'s loop). The code is branch-free vector IR for
any float vector type: the ISA only sets the width, the dtype the constants.

The semantics are PyTorch's; NaN gives NaN (relu and clip too), infinities give the limits
(silu, gelu and hardswish of -inf are 0, not -inf * 0), and nothing overflows on the way.

The math, within 1e-6 (float32) or 1e-13 (float64) of the exact value, relative, most
functions within 1 to 3 ulps (``tests/test_activations.py``; near zero hardsigmoid is as
exact as alpha rounded to the dtype allows, gelu_tanh for very negative x as its argument's
rounding allows):

- exp(x): x = n ln2 + r, |r| <= ln2 / 2, n rounded by adding 1.5 * 2**mantissa bits (no
  float-to-int conversion, which AVX2 lacks for float64), ln2 in two parts (Cody and Waite),
  exp(r) by its Taylor polynomial to below half an ulp, times 2**(n/2) twice: exp of any
  clamped x over- or underflows (to gradual underflow) exactly as the true value would.
- sigmoid: e = exp(-|x|), then 1 / (1 + e) or e / (1 + e): no cancellation on either side.
- tanh: x (1 + x**2 P(x**2)) below 0.625 (relative accuracy near 0), else (1 - e) / (1 + e)
  with e = exp(-2|x|), the sign copied back.
- erf and erfc of z >= 0: z P(z**2) below 0.5; above, erfc(z) = exp(-z**2) t G(t) with
  t = 2 / (2 + z), z**2 taken exactly as hi + lo (an FMA), so erfc keeps its relative
  accuracy deep into the tail; erf = 1 - erfc there.
- gelu: x/2 (1 + erf(x / sqrt 2)), from erfc on the negative side (1 + erf(z) cancels), with
  x**2 / 2 exact as above; gelu_tanh: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x**3), as
  0.5 (1 + tanh(u)) = sigmoid(2u) without its cancellation for negative x.

The polynomials were fitted per dtype (Chebyshev interpolation at 60 digits, with mpmath), to
about half an ulp with their coefficients rounded to the dtype.
"""
import math
from fractions import Fraction

import numpy as np
from llvmlite import ir

from .dtypes import DTYPES
from .ir import (I32, PTR, VectorTypes, declare, fma, lane_ids, lane_number, masked_access, splat,
                 suffix)
from .loop_ir import LoopCode
from .spec import ACTIVATIONS

# ln 2 to 40 digits: its two parts for the range reduction
LN2 = Fraction("0.6931471805599453094172321214581765680755")

# dtype -> the degree of exp(r)'s Taylor polynomial: its remainder is below half an ulp
EXP_DEGREE = {"f32": 7, "f64": 13}
TANH_SMALL = 0.625   # tanh(x) = x (1 + x**2 P(x**2)) below this |x|
ERF_SMALL = 0.5      # erf(z) = z P(z**2) below this z, erfc(z) = exp(-z**2) t G(t) from it on
# dtype -> P of tanh(x) = x (1 + x**2 P(x**2)) on |x| < TANH_SMALL, from the constant term up
TANH_P = {
    "f32": (-0.333333283662796, 0.1333276927471161, -0.05385090783238411, 0.020997179672122,
            -0.006096714176237583),
    "f64": (-0.3333333333333332, 0.13333333333326658, -0.05396825396139557,
            0.021869488260559115, -0.008863229830925709, 0.0035920589774734554,
            -0.001455309297534642, 0.0005874372860094381, -0.00023077616269519857,
            7.959955735264808e-05, -1.724487449484433e-05),
}
# dtype -> P of erf(z) = z P(z**2) on z < ERF_SMALL
ERF_P = {
    "f32": (1.1283791065216064, -0.37612608075141907, 0.1128283143043518,
            -0.026757732033729553, 0.004719082731753588),
    "f64": (1.1283791670955126, -0.37612638903183476, 0.11283791670925353,
            -0.026866170632887928, 0.00522397737302147, -0.0008548297753674966,
            0.00012053335124353741, -1.4845849259707869e-05, 1.4725865480556744e-06),
}
# dtype -> (c, G as a polynomial in t - c) of erfc(z) = exp(-z**2) t G(t), t = 2 / (2 + z),
# on ERF_SMALL <= z <= VectorMath.erfc_zero (where erfc underflows)
ERFC_G = {
    "f32": (0.48131316900253296, (
        0.4981447160243988, 0.6664281487464905, 0.5504184365272522, 0.15824416279792786,
        -0.16186119616031647, -0.11387503147125244, 0.08987728506326675, 0.06024668365716934,
        -0.06595008820295334)),
    "f64": (0.434088750401095, (
        0.4678831002983121, 0.6155656655550897, 0.5259584591595742, 0.18610958214662365,
        -0.13212292808172316, -0.13657406490789217, 0.0643726050523821, 0.09425739805812615,
        -0.06406194307313944, -0.06222347171457573, 0.08126478276527908, 0.021628430450354612,
        -0.09476019541435828, 0.03783842377627542, 0.07853402444331721, -0.1068253945626581,
        -0.004092412916250306, 0.14474467228778087, -0.1259913642492155, -0.1047986360647976,
        0.22717592551616986, 0.020787415852299183, -0.1666061571939093)),
}
GELU_TANH_C = 2 * math.sqrt(2 / math.pi)   # 2u = x (C + C * 0.044715 x**2)


class VectorMath:
    """The activations' math on vectors of type ``vec`` (float or double elements), written
    by ``bld``."""

    def __init__(self, bld, vec):
        self.bld, self.vec = bld, vec
        self.dtype = next(d.short for d in DTYPES.values()
                          if d.llvm_type == type(vec.element).__name__)
        info = np.finfo(DTYPES[self.dtype].np_dtype)
        self.mantissa, self.bias = info.nmant, info.maxexp - 1
        self.float_max = float(info.max)
        self.int = ir.VectorType(ir.IntType(8 * DTYPES[self.dtype].itemsize), vec.count)
        # exp(x) is 0 below -limit (and inf above limit): x is clamped there
        self.exp_limit = (self.bias + self.mantissa + 3) * math.log(2)
        self.erfc_zero = math.sqrt(self.exp_limit)   # erfc(z) = 0 from here on
        self._fma = fma(bld.module, vec)

    def const(self, value):
        return ir.Constant(self.vec, [float(value)] * self.vec.count)

    def fma(self, a, b, c):
        return self.bld.call(self._fma, [a, b, c])

    def _intrinsic(self, name, *args):
        function = declare(self.bld.module, f"llvm.{name}.{suffix(self.vec)}",
                           ir.FunctionType(self.vec, [self.vec] * len(args)))
        return self.bld.call(function, list(args))

    def abs(self, x):
        return self._intrinsic("fabs", x)

    def copysign(self, magnitude, sign):
        return self._intrinsic("copysign", magnitude, sign)

    def less(self, a, b):
        return self.bld.fcmp_ordered("<", a, b)

    def at_least(self, x, low):
        """max(x, low), NaN passing."""
        return self.bld.select(self.less(x, low), low, x)

    def at_most(self, x, high):
        """min(x, high), NaN passing."""
        return self.bld.select(self.less(high, x), high, x)

    def finite_below(self, x):
        """``x`` with -inf made the lowest finite number: a factor of x * f(x), where f(-inf)
        is 0, gives -0 rather than NaN."""
        return self.at_least(x, self.const(-self.float_max))

    def poly(self, x, coefficients, shift=0.0):
        """sum c[k] (x - shift)**k by Horner's rule with FMAs."""
        if shift:
            x = self.bld.fsub(x, self.const(shift))
        acc = self.const(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = self.fma(acc, x, self.const(c))
        return acc

    def exp(self, x):
        """e**x (see the module's docstring)."""
        bld, dtype = self.bld, DTYPES[self.dtype].np_dtype.type
        x = self.at_most(self.at_least(x, self.const(-self.exp_limit)), self.const(self.exp_limit))
        # t holds n = round(x / ln2) in its low bits: adding 1.5 * 2**mantissa rounds x / ln2
        shifter = 1.5 * 2.0 ** self.mantissa
        t = self.fma(x, self.const(1 / math.log(2)), self.const(shifter))
        n = bld.fsub(t, self.const(shifter))
        ln2_hi = float(dtype(float(LN2)))
        ln2_lo = float(dtype(float(LN2 - Fraction(ln2_hi))))
        r = self.fma(n, self.const(-ln2_lo), self.fma(n, self.const(-ln2_hi), x))
        p = self.poly(r, [1 / math.factorial(k) for k in range(EXP_DEGREE[self.dtype] + 1)])
        # 2**n as 2**(n >> 1) * 2**(n - (n >> 1)): each a normal number for every clamped x
        n = bld.sub(bld.bitcast(t, self.int), self._ints(self._bits(shifter)))
        half = bld.ashr(n, self._ints(1))
        return bld.fmul(bld.fmul(p, self._power_of_two(half)),
                        self._power_of_two(bld.sub(n, half)))

    def _bits(self, value):
        """The integer whose bits are those of ``value`` in the dtype."""
        np_dtype = DTYPES[self.dtype].np_dtype
        return int(np.array(value, np_dtype).view(f"i{np_dtype.itemsize}"))

    def _ints(self, value):
        return ir.Constant(self.int, [value] * self.vec.count)

    def _power_of_two(self, k):
        """2.0**k for integers ``k`` of the exponent's range."""
        exponent = self.bld.add(k, self._ints(self.bias))
        return self.bld.bitcast(self.bld.shl(exponent, self._ints(self.mantissa)), self.vec)

    def sigmoid(self, x):
        e = self.exp(self.bld.fneg(self.abs(x)))
        numerator = self.bld.select(self.less(x, self.const(0)), e, self.const(1))
        return self.bld.fdiv(numerator, self.bld.fadd(self.const(1), e))

    def tanh(self, x):
        bld = self.bld
        square = bld.fmul(x, x)
        # x (1 + x**2 P): x + x**3 P would turn -0 into +0
        small = bld.fmul(x, self.fma(square, self.poly(square, TANH_P[self.dtype]), self.const(1)))
        e = self.exp(bld.fmul(self.abs(x), self.const(-2)))
        large = bld.fdiv(bld.fsub(self.const(1), e), bld.fadd(self.const(1), e))
        return bld.select(self.less(self.abs(x), self.const(TANH_SMALL)), small,
                          self.copysign(large, x))

    def erf_erfc(self, z, square):
        """(erf(z), erfc(z)) for ``z`` >= 0 (or NaN), ``square`` = (hi, lo): z**2 = hi + lo
        exactly, from a ``z`` clamped at ``erfc_zero``."""
        bld, one = self.bld, self.const(1)
        hi, lo = square
        small = bld.fmul(z, self.poly(hi, ERF_P[self.dtype]))
        # exp(-hi - lo) = exp(-hi) (1 - lo): lo is below an ulp of hi
        e = self.exp(bld.fneg(hi))
        e = self.fma(e, bld.fneg(lo), e)
        t = bld.fdiv(self.const(2), bld.fadd(self.const(2), z))
        shift, g = ERFC_G[self.dtype]
        large = bld.fmul(bld.fmul(e, t), self.poly(t, g, shift))
        is_small = self.less(z, self.const(ERF_SMALL))
        return (bld.select(is_small, small, bld.fsub(one, large)),
                bld.select(is_small, bld.fsub(one, small), large))

    def _exact_square(self, a):
        """(hi, lo): a**2 = hi + lo exactly (FMA)."""
        hi = self.bld.fmul(a, a)
        return hi, self.fma(a, a, self.bld.fneg(hi))

    def erf(self, x):
        z = self.at_most(self.abs(x), self.const(self.erfc_zero))
        erf, _ = self.erf_erfc(z, self._exact_square(z))
        return self.copysign(erf, x)

    def gelu(self, x):
        bld, half = self.bld, self.const(0.5)
        a = self.at_most(self.abs(x), self.const(self.erfc_zero * math.sqrt(2)))
        hi, lo = self._exact_square(a)   # z**2 = a**2 / 2: halves are exact
        erf, erfc = self.erf_erfc(bld.fmul(a, self.const(math.sqrt(0.5))),
                                  (bld.fmul(hi, half), bld.fmul(lo, half)))
        phi = bld.select(self.less(x, self.const(0)), bld.fmul(half, erfc),
                         self.fma(half, erf, half))
        return bld.fmul(self.finite_below(x), phi)

    def gelu_tanh(self, x):
        bld = self.bld
        inner = self.fma(bld.fmul(x, x), self.const(GELU_TANH_C * 0.044715),
                         self.const(GELU_TANH_C))
        return bld.fmul(self.finite_below(x), self.sigmoid(bld.fmul(x, inner)))

    def silu(self, x):
        return self.bld.fmul(self.finite_below(x), self.sigmoid(x))

    def hardsigmoid(self, x, alpha, beta):
        return self.at_most(self.at_least(self.fma(alpha, x, beta), self.const(0)), self.const(1))

    def hardswish(self, x):
        """x relu6(x + 3) / 6 (PyTorch's form: x + 3 is exact near -3, where it vanishes)."""
        bld = self.bld
        six = self.at_most(self.at_least(bld.fadd(x, self.const(3)), self.const(0)),
                           self.const(6))
        return bld.fmul(self.finite_below(x), bld.fmul(six, self.const(1 / 6)))

    def relu(self, x):
        return self.at_least(x, self.const(0))

    def clip(self, x, low, high):
        """min(max(x, low), high): all ``high`` when low > high (PyTorch's clamp, ONNX Clip)."""
        return self.at_most(self.at_least(x, low), high)

    def leaky_relu(self, x, alpha):
        return self.bld.select(self.less(self.const(0), x), x, self.bld.fmul(x, alpha))

    def identity(self, x):
        return x


def apply(bld, kind, value, params=()):
    """Activation ``kind`` of the float vector ``value``; ``params``: its parameters (vectors
    of ``value``'s type, run-time values), in the order ``ACTIVATIONS[kind]`` names them."""
    if kind not in ACTIVATIONS:
        raise ValueError(f"unknown activation {kind!r}; known: {sorted(ACTIVATIONS)}")
    if len(params) != len(ACTIVATIONS[kind]):
        raise ValueError(f"activation {kind!r} takes parameters {ACTIVATIONS[kind]}, got "
                         f"{len(params)}")
    return getattr(VectorMath(bld, value.type), kind)(value, *params)


# the kinds of a few instructions, no exponential: a store computes them and selects on its flag
SELECTED = frozenset({"relu", "clip", "leaky_relu", "hardsigmoid", "hardswish"})


def load_params(bld, kind, params, types):
    """Activation ``kind``'s parameters read from the pointer ``params`` (consecutive elements
    of ``types.scalar``, in ``ACTIVATIONS[kind]``'s order), each broadcast to ``types.vec``."""
    return [splat(bld, bld.load(bld.gep(params, [ir.Constant(ir.IntType(64), k)],
                                        source_etype=types.scalar),
                                typ=types.scalar, align=types.align), types.vec)
            for k in range(len(ACTIVATIONS[kind]))]


def store_activation(bld, on, kind, value, params):
    """``value`` with activation ``kind`` applied when the i1 ``on`` holds (a select: for a
    store whose flag is the same on every call of a layer, or a cheap activation)."""
    return bld.select(on, apply(bld, kind, value, params), value)


ARGS = ("x", "out", "n", "params")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, PTR, ir.IntType(64), PTR])


def define_activation(module, spec):
    """Define ``void f(T *x, T *out, int64 n, T *params)`` for ``spec`` (an
    ``ActivationSpec``) in ``module`` and return it: out[i] = the activation of x[i] for
    i < n, its parameters at ``params``; whole vectors, then one masked vector for the
    tail, so nothing outside the n elements is read or written; ``out`` may be ``x``."""
    types = VectorTypes(spec)
    vec, lanes, item = types.vec, types.lanes, types.align
    code = LoopCode(module, spec.name, ARGS, pointer_args=("x", "out", "params"))
    bld = code.builder
    x, out, n, params = code.args(*ARGS)

    def pointer(base, i):
        return bld.inttoptr((base + i * item).value, PTR)

    values = load_params(bld, spec.kind, pointer(params, 0), types)
    i = code.var(0)
    with code.while_(lambda: i + lanes <= n):
        value = bld.load(pointer(x, i), typ=vec, align=item)
        bld.store(apply(bld, spec.kind, value, values), pointer(out, i), align=item)
        i.set(i + lanes)
    with code.if_(i < n):
        load, store = masked_access(module, vec)
        left = splat(bld, lane_number(bld, (n - i).value, lanes), ir.VectorType(I32, lanes))
        mask = bld.icmp_signed("<", lane_ids(lanes), left)
        value = bld.call(load, [pointer(x, i), mask, types.zero])
        bld.call(store, [apply(bld, spec.kind, value, values), pointer(out, i), mask])
    code.ret()
    return code.function
