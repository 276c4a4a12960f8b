"""Integer loop code in LLVM IR, written like Python: the loop nests and input packers.

The code around the micro-kernels (loop nests, packers) is integer arithmetic on shapes,
offsets and addresses, loops and branches, and calls through function addresses. ``LoopCode``
builds such a function with llvmlite, reading like the Python it replaces: ``Int`` values take
Python's operators with Python's semantics (``//`` and ``%`` round towards minus infinity),
comparisons give ``Bool`` values (``&``, ``|`` and ``~`` combine them: both sides are always
evaluated, so a side that may divide by zero goes in a branch), and control flow is context
managers::

    code = LoopCode(module, "fill", ("dst", "count"))
    with code.range(0, code.arg("count")) as i:
        with code.if_(i % 2 == 0):
            code.store(code.arg("dst"), i, i * i)
    code.ret()

Every value is a 64-bit integer (addresses included); loop variables and ``var`` live in stack
slots that LLVM's optimiser turns into registers. A function compiles in tens of milliseconds,
its object code kept in the persistent cache like a kernel's (``jit.native_function``).
"""
from contextlib import contextmanager

from llvmlite import ir

from .ir import I1, I64, PTR, new_function


class Int:
    """A 64-bit integer value of the function ``code`` builds."""

    __hash__ = None

    def __init__(self, code, value):
        self.code, self._value = code, value

    @property
    def value(self):
        return self._value

    def _binary(self, other, op, swap=False):
        a, b = self.value, self.code.value(other)
        return Int(self.code, op(self.code.builder, *((b, a) if swap else (a, b))))

    def _compare(self, other, op):
        return Bool(self.code, self.code.builder.icmp_signed(op, self.value,
                                                             self.code.value(other)))

    def __neg__(self):
        return 0 - self

    def __bool__(self):
        raise TypeError("a generated value has no truth value while the code is built: "
                        "use LoopCode.if_ or choose")


class Var(Int):
    """A mutable ``Int`` (a stack slot): reads load its current value, ``set`` stores one."""

    def __init__(self, code, slot):
        super().__init__(code, None)
        self._slot = slot

    @property
    def value(self):
        return self.code.builder.load(self._slot, typ=I64)

    def set(self, value):
        self.code.builder.store(self.code.value(value), self._slot)


class Bool:
    """A truth value of the function being built (``&``, ``|``, ``~``)."""

    def __init__(self, code, value):
        self.code, self.value = code, value

    def __and__(self, other):
        return Bool(self.code, self.code.builder.and_(self.value, self.code.truth(other)))

    def __or__(self, other):
        return Bool(self.code, self.code.builder.or_(self.value, self.code.truth(other)))

    def __invert__(self):
        return Bool(self.code, self.code.builder.not_(self.value))

    def __bool__(self):
        raise TypeError("a generated truth value cannot steer Python: use LoopCode.if_")


def _floor_div(builder, a, b):
    """a // b as Python rounds it (towards minus infinity)."""
    quotient, remainder = builder.sdiv(a, b), builder.srem(a, b)
    return builder.sub(quotient, builder.zext(_rounds_down(builder, remainder, b), I64))


def _floor_mod(builder, a, b):
    """a % b as Python computes it (the sign of b)."""
    remainder = builder.srem(a, b)
    return builder.select(_rounds_down(builder, remainder, b), builder.add(remainder, b),
                          remainder)


def _rounds_down(builder, remainder, b):
    """Whether truncated division was one too high: a remainder of the other sign than b."""
    zero = ir.Constant(I64, 0)
    return builder.and_(builder.icmp_signed("!=", remainder, zero),
                        builder.icmp_signed("!=", builder.icmp_signed("<", remainder, zero),
                                            builder.icmp_signed("<", b, zero)))


# Int's operators: both ways round for arithmetic (``2 * i`` as ``i * 2``), comparisons
ARITHMETIC = {"add": ir.IRBuilder.add, "sub": ir.IRBuilder.sub, "mul": ir.IRBuilder.mul,
              "floordiv": _floor_div, "mod": _floor_mod, "and": ir.IRBuilder.and_,
              "or": ir.IRBuilder.or_, "rshift": ir.IRBuilder.ashr}
COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
for _name, _op in ARITHMETIC.items():
    setattr(Int, f"__{_name}__", lambda self, other, op=_op: self._binary(other, op))
    setattr(Int, f"__r{_name}__", lambda self, other, op=_op: self._binary(other, op, True))
for _name, _op in COMPARISONS.items():
    setattr(Int, f"__{_name}__", lambda self, other, op=_op: self._compare(other, op))


