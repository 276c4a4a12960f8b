"""LLVM IR generator for the depthwise micro-kernel: one output channel of a padded slab.

Contract: for the virtual positions 0 <= v < ``positions`` of a slab whose virtual rows are
``width`` wide (of which the first ``q`` columns are real output columns, the rest padding)

    out[v - (v // width) * (width - q)] = act(sum_{t < taps} weights[t] * slab[v + offsets[t]]
                                              (+ bias[0]))           for every v % width < q

``offsets`` are element offsets (int64) of the taps on the slab, as
``cso.loop_nests.define_slab_offsets`` lays them out for one channel (a depthwise convolution:
one input channel per output channel); ``taps`` may cover several channels' slabs as well.
``flags``: BIAS adds ``bias[0]`` (read only then), ACTIVATE applies ``spec.activation``
(``act``) with its parameters at ``params`` (the same for every call of a layer, so a select).

The kernel is vectorised along the virtual rows: a block of ``spec.vectors`` vectors of
consecutive positions, ``spec.vectors`` accumulators, each tap a broadcast weight times an
unaligned load of the slab. A block may span several output rows (small planes: a 7 x 7 output
is 61 positions on a 9-wide slab, four 16-lane vectors instead of seven row vectors). Where the
ISA has a lane permute and a vector spans at most one run of padding columns, its real lanes
are permuted to the front and stored as a whole vector (the lanes past them are overwritten by
the next vectors' stores; only a store past the output's end is masked); otherwise each vector
is stored row by row with masked stores of the lanes on real columns. Either way padding
columns never reach the output and nothing past its end is written. The last block has fewer vectors (binary
steps down from ``spec.vectors``); a short block sums the taps in several interleaved chains so
that the FMAs still overlap. The slab is read up to the end of the last vector, less than one
vector past ``positions + offsets[t]``: the caller keeps that readable.
"""
from llvmlite import ir

from .activation import load_params, store_activation
from .ir import (ACTIVATE, BIAS, I64, PTR, KernelBuilder, accumulate, bias_splat, declare,
                 flags_on, fma, lane_ids, lane_number, masked_access, splat, zero_slot)
from .isa import get_isa

ARG_NAMES = ("taps", "slab", "offsets", "weights", "out", "positions", "width", "q", "bias",
             "flags", "params")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [I64, PTR, PTR, PTR, PTR, I64, I64, I64, PTR, I64,
                                                PTR])


def define_depthwise(module, spec):
    """Define the depthwise kernel for ``spec`` (a ``DepthwiseSpec``) in ``module`` and return
    it."""
    return _DepthwiseBuilder(module, spec).build()


