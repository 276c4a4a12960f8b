"""LLVM IR generator for the outer-product convolution micro-kernel.

Contract (BLIS-style): for a vector operand A (k rows of ``nwin`` values, row i at ``a + i*lda``)
and a broadcast operand B (k rows of ``nf`` values, row i at ``b + i*ldb``)

    C[f][0:nwin] (+)= sum_i A[i][0:nwin] * B[i][f]      for f < nf_used, window < nwin_used

where row f of C starts at ``c + f * ldc``. In the usual orientation A is a packed input tile
(windows are the vector dimension; lda = nwin, or H*W for an unpacked 1x1 input) and B a packed
filter tile (ldb = nf); for small output planes the roles swap (filters are the vector
dimension, windows broadcast, C is the transposed output tile). Every A row and B row is read in full (``nwin`` and ``nf`` values: the packer pads
them), so the caller guarantees those are readable; only the store is trimmed to the used rows (``nf_used``) and windows
(``nwin_used``), with masked vector accesses, so an edge tile never touches memory outside its
output rows.

A ``"vector"`` slab kernel (``spec.slab``) reads A in place from a padded input slab instead: row i at
``a + a_rows[i]`` (element offsets, ``lda`` unused), and its windows lie on a virtual output row
of ``width`` columns of which the last ``gap`` are padding: window j sits at virtual column
``col0 + j`` (``col0 < width``, ``col0 + nwin <= 2*width``, so a tile spans at most two rows).
Padding columns are never stored: C is the real row-major output plane (rows of ``width - gap``
columns), ``c`` the start of window 0's output row, window j stored at ``c + col0 + j`` in the
first row and ``gap`` elements earlier in the second. A ``"broadcast"`` slab kernel reads B
in place instead: row i at ``b + a_rows[i]`` (``ldb`` unused), its ``nf`` values consecutive
(filters in vectors: ``nf`` windows along one slab row); it stores like a packed kernel. Other
kernels ignore ``a_rows``, ``col0``, ``width`` and ``gap``.

``flags``: ACCUMULATE adds to C (later channel tiles) instead of overwriting it, BIAS adds
``bias[f]`` (``bias`` is read only when this flag is set), RELU clamps at zero (NaN passes).
One generator serves every dtype and ISA: only the vector width and tile shape change.
"""
from llvmlite import ir

ACCUMULATE, BIAS, RELU = 1, 2, 4
UNROLL = 4  # k-loop unroll; a power of two

I32, I64 = ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
ARG_NAMES = ("k", "a", "lda", "b", "ldb", "c", "ldc", "nwin_used", "nf_used", "bias", "flags",
             "a_rows", "col0", "width", "gap")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [I64, PTR, I64, PTR, I64, PTR, I64, I64, I64, PTR, I64,
                                                PTR, I64, I64, I64])


SCALARS = {"f32": ir.FloatType(), "f64": ir.DoubleType()}


def _suffix(vec):
    return f"v{vec.count}{'f32' if isinstance(vec.element, ir.FloatType) else 'f64'}"


def masked_access(module, vec):
    """(llvm.masked.load, llvm.masked.store) for vector type ``vec``. They take their alignment
    as a pointer attribute; without one they assume 1, which x86 does not mind."""
    mask = ir.VectorType(ir.IntType(1), vec.count)
    load = declare(module, f"llvm.masked.load.{_suffix(vec)}.p0", ir.FunctionType(vec, [PTR, mask, vec]))
    store = declare(module, f"llvm.masked.store.{_suffix(vec)}.p0",
                    ir.FunctionType(ir.VoidType(), [vec, PTR, mask]))
    return load, store


def splat(bld, scalar, vec):
    """``scalar`` broadcast to every lane of vector type ``vec``."""
    lane_ids = ir.VectorType(I32, vec.count)
    one = bld.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(I32, 0))
    return bld.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(lane_ids, [0] * vec.count))


def lane_number(bld, value, limit):
    """The i64 ``value`` clamped to [0, limit] and narrowed to i32, for lane arithmetic:
    ``limit`` lies past every lane position it is compared with, so the clamp keeps its
    meaning and nothing wraps (64-bit arguments may be row positions past 2**31)."""
    zero, top = ir.Constant(I64, 0), ir.Constant(I64, limit)
    value = bld.select(bld.icmp_signed("<", value, zero), zero, value)
    value = bld.select(bld.icmp_signed(">", value, top), top, value)
    return bld.trunc(value, I32)


def declare(module, name, fnty):
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, fnty, name)


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


def define_kernel(module, spec):
    """Define the kernel function for ``spec`` in ``module`` and return it."""
    fn = new_function(module, spec.name, FUNCTION_TYPE, ARG_NAMES, noalias=("a", "b", "c"))
    _KernelBuilder(module, fn, spec).build()
    return fn


