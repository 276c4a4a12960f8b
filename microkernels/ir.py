"""LLVM IR building blocks shared by every kernel generator: types, intrinsics, masks, the
epilogue's flags and the accumulator loop.

Kernels are parameterised by a spec with a ``dtype`` (short name, ``microkernels.dtypes``) and
``lanes``: ``VectorTypes(spec)`` gives their scalar and vector types; no generator spells a
dtype itself.
"""
from llvmlite import ir

from .dtypes import get_dtype

# the epilogue's run-time flags (bits of an i64 argument): add to what the output holds, add
# the bias, apply the kernel's activation (its spec's ``activation``, ReLU unless it says)
ACCUMULATE, BIAS, ACTIVATE = 1, 2, 4

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()


class VectorTypes:
    """A kernel's element type (``scalar``), its vectors (``vec``, ``lanes`` wide), their zero,
    and the element alignment (``align``, bytes) for ``spec``'s dtype and lanes."""

    def __init__(self, spec):
        dtype = get_dtype(spec.dtype)
        self.lanes = spec.lanes
        self.scalar = dtype.llvm()
        self.vec = ir.VectorType(self.scalar, self.lanes)
        self.zero = ir.Constant(self.vec, [0.0] * self.lanes)
        self.align = dtype.itemsize


class KernelBuilder(VectorTypes):
    """Writes kernel ``spec``'s function ``fn`` (named ``spec.name``, of the class's
    ``FUNCTION_TYPE``, arguments ``ARG_NAMES``, those in ``NOALIAS`` marked so) in ``module``;
    ``args`` are its arguments by name. A family's ``build()`` writes the body and returns
    ``fn``."""
    NOALIAS = ()

    def __init__(self, module, spec):
        super().__init__(spec)
        self.module, self.spec = module, spec
        self.fn = new_function(module, spec.name, self.FUNCTION_TYPE, self.ARG_NAMES, self.NOALIAS)
        self.args = dict(zip(self.ARG_NAMES, self.fn.args))


def suffix(vec):
    """An overloaded intrinsic's name suffix for vector type ``vec`` (``v16f32``)."""
    return f"v{vec.count}{'f32' if isinstance(vec.element, ir.FloatType) else 'f64'}"


def declare(module, name, fnty):
    """Function ``name`` of ``module``, declared with type ``fnty`` unless it already is."""
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, fnty, name)


def fma(module, vec):
    """llvm.fma for vector type ``vec``."""
    return declare(module, f"llvm.fma.{suffix(vec)}", ir.FunctionType(vec, [vec] * 3))


def masked_access(module, vec):
    """(llvm.masked.load, llvm.masked.store) for vector type ``vec``. They take their alignment
    as a pointer attribute; without one they assume 1, which x86 does not mind."""
    mask = ir.VectorType(I1, vec.count)
    load = declare(module, f"llvm.masked.load.{suffix(vec)}.p0", ir.FunctionType(vec, [PTR, mask, vec]))
    store = declare(module, f"llvm.masked.store.{suffix(vec)}.p0",
                    ir.FunctionType(ir.VoidType(), [vec, PTR, mask]))
    return load, store


CACHE_LINE = 64   # bytes: a prefetch brings one line


def prefetch_for_write(module, bld, address):
    """Ask for the cache line at ``address`` (a pointer) to be written soon (llvm.prefetch:
    a hint that never faults, so it may point past the data)."""
    _prefetch(module, bld, address, write=1, locality=3)


def prefetch_to_l2(module, bld, address):
    """Ask for the cache line at ``address`` (a pointer) to be brought to L2, to be read later
    (a hint that never faults)."""
    _prefetch(module, bld, address, write=0, locality=2)


def _prefetch(module, bld, address, write, locality):
    prefetch = declare(module, "llvm.prefetch.p0",
                       ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]))
    bld.call(prefetch, [address, ir.Constant(I32, write), ir.Constant(I32, locality),
                        ir.Constant(I32, 1)])


def new_function(module, name, fnty, arg_names, noalias=()):
    """A new nounwind function ``name`` in ``module`` with named arguments (those named in
    ``noalias`` marked so)."""
    fn = ir.Function(module, fnty, name)
    fn.attributes.add("nounwind")
    for arg, arg_name in zip(fn.args, arg_names):
        arg.name = arg_name
        if arg_name in noalias:
            arg.add_attribute("noalias")
    return fn


def splat(bld, scalar, vec):
    """``scalar`` broadcast to every lane of vector type ``vec``."""
    lane_ids = ir.VectorType(I32, vec.count)
    one = bld.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(I32, 0))
    return bld.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(lane_ids, [0] * vec.count))


