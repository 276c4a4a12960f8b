"""LLVM IR generator for the outer-product convolution micro-kernel (``KernelSpec``).

Contract (BLIS-style): for a vector operand A (k rows of ``width`` values, row i at ``a +
i*lda``) and a broadcast operand B (k rows of ``broadcasts`` values, row i at ``b + i*ldb``)

    C[f][0:width] (+)= sum_i A[i][0:width] * B[i][f]    for f < rows_used, element < width_used

where row f of C starts at ``c + f * ldc``. With windows in vectors A is a packed input tile
(lda = width, or H*W for an unpacked 1x1 input) and B a packed filter tile (ldb =
broadcasts); with filters in vectors the roles swap (windows broadcast, C is the transposed
output tile). Every A row and B row is read in full (``width`` and ``broadcasts`` values: the
packer pads them), so the caller guarantees those are readable; only the store is trimmed to
the used rows and elements, with masked vector accesses, so an edge tile never touches memory
outside its output rows.

A ``"slab"`` kernel reads A in place from a padded input slab instead: row i at ``a +
slab_rows[i]`` (element offsets, ``lda`` unused), and its windows lie on a virtual output row
of ``row_width`` columns of which the last ``gap`` are padding: window j sits at virtual column
``col0 + j`` (``col0 < row_width``, ``col0 + width <= 2*row_width``, so a tile spans at most two
rows). Padding columns are never stored: C is the real row-major output plane (rows of
``row_width - gap`` columns), ``c`` the start of window 0's output row, window j stored at ``c +
col0 + j`` in the first row and ``gap`` elements earlier in the second. A ``"direct"`` kernel
reads B in place instead: row i at ``b + slab_rows[i]`` (``ldb`` unused), its ``broadcasts``
values consecutive (filters in vectors: that many windows along one slab row); it stores like a
packed kernel. A ``"blocked"`` kernel (filters in vectors on channel-blocked activations, see
``cso.layouts``) reads B like a direct kernel but its broadcast f at ``b + slab_rows[i] +
f*ldb`` (a window every ``ldb`` elements: the stride times the input's channel block), and
writes C in place of a blocked output: vector v of row f (a window) at ``c + f*ldc + v*ldv``
(ldc the output's block, ldv its channel-block plane), with the bias along the vectors
(``bias[v*lanes + lane]``, lanes < width_used). Other kernels store vector v at ``v*lanes``
(``ldv`` unused) and ignore ``slab_rows``, ``col0``, ``row_width`` and ``gap``.

``spec.prefetch`` > 0 adds prefetch hints for C's rows that many tiles further along (the
loop nest's later window tiles with windows in vectors): hints, not accesses, they never fault
past the output. ``spec.prefetch_next`` asks, every UNROLL rows of the depth loop (i the
first of them), for the line at ``next + i*next_step`` (bytes) to be brought to L2: with
filters in vectors the caller's share of the filter tile its loop nest reads next, which
would otherwise stream from L3 or memory when a call first reads it, faster than one core's
bandwidth from there (csa/TUNING.md, "Filter tiles prefetched").
Other kernels ignore ``next`` and ``next_step``.

A ``spec.merged`` kernel (blocked) runs filters of groups merged onto blocks
(``packing.merge_groups``): a row's lanes that hold a NaN of the sign bit
(``packing.other_group``) are another group's, and their FMAs are masked off, so that a NaN
or an infinity in one group's input channels reaches its own group's outputs alone, as in
PyTorch.

``flags``: ACCUMULATE adds to C (later channel tiles) instead of overwriting it, BIAS adds
``bias[f]`` (``bias`` is read only when this flag is set), ACTIVATE applies ``spec.activation``
(ReLU unless it says; ``microkernels.activation``) with its parameters read from ``params``
(read whether or not the flag is set, when the kind has any). The loop nest sets ACTIVATE on
the last channel tile only: a cheap activation is a select on the flag, a costlier one (an
exponential) has stores of its own, so that the earlier tiles do not compute it.
One generator serves every dtype and ISA: only the vector width and tile shape change.
"""
import math
import struct

from llvmlite import ir