class _KernelBuilder:
    def __init__(self, module, fn, spec):
        self.spec, self.fn = spec, fn
        self.scalar = SCALARS[spec.dtype]
        self.vec = ir.VectorType(self.scalar, spec.lanes)
        self.zero = ir.Constant(self.vec, [0.0] * spec.lanes)
        self.fma = declare(module, f"llvm.fma.{_suffix(self.vec)}",
                           ir.FunctionType(self.vec, [self.vec] * 3))
        self.masked_load, self.masked_store = masked_access(module, self.vec)
        self.align = spec.np_dtype.itemsize

    def build(self):
        spec, fn = self.spec, self.fn
        k, a, lda, b, ldb, c, ldc, nwin_used, nf_used, bias, flags = fn.args[:11]
        entry = fn.append_basic_block("entry")
        main_head, main_body = fn.append_basic_block("main_head"), fn.append_basic_block("main_body")
        rem_head, rem_body = fn.append_basic_block("rem_head"), fn.append_basic_block("rem_body")
        epilogue = fn.append_basic_block("epilogue")
        bld = ir.IRBuilder(entry)
        zero_slot = bld.alloca(self.scalar, name="zero_slot")  # bias source when BIAS is off
        bld.store(ir.Constant(self.scalar, 0.0), zero_slot)
        k_main = bld.and_(k, ir.Constant(I64, -UNROLL), name="k_main")
        bld.branch(main_head)
        n_acc = spec.nf * spec.vectors

        # Main loop: UNROLL rows of A and B per iteration, accumulators carried in phis.
        bld.position_at_end(main_head)
        i = bld.phi(I64, name="i")
        accs = [bld.phi(self.vec, name=f"acc{j}") for j in range(n_acc)]
        bld.cbranch(bld.icmp_unsigned("<", i, k_main), main_body, rem_head)
        bld.position_at_end(main_body)
        new = list(accs)
        for u in range(UNROLL):
            new = self._step(bld, bld.add(i, ir.Constant(I64, u)), new)
        i_next = bld.add(i, ir.Constant(I64, UNROLL))
        bld.branch(main_head)
        i.add_incoming(ir.Constant(I64, 0), entry)
        i.add_incoming(i_next, main_body)
        for phi, init, upd in zip(accs, [self.zero] * n_acc, new):
            phi.add_incoming(init, entry)
            phi.add_incoming(upd, main_body)

        # Remainder loop: the last k mod UNROLL rows, one at a time.
        bld.position_at_end(rem_head)
        j = bld.phi(I64, name="j")
        raccs = [bld.phi(self.vec, name=f"racc{n}") for n in range(n_acc)]
        bld.cbranch(bld.icmp_unsigned("<", j, k), rem_body, epilogue)
        bld.position_at_end(rem_body)
        rnew = self._step(bld, j, raccs)
        j_next = bld.add(j, ir.Constant(I64, 1))
        bld.branch(rem_head)
        j.add_incoming(i, main_head)
        j.add_incoming(j_next, rem_body)
        for phi, init, upd in zip(raccs, accs, rnew):
            phi.add_incoming(init, main_head)
            phi.add_incoming(upd, rem_body)

        self._epilogue(epilogue, raccs, zero_slot)

    def _step(self, bld, row, accs):
        """One rank-1 update: accs[f][v] += A[row][v-th vector] * B[row][f]."""
        spec = self.spec
        k, a, lda, b, ldb = self.fn.args[:5]
        a_row, b_row = bld.mul(row, lda), bld.mul(row, ldb)
        if spec.slab:   # the slab operand's row from the offset table
            a_rows = self.fn.args[11]
            offset = bld.load(bld.gep(a_rows, [row], inbounds=True, source_etype=I64), typ=I64, align=8)
            a_row, b_row = (offset, b_row) if spec.slab == "vector" else (a_row, offset)
        a_vecs = []
        for v in range(spec.vectors):
            ptr = bld.gep(a, [bld.add(a_row, ir.Constant(I64, v * spec.lanes))],
                          inbounds=True, source_etype=self.scalar)
            a_vecs.append(bld.load(ptr, typ=self.vec, align=self.align))
        out = []
        for f in range(spec.nf):
            ptr = bld.gep(b, [bld.add(b_row, ir.Constant(I64, f))], inbounds=True,
                          source_etype=self.scalar)
            bvec = splat(bld, bld.load(ptr, typ=self.scalar, align=self.align), self.vec)
            for v in range(spec.vectors):
                out.append(bld.call(self.fma, [a_vecs[v], bvec, accs[f * spec.vectors + v]]))
        return out

    def _epilogue(self, block, accs, zero_slot):
        """Store the used rows; four variants: whole tile or partial (masked) x overwrite or
        accumulate. The whole-tile path has every window used (and, for a vector slab kernel, in the
        first virtual row's real columns). Bias and ReLU are cheap selects on the flags."""
        spec, fn = self.spec, self.fn
        c, ldc, nwin_used, nf_used, bias, flags = fn.args[5:11]
        bld = ir.IRBuilder(block)
        flag_on = [bld.icmp_unsigned("!=", bld.and_(flags, ir.Constant(I64, bit)), ir.Constant(I64, 0))
                   for bit in (ACCUMULATE, BIAS, RELU)]
        accumulate, bias_on, relu_on = flag_on
        whole = bld.icmp_unsigned("==", nwin_used, ir.Constant(I64, spec.nwin))
        full = [(None, None)]
        if spec.slab == "vector":
            col0, width, gap = fn.args[12:15]
            row_end = bld.sub(width, gap)
            whole = bld.and_(whole, bld.icmp_signed("<=", bld.add(col0, ir.Constant(I64, spec.nwin)), row_end))
            full = [(col0, None)]
        done = fn.append_basic_block("done")
        full_blk, part_blk = fn.append_basic_block("store_full"), fn.append_basic_block("store_part")
        bld.cbranch(whole, full_blk, part_blk)
        for blk in (full_blk, part_blk):
            bld.position_at_end(blk)
            # lane masks only on the partial path: a whole tile stores unmasked
            segs = full if blk is full_blk else self._segments(bld)
            over, add = fn.append_basic_block(), fn.append_basic_block()
            bld.cbranch(accumulate, add, over)
            for acc_mode, rows_blk in ((False, over), (True, add)):
                bld.position_at_end(rows_blk)
                for f in range(spec.nf):
                    if f:  # row 0 always exists (nf_used >= 1)
                        row_blk = fn.append_basic_block()
                        bld.cbranch(bld.icmp_unsigned("<", ir.Constant(I64, f), nf_used), row_blk, done)
                        bld.position_at_end(row_blk)
                    self._store_row(bld, f, accs, segs, acc_mode, bias_on, relu_on, zero_slot)
                bld.branch(done)
        bld.position_at_end(done)
        bld.ret_void()

    def _segments(self, bld):
        """[(element shift, lane masks per vector)] of a partial tile: windows < nwin_used; for
        a vector slab kernel split into the first virtual row's real columns (shift col0) and the
        second row's (shift col0 - gap)."""
        spec, args = self.spec, self.fn.args
        nwin_used, col0, width, gap = args[7], args[12], args[13], args[14]
        lanes = spec.lanes
        ivec = ir.VectorType(I64, lanes)
        lane_ids = [ir.Constant(ivec, list(range(v * lanes, (v + 1) * lanes))) for v in range(spec.vectors)]
        used = [bld.icmp_signed("<", ids, splat(bld, nwin_used, ivec)) for ids in lane_ids]
        if spec.slab != "vector":
            return [(None, used)]
        row_end = bld.sub(width, gap)
        first, second = [], []
        for ids, ok in zip(lane_ids, used):
            col = bld.add(ids, splat(bld, col0, ivec))            # virtual column, first row
            first.append(bld.and_(ok, bld.icmp_signed("<", col, splat(bld, row_end, ivec))))
            col = bld.sub(col, splat(bld, width, ivec))            # virtual column, second row
            second.append(bld.and_(ok, bld.and_(bld.icmp_signed(">=", col, ir.Constant(ivec, [0] * lanes)),
                                                 bld.icmp_signed("<", col, splat(bld, row_end, ivec)))))
        return [(col0, first), (bld.sub(col0, gap), second)]

    def _store_row(self, bld, f, accs, segments, accumulate, bias_on, relu_on, zero_slot):
        """Row f of C: for each vector, (load-add,) bias, ReLU, store; a segment (shift,
        masks) stores the lanes its masks select ``shift`` elements off (None: unmasked)."""
        spec = self.spec
        c, ldc, bias = self.fn.args[5], self.fn.args[6], self.fn.args[9]
        bias_ptr = bld.select(bias_on, bld.gep(bias, [ir.Constant(I64, f)], source_etype=self.scalar),
                              zero_slot)
        bvec = splat(bld, bld.load(bias_ptr, typ=self.scalar, align=self.align), self.vec)
        row = bld.mul(ir.Constant(I64, f), ldc)
        for v in range(spec.vectors):
            at = bld.add(row, ir.Constant(I64, v * spec.lanes))
            ptrs = [bld.gep(c, [at if shift is None else bld.add(at, shift)], source_etype=self.scalar)
                    for shift, _ in segments]
            val = accs[f * spec.vectors + v]
            if accumulate:
                prev = self.zero
                for ptr, (_, masks) in zip(ptrs, segments):
                    prev = (bld.load(ptr, typ=self.vec, align=self.align) if masks is None else
                            bld.call(self.masked_load, [ptr, masks[v], prev]))
                val = bld.fadd(val, prev)
            val = bld.select(bias_on, bld.fadd(val, bvec), val)
            val = bld.select(relu_on, bld.select(bld.fcmp_ordered("<", val, self.zero), self.zero, val), val)
            for ptr, (_, masks) in zip(ptrs, segments):
                if masks is None:
                    bld.store(val, ptr, align=self.align)
                else:
                    bld.call(self.masked_store, [val, ptr, masks[v]])
