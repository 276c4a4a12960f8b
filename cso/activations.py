"""Activation functions: ``Activation`` describes one (a kind and its parameters), ``activate``
applies one elementwise to an array with compiled vector code on cso's threads.

The semantics are PyTorch's, for float32 and float64 each computed in its own precision: NaN
gives NaN (relu and clip too), the infinities give the function's limits. The kernels
(``microkernels.activation``) are accurate to a few units in the last place.
"""
import math
import numbers
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from microkernels.activation import FUNCTION_TYPE, define_activation
from microkernels.dtypes import dtype_name
from microkernels.isa import ISA_ENV, default_isa
from microkernels.jit import native_function
from microkernels.loop_ir import LoopCode
from microkernels.spec import ACTIVATIONS, ActivationSpec

from .arguments import check_array, is_masked
from .jobs import data_address, run_parts
from .pool import MAX_PARTS
from .threads import get_num_threads

__all__ = ["Activation", "activate"]

# the parameters' defaults (PyTorch's; clip's: no bound, as ONNX Clip)
DEFAULTS = {"clip": {"min": -math.inf, "max": math.inf}, "leaky_relu": {"alpha": 0.01},
            "hardsigmoid": {"alpha": 1 / 6, "beta": 0.5}}
# other names for a kind with its parameters set
ALIASES = {"relu6": ("clip", {"min": 0.0, "max": 6.0}),
           "hardtanh": ("clip", {"min": -1.0, "max": 1.0}), "swish": ("silu", {})}
UNBOUNDED = {"min", "max"}   # the parameters that may be infinite


@dataclass(frozen=True, init=False, repr=False)
class Activation:
    """An activation function: ``kind`` and its parameters, immutable and hashable (a key of
    compiled code).

    ``Activation(kind, **params)``, ``kind`` one of

    - ``"identity"``, ``"relu"``;
    - ``"clip"`` with ``min`` and ``max`` (default: none, -inf and inf), PyTorch's ``clamp``,
      ONNX Clip: ``min(max(x, min), max)``, so all ``max`` when ``min > max``; ``"relu6"``
      is ``clip`` with ``min=0, max=6``, ``"hardtanh"`` with ``min=-1, max=1``;
    - ``"leaky_relu"`` with ``alpha`` (PyTorch's ``negative_slope``, default 0.01):
      ``x if x > 0 else alpha * x``;
    - ``"sigmoid"``, ``"silu"`` (also ``"swish"``: ``x * sigmoid(x)``), ``"tanh"``;
    - ``"hardsigmoid"`` with ``alpha`` and ``beta`` (defaults PyTorch's 1/6 and 0.5; ONNX
      HardSigmoid's are 0.2 and 0.5): ``max(0, min(1, alpha * x + beta))``;
    - ``"hardswish"``: ``x * relu6(x + 3) / 6``;
    - ``"gelu"``, with ``approximate="none"`` (``x/2 (1 + erf(x / sqrt 2))``) or ``"tanh"``
      (``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``, also ``"gelu_tanh"``);
    - ``"erf"``.

    Parameters are real numbers, finite but ``clip``'s bounds, which may be infinite; none
    may be NaN. ``params`` gives them by name, ``vector(dtype)`` in the kernels' order.
    ``Activation.of`` takes what an ``activation=`` argument may be: None (identity), a
    name or an ``Activation``."""
    kind: str
    values: tuple   # the parameters, in the order of ACTIVATIONS[kind]

    def __init__(self, kind, **params):
        if not isinstance(kind, str):
            raise TypeError(f"Activation kind must be a str, got {type(kind).__name__}")
        if kind == "gelu":
            approximate = params.pop("approximate", "none")
            if approximate not in ("none", "tanh"):
                raise ValueError(f"Activation('gelu') approximate must be 'none' or 'tanh', "
                                 f"got {approximate!r}")
            kind = "gelu_tanh" if approximate == "tanh" else kind
        if kind in ALIASES:
            if params:
                raise TypeError(f"Activation({kind!r}) takes no parameters, got "
                                f"{', '.join(params)}")
            kind, params = ALIASES[kind]
        if kind not in ACTIVATIONS:
            raise ValueError(f"unknown activation {kind!r}; known: "
                             f"{', '.join(sorted({*ACTIVATIONS, *ALIASES}))}")
        names = ACTIVATIONS[kind]
        unknown = set(params) - set(names)
        if unknown:
            raise TypeError(f"Activation({kind!r}) got unexpected parameter(s) "
                            f"{', '.join(sorted(unknown))}; it takes "
                            f"{', '.join(names) or 'none'}")
        values = {**DEFAULTS.get(kind, {}), **params}
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "values", tuple(_parameter(kind, n, values[n]) for n in names))

    @classmethod
    def of(cls, activation):
        """``activation`` as an ``Activation``: None is the identity, a str a kind's name."""
        if activation is None:
            return cls("identity")
        if isinstance(activation, str):
            return cls(activation)
        if isinstance(activation, cls):
            return activation
        raise TypeError(f"activation must be None, a name or a cso.Activation, got "
                        f"{type(activation).__name__}")

    @property
    def params(self):
        """The parameters by name."""
        return dict(zip(ACTIVATIONS[self.kind], self.values))

    def vector(self, dtype):
        """The parameters as the kernels take them: an array of ``dtype``."""
        return np.array(self.values, dtype)

    def __repr__(self):
        params = "".join(f", {name}={value!r}" for name, value in self.params.items())
        return f"Activation({self.kind!r}{params})"