class LoopCode:
    """A new nounwind function ``name(i64 arg, ...)`` returning nothing, in ``module``, and the
    builder that writes it: ``arg(name)`` is an argument as an ``Int``; ``pointer_args`` are
    declared as pointers instead (read as their addresses). ``internal`` functions are only
    called from the module's other functions."""

    def __init__(self, module, name, arg_names, pointer_args=(), internal=False):
        self.arg_names = tuple(arg_names)
        types = [PTR if a in pointer_args else I64 for a in arg_names]
        self.function = new_function(module, name, ir.FunctionType(ir.VoidType(), types),
                                     arg_names)
        if internal:
            self.function.linkage = "internal"
        # the stack slots (``var``) are allocated in the entry block, the code starts after it
        slots, start = (self.function.append_basic_block(n) for n in ("slots", "start"))
        self._slots = ir.IRBuilder(slots)
        self._slots.position_before(self._slots.branch(start))
        self.builder = ir.IRBuilder(start)
        self._args = {}
        for arg, arg_name in zip(self.function.args, arg_names):
            value = self.builder.ptrtoint(arg, I64) if arg_name in pointer_args else arg
            self._args[arg_name] = Int(self, value)

    def arg(self, name):
        return self._args[name]

    def args(self, *names):
        return [self._args[n] for n in names]

    # values
    def value(self, x):
        """An i64 ``ir.Value`` of an ``Int``, a ``Bool`` (0 or 1) or a Python int."""
        if isinstance(x, Int):
            return x.value
        if isinstance(x, Bool):
            return self.builder.zext(x.value, I64)
        return ir.Constant(I64, int(x))

    def truth(self, x):
        """An i1 ``ir.Value``: a ``Bool``, or whether an ``Int`` or Python int is non-zero."""
        if isinstance(x, Bool):
            return x.value
        return self.builder.icmp_signed("!=", self.value(x), ir.Constant(I64, 0))

    def int(self, x):
        """``x`` (an ``Int``, a ``Bool`` or a Python int) as an ``Int``."""
        return x if isinstance(x, Int) and not isinstance(x, Var) else Int(self, self.value(x))

    def var(self, initial=0):
        """A new ``Var`` holding ``initial``."""
        variable = Var(self, self._slots.alloca(I64))
        variable.set(initial)
        return variable

    def choose(self, condition, a, b):
        """``a if condition else b``, both sides evaluated (see the module's docstring)."""
        return Int(self, self.builder.select(self.truth(condition), self.value(a),
                                             self.value(b)))

    def min(self, a, *rest):
        a = self.int(a)
        for b in rest:
            a = self.choose(a < b, a, b)
        return a

    def max(self, a, *rest):
        a = self.int(a)
        for b in rest:
            a = self.choose(a > b, a, b)
        return a

    # control flow
    @contextmanager
    def if_(self, condition):
        with self.builder.if_then(self.truth(condition)):
            yield

    @contextmanager
    def if_else(self, condition):
        """``with code.if_else(c) as (then, otherwise): with then: ...; with otherwise: ...``"""
        with self.builder.if_else(self.truth(condition)) as branches:
            yield branches

    def cond(self, condition, then, otherwise):
        """``then() if condition else otherwise()``: only the side taken runs (e.g. one that
        divides by what is zero on the other side)."""
        result = self.var()
        with self.if_else(condition) as (yes, no):
            with yes:
                result.set(then())
            with no:
                result.set(otherwise())
        return Int(self, result.value)

    @contextmanager
    def while_(self, condition):
        """Runs the body while ``condition()`` (built in the loop's head) holds."""
        head, body, done = (self.function.append_basic_block(n) for n in ("while", "do", "done"))
        self.builder.branch(head)
        self.builder.position_at_end(head)
        self.builder.cbranch(self.truth(condition()), body, done)
        self.builder.position_at_end(body)
        yield
        self.builder.branch(head)
        self.builder.position_at_end(done)

    @contextmanager
    def range(self, lo, hi, step=1):
        """``for i in range(lo, hi, step)`` with ``step`` > 0 (``hi`` read once)."""
        i, end = self.var(lo), Int(self, self.value(hi))
        with self.while_(lambda: i < end):
            yield Int(self, i.value)
            i.set(i + step)

    def ret(self):
        self.builder.ret_void()

    # memory and calls
    def load(self, address, index):
        """The int64 at ``address`` + 8*``index``."""
        return Int(self, self.builder.load(self._element(address, index), typ=I64, align=8))

    def store(self, address, index, value):
        self.builder.store(self.value(value), self._element(address, index), align=8)

    def move(self, dst, dst_index, src, src_index, itemsize):
        """The ``itemsize``-byte element at ``src`` + itemsize*``src_index`` copied to ``dst``
        + itemsize*``dst_index``."""
        word = ir.IntType(8 * itemsize)
        value = self.builder.load(self._element(src, src_index, word), typ=word, align=itemsize)
        self.builder.store(value, self._element(dst, dst_index, word), align=itemsize)

    def _element(self, address, index, typ=I64):
        base = self.builder.inttoptr(self.value(address), PTR)
        return self.builder.gep(base, [self.value(index)], source_etype=typ)

    def zero(self, address, count):
        """``count`` bytes at ``address`` set to zero."""
        memset = self.function.module.declare_intrinsic("llvm.memset", [PTR, I64])
        self.builder.call(memset, [self.builder.inttoptr(self.value(address), PTR),
                                   ir.Constant(ir.IntType(8), 0), self.value(count),
                                   ir.Constant(I1, 0)])

    def copy(self, dst, src, count):
        """``count`` bytes at ``src`` copied to ``dst`` (not overlapping)."""
        memcpy = self.function.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        self.builder.call(memcpy, [self.builder.inttoptr(self.value(dst), PTR),
                                   self.builder.inttoptr(self.value(src), PTR),
                                   self.value(count), ir.Constant(I1, 0)])

    def call(self, target, *args):
        """Calls ``target``, a function of this module or (``(address, function_type)``) one at
        an address; integer addresses are passed where it takes pointers."""
        if isinstance(target, tuple):
            address, function_type = target
            function = self.builder.inttoptr(self.value(address), function_type.as_pointer())
        else:
            function, function_type = target, target.function_type
        values = [self.value(a) for a in args]
        self.builder.call(function, [self.builder.inttoptr(v, t) if isinstance(t, ir.PointerType)
                                     else v for v, t in zip(values, function_type.args)])
