"""Vector row copies for input packing, generated as LLVM IR and called by address from the
packers (``packing`` drives them; the vector code lives here with the other generators).

``copy_rows(dst, dst_step, src, src_step, count, stride, j0, j1, lo, hi)`` fills ``count``
packed tile rows (``width`` values each, moved in vectors of the kernel's lanes; row i at ``dst + i*dst_step`` bytes, read from
``src + i*src_step`` bytes): lanes j0 <= j < j1 of each row get ``src[j * stride]`` when
lo <= j < hi, else zero. The rows share their lanes (one row per channel of the same tap), so
the masks are computed once per call. The source is read with masked vector loads (strides 1-4:
stride*width contiguous values, every stride-th kept by constant shuffles) or masked gathers
(larger strides), so lanes outside [lo, hi) -- taps in the zero padding, windows past the end
of the plane -- are never read, and ``src`` may point outside the input for them. A whole row
of windows moves per vector instruction; no scalar loop runs per element.

Destinations are a part's own scratch (packed tiles, slabs), never shared. A row is stored
exactly: its whole vectors plainly, a last vector that ends inside the row (rows of 5, 6, 7
or 14 windows) as plain stores of its lanes halving in width; a run from the row's start that
ends inside it likewise, up to its end; a run that starts inside a row is blended into it
(read, its lanes replaced, written back). So no store writes past a row:
rows narrower than a vector lie back to back in a packed tile, and a store overlapping the
next row makes that row's blend load wait for it (store-to-load forwarding fails on a partial
overlap: csa/TUNING.md). A blend reads up to a vector past its row;
the scratch has that much slack past its last row (``SCRATCH_SLACK`` bytes, see the loop nests'
``scratch_elements``).

``copy_taps`` (stride 1 or 2, no dilation) fills the rows of all S taps of a filter row at once
from one read of each input row, by constant shuffles (see ``define_tap_copy``).
"""
from llvmlite import ir

from .ir import (I1, I32, I64, PTR, KernelBuilder, declare, lane_number, masked_access,
                 prefetch_to_l2, splat, suffix)

ARGS = ("dst", "dst_step", "src", "src_step", "count", "stride", "j0", "j1", "lo", "hi")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, I64, PTR, I64] + [I64] * 6)
SAMPLED_STRIDES = 4  # strides up to this use contiguous loads + shuffles; larger ones gather
SCRATCH_SLACK = 128  # bytes past a scratch's last row a blend may read (two zmm)
PREFIX = "prefix"   # a store mask: lanes from the row's start to the run's end, none kept


class _ToEnd:
    """A store mask (``lanes``) of a run that starts inside the row and reaches its end."""

    def __init__(self, lanes):
        self.lanes = lanes


def define_row_copy(module, spec):
    """Define ``copy_rows`` for ``spec`` (a ``RowCopySpec``) in ``module`` and return it."""
    return _RowCopyBuilder(module, spec).build()