def _parameter(kind, name, value):
    """Parameter ``name`` of activation ``kind`` as a float, checked."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"Activation({kind!r}) {name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and name not in UNBOUNDED):
        raise ValueError(f"Activation({kind!r}) {name} must be "
                         f"{'a number' if name in UNBOUNDED else 'finite'}, got {value!r}")
    return value


MIN_PART = 16384   # elements in a part at least: a smaller share costs more to hand out
PART_ALIGN = 16    # parts start at multiples of this many elements: on cache lines of their own
PART_ARGS = ("kernel", "x", "out", "n", "params", "itemsize", "parts")


def define_activation_part(module):
    """The part function ``void activation_part(int64 *args, int64 part)`` (``cso.jobs``):
    the kernel at ``args[0]`` on part ``part`` of ``parts`` contiguous shares of the ``n``
    elements (args as ``PART_ARGS`` names them)."""
    code = LoopCode(module, "activation_part", ("args", "part"), pointer_args=("args",))
    args, part = code.args("args", "part")
    kernel, x, out, n, params, item, parts = (code.load(args, k) for k in range(len(PART_ARGS)))

    def start(p):
        return code.choose(p >= parts, n, n * p // parts // PART_ALIGN * PART_ALIGN)

    first, stop = start(part), start(part + 1)
    code.call((kernel, FUNCTION_TYPE), x + first * item, out + first * item, stop - first,
              params)
    code.ret()
    return code.function


def activate(x, activation, out=None):
    """``activation`` (an ``Activation``, a name, or None: a copy) applied elementwise to
    ``x``, a float32 or float64 array of any shape; the result in ``out`` (a writeable array of
    ``x``'s shape and dtype, which may be ``x`` itself) when given, else in a new array. Runs on
    ``cso.get_num_threads()`` threads for large arrays; arrays that are not C-contiguous go
    through a copy."""
    activation = Activation.of(activation)
    check_array("x", x)
    if out is None:
        out = np.empty(x.shape, x.dtype)
    elif not isinstance(out, np.ndarray) or is_masked(out):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    elif out.dtype != x.dtype:
        raise TypeError(f"out must be of x's dtype {x.dtype}, got {out.dtype}")
    elif out.shape != x.shape:
        raise ValueError(f"out must be of x's shape {x.shape}, got {out.shape}")
    elif not out.flags.writeable:
        raise ValueError("out must be writeable")
    if x.size == 0:
        return out
    same = out is x or (data_address(out) == data_address(x) and out.strides == x.strides)
    source = x
    if not x.flags.c_contiguous or (not same and np.may_share_memory(x, out)):
        source = x.copy(order="C")
    # a strided out is written through a copy: the source's when it is one already
    target = (out if out.flags.c_contiguous else source if source is not x
              else np.empty_like(source))
    # a recording keeps what the job points to but the caller's arrays (its temporaries)
    _run(activation, source, target, [a for a in (source, target) if a is not x and a is not out])
    if target is not out:
        out[...] = target
    return out


@lru_cache(maxsize=None)
def _addresses(kind, dtype, isa_setting):
    """(the part function's address, the kernel's) for ``kind`` on ``dtype`` on the default
    ISA, which ``isa_setting`` (``$CSO_ISA``) decides: looked up once, not on every call."""
    spec = ActivationSpec(dtype_name(dtype), kind, default_isa().name)
    return (native_function(define_activation_part).address,
            native_function(define_activation, spec).address)


def _run(activation, x, out, temporaries):
    """``out`` = the activation of ``x``, both C-contiguous of one dtype and size (>= 1);
    ``temporaries``: those of them the caller made, which a recording keeps."""
    part, kernel = _addresses(activation.kind, x.dtype, os.environ.get(ISA_ENV))
    params = activation.vector(x.dtype)
    threads = get_num_threads()
    parts = max(1, min(threads, x.size // MIN_PART, MAX_PARTS))
    args = np.array([kernel, data_address(x), data_address(out), x.size, data_address(params),
                     x.itemsize, parts], np.int64)
    run_parts(part, data_address(args), parts, threads, keep=(args, params, *temporaries))