def lane_ids(lanes, first=0, ty=I32):
    """The constant vector first, first+1, ... of ``lanes`` integers of type ``ty``."""
    return ir.Constant(ir.VectorType(ty, lanes), list(range(first, first + lanes)))


def lane_number(bld, value, limit):
    """The i64 ``value`` clamped to [0, limit] and narrowed to i32, for lane arithmetic:
    ``limit`` lies past every lane position it is compared with, so the clamp keeps its
    meaning and nothing wraps (64-bit arguments may be row positions past 2**31)."""
    zero, top = ir.Constant(I64, 0), ir.Constant(I64, limit)
    value = bld.select(bld.icmp_signed("<", value, zero), zero, value)
    value = bld.select(bld.icmp_signed(">", value, top), top, value)
    return bld.trunc(value, I32)


# The epilogue: bias and the activation are run-time flags, so one kernel serves every layer.
# The bias is always loaded, from a zero slot when BIAS is off (a select, no branch).

def flags_on(bld, flags, *bits):
    """Whether each of ``bits`` is set in the i64 ``flags`` (i1 values)."""
    return [bld.icmp_unsigned("!=", bld.and_(flags, ir.Constant(I64, bit)), ir.Constant(I64, 0))
            for bit in bits]


def zero_slot(bld, scalar, name=""):
    """A stack slot holding a zero ``scalar``: the bias read when BIAS is off."""
    slot = bld.alloca(scalar, name=name)
    bld.store(ir.Constant(scalar, 0.0), slot)
    return slot


def bias_splat(bld, on, address, slot, types):
    """The bias at ``address`` when ``on``, else the zero in ``slot``, in every lane of
    ``types.vec`` (a ``VectorTypes``)."""
    value = bld.load(bld.select(on, address, slot), typ=types.scalar, align=types.align)
    return splat(bld, value, types.vec)


def accumulate(bld, accs, step, unroll, tests, chains=1, trip=None):
    """Accumulator vectors ``accs`` carried through a loop over rows i = 0, 1, ...: ``step(bld,
    i, accs)`` returns them updated by row i (it may not add blocks). A main loop takes
    ``unroll`` rows a trip while ``tests[0](bld, i)`` (an i1: ``unroll`` more rows from i), row
    u of a trip into chain u % ``chains`` (each chain its own accumulators, starting at
    ``accs``), ``trip(bld, i)`` first when given (once a trip, i its first row: a hint such as
    a prefetch, no accumulators; it may branch, leaving ``bld`` where the trip goes on), then
    a remainder loop one row at a time into chain 0 while ``tests[1](bld, i)``.
    Leaves ``bld`` after the loops; returns [the accumulators of each chain] (chain 0 including
    the remainder)."""
    fn, pre = bld.function, bld.block
    main_head, main_body, rem_head, rem_body, end = (fn.append_basic_block(name) for name in (
        "main_head", "main_body", "rem_head", "rem_body", "loops_done"))
    bld.branch(main_head)

    bld.position_at_end(main_head)
    i = bld.phi(I64, name="i")
    phis = [[bld.phi(acc.type) for acc in accs] for _ in range(chains)]
    bld.cbranch(tests[0](bld, i), main_body, rem_head)
    bld.position_at_end(main_body)
    new = [list(chain) for chain in phis]
    if trip is not None:
        trip(bld, i)
    for u in range(unroll):
        new[u % chains] = step(bld, bld.add(i, ir.Constant(I64, u)), new[u % chains])
    i_next = bld.add(i, ir.Constant(I64, unroll))
    latch = bld.block   # main_body, or the block a ``trip`` that branches ends in
    bld.branch(main_head)
    i.add_incoming(ir.Constant(I64, 0), pre)
    i.add_incoming(i_next, latch)
    for chain, updated in zip(phis, new):
        for phi, init, value in zip(chain, accs, updated):
            phi.add_incoming(init, pre)
            phi.add_incoming(value, latch)

    bld.position_at_end(rem_head)
    j = bld.phi(I64, name="j")
    rem = [bld.phi(acc.type) for acc in accs]
    bld.cbranch(tests[1](bld, j), rem_body, end)
    bld.position_at_end(rem_body)
    rem_new = step(bld, j, rem)
    j_next = bld.add(j, ir.Constant(I64, 1))
    bld.branch(rem_head)
    j.add_incoming(i, main_head)
    j.add_incoming(j_next, rem_body)
    for phi, init, value in zip(rem, phis[0], rem_new):
        phi.add_incoming(init, main_head)
        phi.add_incoming(value, rem_body)
    bld.position_at_end(end)
    return [rem] + phis[1:]