class _RowCopyBuilder(KernelBuilder):
    FUNCTION_TYPE, ARG_NAMES = FUNCTION_TYPE, ARGS

    def __init__(self, module, spec):
        super().__init__(module, spec)
        self.width = spec.width
        self.vectors = -(-self.width // self.lanes)  # the last one partly stored when width is not a multiple
        self.load = masked_access(module, self.vec)[0]

    def build(self):
        args = self.args
        bld = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.bounds = [lane_number(bld, args[n], self.vectors * self.lanes)
                       for n in ("j0", "j1", "lo", "hi")]
        done = self.fn.append_basic_block("done")
        gather_blk = self.fn.append_basic_block("gather")
        switch = bld.switch(args["stride"], gather_blk)
        for step in range(1, SAMPLED_STRIDES + 1):
            block = self.fn.append_basic_block(f"stride{step}")
            switch.add_case(ir.Constant(I64, step), block)
            bld.position_at_end(block)
            self._rows(bld, args, done, *self._sampled(bld, step))
        bld.position_at_end(gather_blk)
        self._rows(bld, args, done, *self._gathered(bld, args["stride"]))
        bld.position_at_end(done)
        bld.ret_void()
        return self.fn

    def _between(self, bld, lanes, first, end):
        """Mask of the constant ``lanes`` (lane numbers) lying in [first, end)."""
        ty = ir.VectorType(I32, len(lanes))
        lanes = ir.Constant(ty, lanes)
        return bld.and_(bld.icmp_signed(">=", lanes, splat(bld, first, ty)),
                        bld.icmp_signed("<", lanes, splat(bld, end, ty)))

    def _rows(self, bld, args, done, masks, load_vector):
        """The loop over ``count`` rows: per vector, ``load_vector(bld, src_row, v, masks)``
        then a store of lanes [j0, j1); all masks computed before the loop. When [j0, j1)
        is the whole row, as for all but a row's last run, the loop stores plainly: masked
        stores are microcoded on AMD cores (AVX2 ``vmaskmovps``; csa/TUNING.md)."""
        j0, j1 = self.bounds[:2]
        self.store_start, self.store_end = j0, j1
        vectors = range(self.vectors)
        store_masks = [self._between(bld, [v * self.lanes + i for i in range(self.lanes)], j0, j1)
                       for v in vectors]
        def row(bld, src, dst, store_masks):
            for v in vectors:
                value = load_vector(bld, src, v, masks)
                ptr = bld.gep(dst, [ir.Constant(I64, v * self.lanes)], source_etype=self.scalar)
                self._store(bld, value, ptr, store_masks and store_masks[v], v)

        self._whole_or_blended(bld, args, done, self._whole(bld, j0, j1), store_masks, row)

    def _whole(self, bld, first, end):
        """Whether lanes [first, end) cover the whole row."""
        return bld.and_(bld.icmp_signed("==", first, ir.Constant(I32, 0)),
                        bld.icmp_signed(">=", end, ir.Constant(I32, self.width)))

    def _whole_or_blended(self, bld, args, done, whole, store_masks, row):
        """Four row loops (``_row_loop``) of ``row(bld, src, dst, store_masks)``: one storing
        whole vectors (store_masks None) when ``whole``; one storing a run that starts the row
        and ends inside it exactly, without reading what is there (``PREFIX`` masks: a depthwise
        slab's phase rows of 17 in runs of 24 were all blended, a load and a select a vector);
        one blending a run that starts inside the row and reaches its end (``_ToEnd`` masks:
        the last run of a packed tile that straddles rows), every vector then stored whole;
        else one blending by ``store_masks``, each vector stored up to the run's end."""
        blocks = [self.fn.append_basic_block(name)
                  for name in ("whole", "prefix", "to_end", "part", "not_whole", "inside")]
        plain, prefix, to_end, part, not_whole, inside = blocks
        bld.cbranch(whole, plain, not_whole)
        bld.position_at_end(not_whole)
        bld.cbranch(bld.icmp_signed("==", self.store_start, ir.Constant(I32, 0)), prefix, inside)
        bld.position_at_end(inside)
        bld.cbranch(bld.icmp_signed(">=", self.store_end, ir.Constant(I32, self.width)), to_end,
                    part)
        for block, block_masks in ((plain, None), (prefix, [PREFIX] * self.vectors),
                                   (to_end, [_ToEnd(m) for m in store_masks]),
                                   (part, store_masks)):
            bld.position_at_end(block)
            self._row_loop(bld, args, done,
                           lambda bld, src, dst, m=block_masks: row(bld, src, dst, m))

    def _store(self, bld, value, ptr, mask, v):
        """Store vector ``v`` of a row, ``value``, at ``ptr``: whole (``mask`` None), else
        blended into the vector there (its lanes outside ``mask`` written back as read) up to
        the run's end (``store_end``), no further. A blend is a plain load and store, where a
        masked store is microcoded on AMD cores (``vmaskmovps``). Only lanes inside the row are
        stored (see the module docstring). Where the run may end inside the vector, a case per
        lane count picks the stores, a jump a vector and row that made a run starting inside
        the row cost 1.7-2.2x a whole one (csa/TUNING.md); a ``_ToEnd`` run has none."""
        inside = min(self.lanes, self.width - v * self.lanes)
        if mask is None:
            self._store_lanes(bld, value, ptr, inside)
            return
        to_end = isinstance(mask, _ToEnd)
        if mask is not PREFIX:   # (a prefix run keeps no lanes below it: nothing to blend)
            old = bld.load(ptr, typ=self.vec, align=self.align)
            value = bld.select(mask.lanes if to_end else mask, value, old)
        if to_end:   # (every lane of the row past the run's start: the vector's in the row)
            self._store_lanes(bld, value, ptr, inside)
            return
        # lanes [0, end - v*lanes) of the vector, at most ``inside``: a case per count (the
        # same for every row of the call); none when the run ends before the vector
        count = bld.sub(self.store_end, ir.Constant(I32, v * self.lanes))
        most = ir.Constant(I32, inside)
        count = bld.select(bld.icmp_signed(">", count, most), most, count)
        merge = self.fn.append_basic_block()
        switch = bld.switch(count, merge)
        for lanes in range(1, inside + 1):
            block = self.fn.append_basic_block()
            switch.add_case(ir.Constant(I32, lanes), block)
            bld.position_at_end(block)
            self._store_lanes(bld, value, ptr, lanes)
            bld.branch(merge)
        bld.position_at_end(merge)

    def _store_lanes(self, bld, value, ptr, count):
        """Lanes [0, count) of ``value`` at ``ptr``: one store when all, else plain stores of
        halving width."""
        if count == self.lanes:
            bld.store(value, ptr, align=self.align)
            return
        first, size = 0, self.lanes // 2
        while size:
            if count & size:
                at = bld.gep(ptr, [ir.Constant(I64, first)], source_etype=self.scalar)
                if size == 1:
                    part = bld.extract_element(value, ir.Constant(I32, first))
                else:
                    part = bld.shuffle_vector(value, value, ir.Constant(
                        ir.VectorType(I32, size), list(range(first, first + size))))
                bld.store(part, at, align=self.align)
                first += size
            size //= 2

    def _row_loop(self, bld, args, done, row):
        """for i in range(count): ``row(bld, src + i*src_step, dst + i*dst_step)``, then
        ``done``."""
        pre = bld.block
        head, body = self.fn.append_basic_block(), self.fn.append_basic_block()
        bld.branch(head)
        bld.position_at_end(head)
        i = bld.phi(I64)
        bld.cbranch(bld.icmp_signed("<", i, args["count"]), body, done)
        bld.position_at_end(body)
        row(bld, bld.gep(args["src"], [bld.mul(i, args["src_step"])], source_etype=ir.IntType(8)),
            bld.gep(args["dst"], [bld.mul(i, args["dst_step"])], source_etype=ir.IntType(8)))
        i_next = bld.add(i, ir.Constant(I64, 1))
        bld.branch(head)
        i.add_incoming(ir.Constant(I64, 0), pre)
        i.add_incoming(i_next, bld.block)

    def _sampled(self, bld, step):
        """Stride ``step``: per vector, ``step`` masked loads covering step*lanes contiguous
        values (only the sampled, in-row ones are read), merged by constant shuffles keeping
        every step-th. Each load has its own lane-sized mask: one wide load would make LLVM
        split its mask bit by bit."""
        lo, hi = self.bounds[2:]
        lanes = self.lanes
        masks = {}
        for v in range(self.vectors):
            for part in range(step):
                # value i of the part feeds output lane (part*lanes + i)/step when that
                # divides; the others get lane -1, outside every [lo, hi): never read
                owner = [v * lanes + (part * lanes + i) // step if (part * lanes + i) % step == 0
                         else -1 for i in range(lanes)]
                masks[v, part] = self._between(bld, owner, lo, hi)

        def load(bld, src, v, masks):
            result = self.zero
            for part in range(step):
                ptr = bld.gep(src, [ir.Constant(I64, (v * step + part) * lanes)],
                              source_etype=self.scalar)
                loaded = bld.call(self.load, [ptr, masks[v, part], self.zero])
                if step == 1:
                    return loaded
                # output lane j comes from this part when j*step falls in it
                pick = [lanes + j * step - part * lanes if part * lanes <= j * step < (part + 1) * lanes
                        else j for j in range(lanes)]
                result = bld.shuffle_vector(result, loaded, ir.Constant(ir.VectorType(I32, lanes), pick))
            return result

        return masks, load

    def _gathered(self, bld, stride):
        """Any stride: masked gathers (lane addresses src + lane*stride*itemsize; llvmlite has
        no vector GEP, so they are computed as integers)."""
        lanes, idx_ty = self.lanes, ir.VectorType(I64, self.lanes)
        masks, offsets = {}, {}
        for v in range(self.vectors):
            lane_ids = [v * lanes + i for i in range(lanes)]
            masks[v] = self._between(bld, lane_ids, *self.bounds[2:])
            offsets[v] = bld.mul(ir.Constant(idx_ty, [j * self.align for j in lane_ids]),
                                 splat(bld, stride, idx_ty))
        gather = declare(self.module, f"llvm.masked.gather.{suffix(self.vec)}.v{lanes}p0",
                         ir.FunctionType(self.vec, [ir.VectorType(PTR, lanes),
                                                    ir.VectorType(I1, lanes), self.vec]))

        def load(bld, src, v, masks):
            base = splat(bld, bld.ptrtoint(src, I64), idx_ty)
            ptrs = bld.inttoptr(bld.add(base, offsets[v]), ir.VectorType(PTR, lanes))
            return bld.call(gather, [ptrs, masks[v], self.zero])

        return masks, load


TAP_ARGS = ("dst", "dst_step", "tap_step", "src", "src_step", "count", "taps", "stride", "j0",
            "j1", "end", "lo", "hi")
TAP_FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64] + [I64] * 8)
MAX_TAPS = 7         # the widest filter copy_taps handles (wider ones are rare)
TAP_STRIDES = (1, 2)  # the strides it handles: stride 2 splits each row into two phases