from .activation import SELECTED, apply, load_params, store_activation
from .ir import (ACCUMULATE, ACTIVATE, BIAS, CACHE_LINE, I64, PTR, KernelBuilder, accumulate,
                 bias_splat, flags_on, fma, lane_ids, masked_access, prefetch_for_write,
                 prefetch_to_l2, splat, zero_slot)

UNROLL = 4  # k-loop unroll; a power of two

ARG_NAMES = ("k", "a", "lda", "b", "ldb", "c", "ldc", "ldv", "width_used", "rows_used", "bias",
             "flags", "slab_rows", "col0", "row_width", "gap", "params", "next", "next_step")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [I64, PTR, I64, PTR, I64, PTR, I64, I64, I64, I64,
                                                PTR, I64, PTR, I64, I64, I64, PTR, PTR, I64])


def define_kernel(module, spec):
    """Define the kernel function for ``spec`` (a ``KernelSpec``) in ``module`` and return it."""
    return _KernelBuilder(module, spec).build()


class _KernelBuilder(KernelBuilder):
    FUNCTION_TYPE, ARG_NAMES, NOALIAS = FUNCTION_TYPE, ARG_NAMES, ("a", "b", "c")

    def __init__(self, module, spec):
        super().__init__(module, spec)
        self.fma = fma(module, self.vec)
        self.masked_load, self.masked_store = masked_access(module, self.vec)

    def build(self):
        spec, k = self.spec, self.args["k"]
        bld = ir.IRBuilder(self.fn.append_basic_block("entry"))
        slot = zero_slot(bld, self.scalar, "zero_slot")
        self._prefetch_output(bld)
        # a blocked kernel's broadcasts a run-time stride apart (``_blocked_address``): its
        # loop unrolled, LLVM spilled accumulators (float64 14 x 16 on AVX-512; AVX2's 6 x 16
        # at half speed before the addresses were as now)
        unroll = 1 if spec.variant == "blocked" else UNROLL
        k_main = bld.and_(k, ir.Constant(I64, -unroll), name="k_main")
        # UNROLL rows of A and B per trip, then the last k mod UNROLL one at a time
        tests = (lambda bld, i: bld.icmp_unsigned("<", i, k_main),
                 lambda bld, i: bld.icmp_unsigned("<", i, k))
        accs, = accumulate(bld, [self.zero] * (spec.broadcasts * spec.vectors), self._step,
                           unroll, tests, trip=self._prefetch_next if spec.prefetch_next else None)
        self._epilogue(bld, accs, slot)
        return self.fn

    def _prefetch_next(self, bld, row):
        """The line at ``next + row*next_step`` to L2 once every UNROLL rows
        (``spec.prefetch_next``): a hint in each step instead made LLVM spill accumulators of
        12-14 x 32 on AVX-512; a blocked kernel's loop, one row a trip, asks on every fourth row
        behind a branch (against a hint every row: 0.98-1.00x the time at 1 thread, 0.91-1.00x
        at 2, csa/TUNING.md)."""
        args = self.args
        if self.spec.variant == "blocked":
            ask, go_on = self.fn.append_basic_block("prefetch"), self.fn.append_basic_block()
            bld.cbranch(bld.icmp_unsigned("==", bld.and_(row, ir.Constant(I64, UNROLL - 1)),
                                          ir.Constant(I64, 0)), ask, go_on)
            bld.position_at_end(ask)
        address = bld.add(bld.ptrtoint(args["next"], I64), bld.mul(row, args["next_step"]))
        prefetch_to_l2(self.module, bld, bld.inttoptr(address, PTR))
        if self.spec.variant == "blocked":
            bld.branch(go_on)
            bld.position_at_end(go_on)

    def _prefetch_output(self, bld):
        """With ``spec.prefetch``, each line of C's rows ``prefetch`` tiles past this one
        (a slab kernel's from ``col0``): the stores of a later tile, which a cold line would
        stall (issued first, to arrive while this tile's FMAs run)."""
        spec, args = self.spec, self.args
        if not spec.prefetch:
            return
        ahead = ir.Constant(I64, spec.prefetch * spec.width)
        if spec.variant == "slab":
            ahead = bld.add(ahead, args["col0"])
        line = CACHE_LINE // self.align
        for f in range(spec.broadcasts):
            row = bld.add(bld.mul(ir.Constant(I64, f), args["ldc"]), ahead)
            for at in range(0, max(spec.width, line), line):
                prefetch_for_write(self.module, bld, bld.gep(
                    args["c"], [bld.add(row, ir.Constant(I64, at))], source_etype=self.scalar))

    def _step(self, bld, row, accs):
        """One rank-1 update: accs[f][v] += A[row][v-th vector] * B[row][f]."""
        spec, args = self.spec, self.args
        a, b = args["a"], args["b"]
        a_row, b_row = bld.mul(row, args["lda"]), bld.mul(row, args["ldb"])
        if spec.variant != "packed":   # the slab operand's row from the offset table
            offset = bld.load(bld.gep(args["slab_rows"], [row], inbounds=True, source_etype=I64),
                              typ=I64, align=8)
            a_row, b_row = (offset, b_row) if spec.variant == "slab" else (a_row, offset)

        def a_vec(v):
            ptr = bld.gep(a, [bld.add(a_row, ir.Constant(I64, v * spec.lanes))],
                          inbounds=True, source_etype=self.scalar)
            return bld.load(ptr, typ=self.vec, align=self.align)

        bases = ([bld.gep(b, [b_row], inbounds=True, source_etype=self.scalar)]
                 if spec.variant == "blocked" else None)   # (``_blocked_address``)

        def b_vec(f):
            if spec.variant == "blocked":
                ptr = self._blocked_address(bld, bases, f)
            else:
                ptr = bld.gep(b, [bld.add(b_row, ir.Constant(I64, f))], inbounds=True,
                              source_etype=self.scalar)
            return splat(bld, bld.load(ptr, typ=self.scalar, align=self.align), self.vec)

        out = [None] * (spec.broadcasts * spec.vectors)

        def update(i, avec, bvec, own):
            out[i] = bld.call(self.fma, [avec, bvec, accs[i]])
            if own is not None:   # (spec.merged)
                out[i] = bld.select(own, out[i], accs[i])

        def own_lanes(avec):
            return self._own_lanes(bld, avec) if spec.merged else None

        # the fewer operands are loaded first and each of the others streams past them: the
        # accumulators plus that many registers plus one (3 x 32 filters in AVX2's 16: 12 + 3 +
        # 1, where the vectors first, 12 + 4 + 1, spilled accumulators and ran at half speed)
        if spec.vectors <= spec.broadcasts:
            a_vecs = [a_vec(v) for v in range(spec.vectors)]
            owns = [own_lanes(avec) for avec in a_vecs]
            for f in range(spec.broadcasts):
                bvec = b_vec(f)
                for v in range(spec.vectors):
                    update(f * spec.vectors + v, a_vecs[v], bvec, owns[v])
                if spec.variant == "blocked":   # (see _blocked_address)
                    bld.asm(ir.FunctionType(ir.VoidType(), []), "", "", [], True)
        else:
            b_vecs = [b_vec(f) for f in range(spec.broadcasts)]
            for v in range(spec.vectors):
                avec = a_vec(v)
                own = own_lanes(avec)
                for f in range(spec.broadcasts):
                    update(f * spec.vectors + v, avec, b_vecs[f], own)
        return out

    def _own_lanes(self, bld, a):
        """The lanes of filter vector ``a`` that are not another group's (``spec.merged``):
        all but those holding a NaN of the sign bit (``packing.other_group``; a group's own
        NaNs are made positive). Their FMAs are dropped rather than added as zero times the
        input: a NaN or an infinity in one group's channels would make the other groups'
        outputs NaN. (Bits up to those of -inf: an ordered compare, which the select after
        each FMA folds into a masked FMA on AVX-512, where a test for the one value was
        inverted into a compare and a masked move after each FMA.)"""
        ivec = ir.VectorType(ir.IntType(8 * self.align), self.spec.lanes)   # (its bits)
        negative_infinity = int.from_bytes(struct.pack({4: "<f", 8: "<d"}[self.align],
                                                       -math.inf), "little")
        return bld.icmp_unsigned("<=", bld.bitcast(a, ivec),
                                 splat(bld, ir.Constant(ivec.element, negative_infinity), ivec))

    def _blocked_address(self, bld, bases, f):
        """Broadcast ``f`` of a blocked kernel's row, ``f*ldb`` past ``bases[0]``: 0-3 ``ldb``
        past ``bases[f // 4]``, each base 4 ``ldb`` past the one before (appended here), so
        that an address is one x86 operand (base + index * scale) on a few loop-invariant
        multiples of ``ldb``. With every ``f*ldb`` a register of its own (14 windows: 14
        general registers), the offsets spilled, and LLVM's scheduler hoisted all the row's
        broadcasts over the FMAs, spilling accumulators (AVX-512's 14 x 32); an empty asm
        statement after each broadcast's FMAs keeps them in place (csa/TUNING.md,
        "Channel-blocked plans")."""
        ldb = self.args["ldb"]
        while len(bases) <= f // 4:
            bases.append(bld.gep(bases[-1], [bld.shl(ldb, ir.Constant(I64, 2))], inbounds=True,
                                 source_etype=self.scalar))
        return bld.gep(bases[f // 4], [bld.mul(ldb, ir.Constant(I64, f % 4))], inbounds=True,
                       source_etype=self.scalar)

    def _epilogue(self, bld, accs, slot):
        """Store the used rows; four variants: whole tile or partial (masked) x overwrite or
        accumulate. The whole-tile path has every element used (and, for a slab kernel, in
        the first virtual row's real columns). The bias is a select on its flag, and so is a
        cheap activation; a costly one doubles the variants (see the module's docstring)."""
        spec, fn, args = self.spec, self.fn, self.args
        accumulate_on, bias_on, activate_on = flags_on(bld, args["flags"], ACCUMULATE, BIAS,
                                                       ACTIVATE)
        params = load_params(bld, spec.activation, args["params"], self)
        whole = bld.icmp_unsigned("==", args["width_used"], ir.Constant(I64, spec.width))
        full = [(None, None)]
        if spec.variant == "slab":
            col0 = args["col0"]
            row_end = bld.sub(args["row_width"], args["gap"])
            whole = bld.and_(whole, bld.icmp_signed("<=", bld.add(col0, ir.Constant(I64, spec.width)),
                                                    row_end))
            full = [(col0, None)]
        done = fn.append_basic_block("done")
        full_blk, part_blk = fn.append_basic_block("store_full"), fn.append_basic_block("store_part")
        bld.cbranch(whole, full_blk, part_blk)
        for blk in (full_blk, part_blk):
            bld.position_at_end(blk)
            # lane masks only on the partial path: a whole tile stores unmasked
            segs = full if blk is full_blk else self._segments(bld)
            over, add = fn.append_basic_block(), fn.append_basic_block()
            bld.cbranch(accumulate_on, add, over)
            for acc_mode, rows_blk in ((False, over), (True, add)):
                bld.position_at_end(rows_blk)
                for activate in self._activations(bld, activate_on, params):
                    for f in range(spec.broadcasts):
                        if f:  # row 0 always exists (rows_used >= 1)
                            row_blk = fn.append_basic_block()
                            bld.cbranch(bld.icmp_unsigned("<", ir.Constant(I64, f),
                                                          args["rows_used"]), row_blk, done)
                            bld.position_at_end(row_blk)
                        self._store_row(bld, f, accs, segs, acc_mode, bias_on, activate, slot)
                    bld.branch(done)
        bld.position_at_end(done)
        bld.ret_void()

    def _activations(self, bld, on, params):
        """The activation of each store variant, yielded with ``bld`` where that variant's rows
        are to be written: one that selects the activated values when the flag ``on`` holds (a
        cheap kind), or one without the activation and one with it, behind a branch on the
        flag."""
        kind = self.spec.activation
        if kind in SELECTED:
            yield lambda value: store_activation(bld, on, kind, value, params)
            return
        plain, activated = self.fn.append_basic_block(), self.fn.append_basic_block()
        bld.cbranch(on, activated, plain)
        bld.position_at_end(plain)
        yield lambda value: value
        bld.position_at_end(activated)
        yield lambda value: apply(bld, kind, value, params)

    def _segments(self, bld):
        """[(element shift, lane masks per vector)] of a partial tile: elements < width_used;
        for a slab kernel split into the first virtual row's real columns (shift col0) and the
        second row's (shift col0 - gap)."""
        spec, args = self.spec, self.args
        col0, row_width, gap = args["col0"], args["row_width"], args["gap"]
        lanes = spec.lanes
        ivec = ir.VectorType(I64, lanes)
        ids = [lane_ids(lanes, v * lanes, I64) for v in range(spec.vectors)]
        used = [bld.icmp_signed("<", vec_ids, splat(bld, args["width_used"], ivec))
                for vec_ids in ids]
        if spec.variant != "slab":
            return [(None, used)]
        row_end = bld.sub(row_width, gap)
        first, second = [], []
        for vec_ids, ok in zip(ids, used):
            col = bld.add(vec_ids, splat(bld, col0, ivec))            # virtual column, first row
            first.append(bld.and_(ok, bld.icmp_signed("<", col, splat(bld, row_end, ivec))))
            col = bld.sub(col, splat(bld, row_width, ivec))           # virtual column, second row
            second.append(bld.and_(ok, bld.and_(bld.icmp_signed(">=", col, ir.Constant(ivec, [0] * lanes)),
                                                 bld.icmp_signed("<", col, splat(bld, row_end, ivec)))))
        return [(col0, first), (bld.sub(col0, gap), second)]

    def _store_row(self, bld, f, accs, segments, accumulate_on, bias_on, activate, slot):
        """Row f of C: for each vector, (load-add,) bias, ``activate``, store; a segment
        (shift, masks) stores the lanes its masks select ``shift`` elements off (None:
        unmasked)."""
        spec, args = self.spec, self.args
        c, blocked = args["c"], spec.variant == "blocked"
        if not blocked:
            bvec = bias_splat(bld, bias_on, bld.gep(args["bias"], [ir.Constant(I64, f)],
                                                    source_etype=self.scalar), slot, self)
        row = bld.mul(ir.Constant(I64, f), args["ldc"])
        for v in range(spec.vectors):
            if blocked:
                bvec = self._bias_vector(bld, bias_on, v)
            at = bld.add(row, bld.mul(ir.Constant(I64, v), args["ldv"]) if blocked
                         else ir.Constant(I64, v * spec.lanes))
            ptrs = [bld.gep(c, [at if shift is None else bld.add(at, shift)], source_etype=self.scalar)
                    for shift, _ in segments]
            val = accs[f * spec.vectors + v]
            if accumulate_on:
                prev = self.zero
                for ptr, (_, masks) in zip(ptrs, segments):
                    prev = (bld.load(ptr, typ=self.vec, align=self.align) if masks is None else
                            bld.call(self.masked_load, [ptr, masks[v], prev]))
                val = bld.fadd(val, prev)
            val = bld.select(bias_on, bld.fadd(val, bvec), val)
            val = activate(val)
            for ptr, (_, masks) in zip(ptrs, segments):
                if masks is None:
                    bld.store(val, ptr, align=self.align)
                else:
                    bld.call(self.masked_store, [val, ptr, masks[v]])

    def _bias_vector(self, bld, on, v):
        """A blocked kernel's bias of vector v: ``bias[v*lanes + lane]`` for the lanes <
        width_used when ``on``, else zeros (nothing read)."""
        spec, args = self.spec, self.args
        ivec = ir.VectorType(I64, spec.lanes)
        used = bld.icmp_signed("<", lane_ids(spec.lanes, v * spec.lanes, I64),
                               splat(bld, args["width_used"], ivec))
        mask = bld.and_(used, splat(bld, on, ir.VectorType(ir.IntType(1), spec.lanes)))
        ptr = bld.gep(args["bias"], [ir.Constant(I64, v * spec.lanes)], source_etype=self.scalar)
        return bld.call(self.masked_load, [ptr, mask, self.zero])
