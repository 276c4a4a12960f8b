"""Vector row copy for input packing, generated as LLVM IR and inlined into numba code
(``packing`` drives it; the vector code lives here with the other generators).

``copy_row(dst, src, stride, j0, j1, lo, hi)`` writes lanes j0 <= j < j1 of one packed tile row
(``nwin`` values at ``dst``): lane j gets ``src[j * stride]`` when lo <= j < hi, else zero. The
source is read with masked vector loads (strides 1-4: stride*nwin contiguous values, every
stride-th kept by a constant shuffle) or masked gathers (larger strides), so lanes outside
[lo, hi) -- taps in the zero padding, windows past the end of the plane -- are never read, and
``src`` may point outside the input for them. A whole row of windows moves per vector
instruction; no scalar loop runs per element.
"""
from llvmlite import ir

from .ir_gen import I32, I64, PTR, declare, splat

I1 = ir.IntType(1)
ARGS = ("dst", "src", "stride", "j0", "j1", "lo", "hi")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64, I64, I64])
SCALARS = {"f32": ir.FloatType(), "f64": ir.DoubleType()}
SAMPLED_STRIDES = 4  # strides up to this use contiguous loads + a shuffle; larger ones gather


def define_row_copy(module, spec):
    """The copy function for tiles of kernel ``spec`` (its dtype, ``nwin`` and vector lanes),
    defined in ``module`` on first use."""
    dtype, lanes, nwin = spec.dtype, spec.lanes, spec.nwin
    name = f"{dtype}_pack_row_{nwin}__{spec.isa}"
    try:
        return module.get_global(name)
    except KeyError:
        pass
    fn = ir.Function(module, FUNCTION_TYPE, name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("alwaysinline")
    for arg, arg_name in zip(fn.args, ARGS):
        arg.name = arg_name
    _RowCopyBuilder(module, fn, dtype, lanes, nwin).build()
    return fn


class _RowCopyBuilder:
    def __init__(self, module, fn, dtype, lanes, nwin):
        self.module, self.fn, self.dtype, self.lanes, self.nwin = module, fn, dtype, lanes, nwin
        self.scalar = SCALARS[dtype]
        self.vec = ir.VectorType(self.scalar, lanes)
        self.idx_ty = ir.VectorType(I64, lanes)
        self.zero = ir.Constant(self.vec, [0.0] * lanes)

    def _masked(self, op, count):
        """llvm.masked.load/.store on <count x scalar> vectors."""
        vec, mask = ir.VectorType(self.scalar, count), ir.VectorType(I1, count)
        name = f"llvm.masked.{op}.v{count}{self.dtype}.p0"
        fnty = (ir.FunctionType(vec, [PTR, mask, vec]) if op == "load" else
                ir.FunctionType(ir.VoidType(), [vec, PTR, mask]))
        return declare(self.module, name, fnty)

    def build(self):
        dst, src, stride, j0, j1, lo, hi = self.fn.args
        entry = self.fn.append_basic_block("entry")
        bld = ir.IRBuilder(entry)
        self.bounds = [splat(bld, v, self.idx_ty) for v in (j0, j1, lo, hi)]
        gather_blk = self.fn.append_basic_block("gather")
        switch = bld.switch(stride, gather_blk)
        for step in range(1, SAMPLED_STRIDES + 1):
            block = self.fn.append_basic_block(f"stride{step}")
            switch.add_case(ir.Constant(I64, step), block)
            bld.position_at_end(block)
            self._copy(bld, lambda bld, v, mask: self._sampled_load(bld, v, mask, step))
        bld.position_at_end(gather_blk)
        self._copy(bld, lambda bld, v, mask: self._gather(bld, v, mask, stride))

    def _copy(self, bld, load_vector):
        """For each vector of the row: load lanes [lo, hi) (zeros elsewhere) with
        ``load_vector``, store lanes [j0, j1)."""
        j0, j1, lo, hi = self.bounds
        dst = self.fn.args[0]
        for v in range(self.nwin // self.lanes):
            lane = ir.Constant(self.idx_ty, [v * self.lanes + i for i in range(self.lanes)])
            load_mask = bld.and_(bld.icmp_signed(">=", lane, lo), bld.icmp_signed("<", lane, hi))
            store_mask = bld.and_(bld.icmp_signed(">=", lane, j0), bld.icmp_signed("<", lane, j1))
            value = load_vector(bld, v, load_mask)
            ptr = bld.gep(dst, [ir.Constant(I64, v * self.lanes)], source_etype=self.scalar)
            bld.call(self._masked("store", self.lanes), [value, ptr, store_mask])
        bld.ret_void()

    def _sampled_load(self, bld, v, lane_mask, step):
        """Stride ``step``: one masked load of step*lanes contiguous values (only the sampled,
        in-row ones are read) and a constant shuffle keeping every step-th."""
        width = step * self.lanes
        sampled = [i % step == 0 for i in range(width)]
        owner = [i // step for i in range(width)]          # the lane each source value feeds
        wide_mask = bld.shuffle_vector(lane_mask, ir.Constant(lane_mask.type, ir.Undefined),
                                       ir.Constant(ir.VectorType(I32, width), owner))
        wide_mask = bld.and_(wide_mask, ir.Constant(ir.VectorType(I1, width), sampled))
        ptr = bld.gep(self.fn.args[1], [ir.Constant(I64, v * width)], source_etype=self.scalar)
        wide = bld.call(self._masked("load", width),
                        [ptr, wide_mask, ir.Constant(ir.VectorType(self.scalar, width), [0.0] * width)])
        if step == 1:
            return wide
        return bld.shuffle_vector(wide, ir.Constant(wide.type, ir.Undefined),
                                  ir.Constant(ir.VectorType(I32, self.lanes),
                                              [i * step for i in range(self.lanes)]))

    def _gather(self, bld, v, lane_mask, stride):
        """Any stride: a masked gather (lane addresses src + lane*stride*itemsize; llvmlite
        has no vector GEP, so they are computed as integers)."""
        itemsize = {"f32": 4, "f64": 8}[self.dtype]
        lane = ir.Constant(self.idx_ty, [v * self.lanes + i for i in range(self.lanes)])
        base = splat(bld, bld.ptrtoint(self.fn.args[1], I64), self.idx_ty)
        offsets = bld.mul(bld.mul(lane, splat(bld, stride, self.idx_ty)),
                          ir.Constant(self.idx_ty, [itemsize] * self.lanes))
        ptrs = bld.inttoptr(bld.add(base, offsets), ir.VectorType(PTR, self.lanes))
        mask_ty = ir.VectorType(I1, self.lanes)
        gather = declare(self.module, f"llvm.masked.gather.v{self.lanes}{self.dtype}.v{self.lanes}p0",
                          ir.FunctionType(self.vec, [ptrs.type, mask_ty, self.vec]))
        return bld.call(gather, [ptrs, lane_mask, self.zero])