def max_taps(spec):
    """copy_taps handles filter widths 2 .. max_taps(spec): their span must fit one more vector."""
    return min(MAX_TAPS, spec.lanes + 1)


def tap_limits(spec):
    """(widest filter, largest stride) copy_taps handles, for the packer's choice of path."""
    return max_taps(spec), max(TAP_STRIDES)


def define_tap_copy(module, spec):
    """``copy_taps`` for ``spec`` (a ``TapCopySpec``), undilated packing that reads each input value once: ``copy_taps(dst, dst_step, tap_step,
    src, src_step, count, taps, stride, j0, j1, end, lo, hi)`` fills, for ``count`` rows (row i
    read from ``src + i*src_step`` bytes), the packed rows of ``taps`` consecutive filter taps
    (tap s at ``dst + i*dst_step + s*tap_step`` bytes): lanes j0 <= j < end of tap s get
    ``src[j*stride + s]`` when j < j1 and lo <= j*stride + s < hi, else zero. Each source row
    is loaded once (the elements the run's taps read lying in [lo, hi), masked), split into
    ``stride`` phases (even and odd elements) by constant shuffles, and every tap is a constant
    shuffle of its phase; one loop per (taps, stride), 2 <= taps <= max_taps(spec), stride in
    TAP_STRIDES (others store nothing). The row's continuation, which the next tile reads, is
    prefetched to L2 (it may come from L3: csa/TUNING.md)."""
    return _TapCopyBuilder(module, spec).build()