class _DepthwiseBuilder(KernelBuilder):
    FUNCTION_TYPE, ARG_NAMES, NOALIAS = FUNCTION_TYPE, ARG_NAMES, ("slab", "out")

    def __init__(self, module, spec):
        super().__init__(module, spec)
        self.fma = fma(module, self.vec)
        self.masked_store = masked_access(module, self.vec)[1]
        self.lane_ids = lane_ids(self.lanes)
        self.index = ir.VectorType(ir.IntType(8 * self.align), self.lanes)   # permute indices
        isa = get_isa(spec.isa)
        permute = isa.permute(self.align)
        self.permute = permute and declare(module, permute, ir.FunctionType(
            self.vec, [self.vec, self.index, self.vec]))
        lane_permute = isa.lane_permute(self.align)
        self.lane_permute = lane_permute and (declare(module, lane_permute[0], ir.FunctionType(
            self.vec, [self.vec, self.index] + [self.vec] * (lane_permute[1] - 1))),
            lane_permute[1])

    def const(self, value):
        return ir.Constant(I64, value)

    def build(self):
        a = self.args
        bld = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.bias_on, self.activate_on = flags_on(bld, a["flags"], BIAS, ACTIVATE)
        self.params = load_params(bld, self.spec.activation, a["params"], self)
        self.bias = bias_splat(bld, self.bias_on, a["bias"], zero_slot(bld, self.scalar), self)
        self.gap = bld.sub(a["width"], a["q"])
        total = bld.udiv(bld.add(a["positions"], self.const(self.lanes - 1)),
                         self.const(self.lanes))                          # vectors
        if not self.lane_permute:
            self._body(bld, total, packed=False)
            return self.fn
        # a vector spans at most two rows and one run of padding columns: its real lanes
        # permuted together and stored plainly (see _store_packed)
        one_gap = bld.and_(bld.icmp_signed(">=", a["width"], self.const(self.lanes)),
                           bld.icmp_signed(">=", a["q"], self.const(self.lanes - 1)))
        packed, rows = self.fn.append_basic_block("packed"), self.fn.append_basic_block("rows")
        bld.cbranch(one_gap, packed, rows)
        for block, is_packed in ((packed, True), (rows, False)):
            bld.position_at_end(block)
            self._body(bld, total, is_packed)
        return self.fn

    def _body(self, bld, total, packed):
        """The vectors of positions 0 .. ``total`` vectors, stored real lanes packed together
        (``_store_packed``) or row by row (``_store``)."""
        a = self.args
        zero = self.const(0)
        self.packed = packed
        if packed:
            # the stores' state: (next position, its column, its output index); the output
            # ends after the last position's
            last = bld.sub(a["positions"], self.const(1))
            self.out_end = bld.add(bld.sub(last, bld.mul(bld.udiv(last, a["width"]), self.gap)),
                                   self.const(1))
            state = (zero, zero, zero)
        else:
            # the stores' state: (next position, a row at or before it, that row's end of real
            # columns (at most ``positions``), the row's output base out - row*gap)
            state = (zero, zero, self._row_end(bld, zero), a["out"])
        # whole blocks, then the remaining vectors in binary steps (each at most once)
        state = self._loop(bld, state, total)
        left = bld.urem(total, self.const(self.spec.vectors))
        step = 1 << (self.spec.vectors.bit_length() - 1)
        if step == self.spec.vectors:
            step //= 2
        while step:
            take = bld.icmp_unsigned("!=", bld.and_(left, self.const(step)), zero)
            state = self._maybe_block(bld, take, state, step)
            step //= 2
        bld.ret_void()

    def _slab_vectors(self, bld, first, count):
        """``count`` consecutive vectors from ``first``: unaligned loads, or, with a two-source
        permute, ``count + 1`` aligned loads each pair permuted by the element offset of
        ``first`` in its vector (a tap's vectors mostly straddle two cache lines, and such
        loads slow the kernel down: csa/TUNING.md). The aligned loads read up to a vector past
        the unaligned ones."""
        if self.permute is None:
            return [bld.load(bld.gep(first, [self.const(b * self.lanes)], source_etype=self.scalar),
                             typ=self.vec, align=self.align) for b in range(count)]
        size = self.lanes * self.align                  # vector bytes
        address = bld.ptrtoint(first, I64)
        aligned = bld.inttoptr(bld.and_(address, self.const(-size)), PTR)
        shift = bld.lshr(bld.and_(address, self.const(size - 1)),
                         self.const(self.align.bit_length() - 1))   # elements
        if self.index.element.width < 64:
            shift = bld.trunc(shift, self.index.element)
        index = bld.add(splat(bld, shift, self.index),
                        ir.Constant(self.index, list(range(self.lanes))))
        loads = [bld.load(bld.gep(aligned, [self.const(b * self.lanes)], source_etype=self.scalar),
                          typ=self.vec, align=size) for b in range(count + 1)]
        return [bld.call(self.permute, [loads[b], index, loads[b + 1]]) for b in range(count)]

    def _row_end(self, bld, row):
        a = self.args
        end = bld.add(bld.mul(row, a["width"]), a["q"])
        return bld.select(bld.icmp_signed("<", a["positions"], end), a["positions"], end)

    def _row_base(self, bld, row):
        return bld.gep(self.args["out"], [bld.neg(bld.mul(row, self.gap))],
                       source_etype=self.scalar)

    def _merge(self, bld, incoming):
        """Phis in the current block joining the states ``incoming`` [(state, block)]."""
        phis = [bld.phi(value.type) for value in incoming[0][0]]
        for state, block in incoming:
            for phi, value in zip(phis, state):
                phi.add_incoming(value, block)
        return tuple(phis)

    def _loop(self, bld, state, total):
        """Blocks of ``spec.vectors`` vectors while that many are left."""
        vectors = self.spec.vectors
        pre = bld.block
        head, body, after = (self.fn.append_basic_block(name) for name in
                             ("blocks", "block", "blocks_done"))
        bld.branch(head)
        bld.position_at_end(head)
        current = self._merge(bld, [(state, pre)])
        end = bld.mul(total, self.const(self.lanes))
        more = bld.icmp_unsigned("<=", bld.add(current[0], self.const(vectors * self.lanes)), end)
        bld.cbranch(more, body, after)
        bld.position_at_end(body)
        new = self._block(bld, current, vectors)
        bld.branch(head)
        for phi, value in zip(current, new):
            phi.add_incoming(value, bld.block)
        bld.position_at_end(after)
        return current

    def _maybe_block(self, bld, take, state, vectors):
        """A block of ``vectors`` vectors when ``take``."""
        return self._either(bld, take, lambda: self._block(bld, state, vectors), lambda: state)

    def _either(self, bld, test, when_true, when_false):
        """The state ``when_true()`` or ``when_false()`` makes as ``test`` says, each writing
        its code in a block of its own: phis where they join."""
        yes, no, merge = (self.fn.append_basic_block() for _ in range(3))
        bld.cbranch(test, yes, no)
        incoming = []
        for block, make in ((yes, when_true), (no, when_false)):
            bld.position_at_end(block)
            state = make()
            incoming.append((state, bld.block))
            bld.branch(merge)
        bld.position_at_end(merge)
        return self._merge(bld, incoming)

    def _block(self, bld, state, vectors):
        """``vectors`` vectors from the state's position: the tap sum, bias, activation, the
        stores; returns the state after them."""
        chains = max(1, self.spec.vectors // vectors)
        for value in self._taps(bld, state[0], vectors, chains):
            store = self._store_packed if self.packed else self._store
            value = store_activation(bld, self.activate_on, self.spec.activation,
                                     bld.fadd(value, self.bias), self.params)
            state = store(bld, value, state)
        return state

    def _taps(self, bld, v0, vectors, chains):
        """sum over taps of weight * slab vector, for each of ``vectors`` vectors: ``chains``
        taps per loop step, each into its own accumulators (added up at the end), then the
        remaining taps one at a time."""
        a = self.args
        taps = a["taps"]

        def step(bld, t, accs):
            offset = bld.load(bld.gep(a["offsets"], [t], source_etype=I64), typ=I64, align=8)
            weight = bld.load(bld.gep(a["weights"], [t], source_etype=self.scalar),
                              typ=self.scalar, align=self.align)
            weight = splat(bld, weight, self.vec)
            first = bld.gep(a["slab"], [bld.add(v0, offset)], source_etype=self.scalar)
            return [bld.call(self.fma, [value, weight, acc])
                    for value, acc in zip(self._slab_vectors(bld, first, len(accs)), accs)]

        tests = (lambda bld, t: bld.icmp_signed("<=", bld.add(t, self.const(chains)), taps),
                 lambda bld, t: bld.icmp_signed("<", t, taps))
        sums, *others = accumulate(bld, [self.zero] * vectors, step, chains, tests, chains)
        for chain in others:
            sums = [bld.fadd(s, c) for s, c in zip(sums, chain)]
        return sums

    def _store(self, bld, value, state):
        """Store the vector of positions v .. v+lanes-1: one plain store when they all lie on
        the state's row's real columns (the usual case on wide rows), else row by row."""
        v, row, end, base = state
        plain, rows, merge = (self.fn.append_basic_block() for _ in range(3))
        v_next = bld.add(v, self.const(self.lanes))
        bld.cbranch(bld.icmp_signed("<=", v_next, end), plain, rows)
        bld.position_at_end(plain)
        bld.store(value, bld.gep(base, [v], source_etype=self.scalar), align=self.align)
        bld.branch(merge)
        bld.position_at_end(rows)
        row = self._store_rows(bld, value, v, row)
        moved = (row, self._row_end(bld, row), self._row_base(bld, row))
        rows_end = bld.block
        bld.branch(merge)
        bld.position_at_end(merge)
        return (v_next,) + self._merge(bld, [(state[1:], plain), (moved, rows_end)])

    def _store_packed(self, bld, value, state):
        """Store the vector of positions v .. v+lanes-1 (v at column s of its row, o its first
        real position's output index) where the vector spans at most one run of padding
        columns. A vector on its row's real columns (most, on wide rows; within the output
        then, as the last row has all its real columns) is stored as it is, the state moved
        on by additions alone: computed through the clamps of ``_store_straddling``, the state
        was a chain of selects from vector to vector that set the kernel's pace (15 cycles a
        vector of 9 taps, 8 of one; Zen 3)."""
        v, s, o = state
        lanes = self.const(self.lanes)

        def plain():
            bld.store(value, bld.gep(self.args["out"], [o], source_etype=self.scalar),
                      align=self.align)
            return bld.add(v, lanes), bld.add(s, lanes), bld.add(o, lanes)
        return self._either(bld, bld.icmp_signed("<=", bld.add(s, lanes), self.args["q"]),
                            plain, lambda: self._store_straddling(bld, value, state))

    def _store_straddling(self, bld, value, state):
        """``_store_packed`` of a vector that reaches past its row's real columns: its real
        lanes, [0, a) on its row and [b, lanes) on the next, permuted to the front and stored
        at o as a whole vector. Its other lanes land past the real ones, where the next
        vectors' stores overwrite them; a store reaching past the output's end is masked at
        it. Masked stores are microcoded on AMD cores (AVX2 ``vmaskmovps``), too slow to store
        each row's part of a straddling vector (csa/TUNING.md)."""
        a = self.args
        v, s, o = state
        lanes = self.const(self.lanes)

        def clamp(value):
            value = bld.select(bld.icmp_signed("<", value, self.const(0)), self.const(0), value)
            return bld.select(bld.icmp_signed(">", value, lanes), lanes, value)
        first_end, next_start = clamp(bld.sub(a["q"], s)), clamp(bld.sub(a["width"], s))
        gap = bld.sub(next_start, first_end)
        ids = ir.Constant(self.index, list(range(self.lanes)))
        width = self.index.element.width

        def lane(value):   # an i64 lane count as a splat of the index vector's integers
            return splat(bld, bld.trunc(value, self.index.element) if width < 64 else value,
                         self.index)
        after = bld.icmp_signed(">=", ids, lane(first_end))
        index = bld.add(ids, bld.select(after, lane(gap), ir.Constant(self.index, [0] * self.lanes)))
        permute, sources = self.lane_permute
        # a vector on real columns only (most, on wide rows) needs no permute
        inside = bld.icmp_signed("==", first_end, lanes)
        front = bld.select(inside, value,
                           bld.call(permute, [value, index] + [value] * (sources - 1)))
        ptr = bld.gep(a["out"], [o], source_etype=self.scalar)
        plain, masked, merge = (self.fn.append_basic_block() for _ in range(3))
        bld.cbranch(bld.icmp_signed("<=", bld.add(o, lanes), self.out_end), plain, masked)
        bld.position_at_end(plain)
        bld.store(front, ptr, align=self.align)
        bld.branch(merge)
        bld.position_at_end(masked)
        left = self._lane(bld, bld.sub(self.out_end, o))
        keep = bld.icmp_signed("<", self.lane_ids, splat(bld, left, self.lane_ids.type))
        bld.call(self.masked_store, [front, ptr, keep])
        bld.branch(merge)
        bld.position_at_end(merge)
        s_next = bld.add(s, lanes)
        s_next = bld.select(bld.icmp_signed(">=", s_next, a["width"]),
                            bld.sub(s_next, a["width"]), s_next)
        real = bld.add(first_end, bld.sub(lanes, next_start))
        return bld.add(v, lanes), s_next, bld.add(o, real)

    def _store_rows(self, bld, value, v, row):
        """Store the vector of positions v .. v+lanes-1 row by row (the lanes on real columns
        below ``positions``), from virtual row ``row`` (at or before the one holding v; rows
        ending before v are skipped); returns the last row it touches."""
        a = self.args
        width, q, positions = a["width"], a["q"], a["positions"]
        pre = bld.block
        head, store, advance, after = (self.fn.append_basic_block() for _ in range(4))
        bld.branch(head)
        bld.position_at_end(head)
        r = bld.phi(I64)
        start = bld.mul(r, width)                              # the row's first position
        next_start = bld.add(start, width)
        bld.cbranch(bld.icmp_signed("<=", next_start, v), advance, store)
        bld.position_at_end(store)
        end = bld.add(start, q)                                # its real columns' end
        end = bld.select(bld.icmp_signed("<", positions, end), positions, end)
        lo, hi = (self._lane(bld, bld.sub(x, v)) for x in (start, end))
        ids = self.lane_ids
        mask = bld.and_(bld.icmp_signed(">=", ids, splat(bld, lo, ids.type)),
                        bld.icmp_signed("<", ids, splat(bld, hi, ids.type)))
        ptr = bld.gep(a["out"], [bld.sub(v, bld.mul(r, self.gap))], source_etype=self.scalar)
        bld.call(self.masked_store, [value, ptr, mask])
        # the next row starts inside this vector: store its lanes too
        inside = bld.icmp_signed("<", next_start, bld.add(v, self.const(self.lanes)))
        bld.cbranch(inside, advance, after)
        bld.position_at_end(advance)
        r_next = bld.add(r, self.const(1))
        bld.branch(head)
        r.add_incoming(row, pre)
        r.add_incoming(r_next, advance)
        bld.position_at_end(after)
        return r

    def _lane(self, bld, value):
        """``value`` clamped to [0, lanes], as an i32 lane number."""
        return lane_number(bld, value, self.lanes)