class _TapCopyBuilder(_RowCopyBuilder):
    FUNCTION_TYPE, ARG_NAMES = TAP_FUNCTION_TYPE, TAP_ARGS

    def build(self):
        args = self.args
        lanes, vectors = self.lanes, self.vectors
        bld = ir.IRBuilder(self.fn.append_basic_block("entry"))
        # positions loaded: below max(TAP_STRIDES) * (vectors + 1) * lanes (see load_masks)
        j0, j1, end, lo, hi, taps, stride = (
            lane_number(bld, args[n], max(TAP_STRIDES) * (vectors + 1) * lanes)
            for n in ("j0", "j1", "end", "lo", "hi", "taps", "stride"))
        # loaded elements: those the run's windows read through every tap, inside the row
        span_first = bld.mul(j0, stride)
        span_end = bld.add(bld.mul(bld.sub(j1, ir.Constant(I32, 1)), stride), taps)
        first = bld.select(bld.icmp_signed(">", lo, span_first), lo, span_first)
        last = bld.select(bld.icmp_signed("<", hi, span_end), hi, span_end)
        self.load_masks = [self._between(bld, list(range(k * lanes, (k + 1) * lanes)), first, last)
                           for k in range(max(TAP_STRIDES) * (vectors + 1))]
        out_lanes = [list(range(v * lanes, (v + 1) * lanes)) for v in range(vectors)]
        self.run_masks = [self._between(bld, ids, j0, j1) for ids in out_lanes]
        self.store_masks = [self._between(bld, ids, j0, end) for ids in out_lanes]
        self.whole = self._whole(bld, j0, end)
        self.store_start, self.store_end = j0, end
        done = self.fn.append_basic_block("done")
        case = bld.add(bld.mul(args["taps"], ir.Constant(I64, 8)), args["stride"])
        switch = bld.switch(case, done)
        for count in range(2, max_taps(self.spec) + 1):
            for step in TAP_STRIDES:
                block = self.fn.append_basic_block(f"taps{count}_stride{step}")
                switch.add_case(ir.Constant(I64, count * 8 + step), block)
                bld.position_at_end(block)
                self._rows(bld, args, count, step, done)
        bld.position_at_end(done)
        bld.ret_void()
        return self.fn

    def _rows(self, bld, args, taps, stride, done):
        """The loop over rows for a constant tap count and stride: load once, split into
        phases, shuffle and store each tap; whole vectors stored plainly when the run fills
        every lane (as ``_RowCopyBuilder._rows``: masked stores are microcoded on AMD)."""
        lanes, vectors = self.lanes, self.vectors
        lane_ty = ir.VectorType(I32, lanes)

        def row(bld, src, dst, store_masks):
            loaded = [bld.call(self.load, [bld.gep(src, [ir.Constant(I64, k * lanes)],
                                                   source_etype=self.scalar),
                                           self.load_masks[k], self.zero])
                      for k in range(stride * (vectors + 1))]
            # the next tile's windows continue this row: have its lines brought to L2
            # meanwhile (a prefetch never faults, past the row's end included)
            for k in range(stride * (vectors + 1)):
                ahead = bld.gep(src, [ir.Constant(I64, k * lanes + stride * self.width)],
                                source_etype=self.scalar)
                prefetch_to_l2(self.module, bld, ahead)
            # phase q, vector k: elements stride*(k*lanes + l) + q of the row
            phases = [loaded] if stride == 1 else [
                [self._phase(bld, loaded, stride, k, q) for k in range(vectors + 1)]
                for q in range(stride)]
            for s in range(taps):
                phase, shift = phases[s % stride], s // stride
                pick = ir.Constant(lane_ty, list(range(shift, shift + lanes)))
                tap_dst = bld.gep(dst, [bld.mul(ir.Constant(I64, s), args["tap_step"])],
                                  source_etype=ir.IntType(8))
                for v in range(vectors):
                    value = bld.shuffle_vector(phase[v], phase[v + 1], pick)
                    value = bld.select(self.run_masks[v], value, self.zero)
                    ptr = bld.gep(tap_dst, [ir.Constant(I64, v * lanes)], source_etype=self.scalar)
                    self._store(bld, value, ptr, store_masks and store_masks[v], v)

        self._whole_or_blended(bld, args, done, self.whole, self.store_masks, row)

    def _phase(self, bld, loaded, stride, k, q):
        """Vector k of phase q (stride 2): lane l = element 2*(k*lanes + l) + q, one shuffle of
        the two loaded vectors that hold it."""
        lanes = self.lanes
        pick = [stride * l + q for l in range(lanes)]
        return bld.shuffle_vector(loaded[stride * k], loaded[stride * k + 1],
                                  ir.Constant(ir.VectorType(I32, lanes), pick))
