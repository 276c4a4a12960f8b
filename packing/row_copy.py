"""Vector row copy for input packing, generated as LLVM IR and inlined into numba code.

``copy_row(dst, src, stride, j0, j1, lo, hi)`` writes lanes j0 <= j < j1 of one packed tile row
(``nwin`` values at ``dst``): lane j gets ``src[j * stride]`` when lo <= j < hi, else zero. The
source is read with masked vector loads (stride 1) or masked gathers (other strides), so lanes
outside [lo, hi) -- taps in the zero padding, windows past the end of the plane -- are never
read, and ``src`` may point outside the input for them. A whole row of windows moves per vector
instruction; no scalar loop runs per element.
"""
from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
ARGS = ("dst", "src", "stride", "j0", "j1", "lo", "hi")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64, I64, I64])
SCALARS = {"f32": ir.FloatType(), "f64": ir.DoubleType()}


def _declare(module, name, fnty):
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, fnty, name)


def _splat(bld, value, vec):
    one = bld.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(I32, 0))
    return bld.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                              ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count))


def define_row_copy(module, dtype, lanes, nwin):
    """The copy function for ``nwin``-wide rows of ``dtype`` ('f32'/'f64') in ``lanes``-wide
    vectors, defined in ``module`` on first use."""
    name = f"{dtype}_pack_row_{nwin}__v{lanes}"
    try:
        return module.get_global(name)
    except KeyError:
        pass
    scalar = SCALARS[dtype]
    vec, mask_ty = ir.VectorType(scalar, lanes), ir.VectorType(I1, lanes)
    idx_ty, ptrs_ty = ir.VectorType(I64, lanes), ir.VectorType(PTR, lanes)
    suffix = f"v{lanes}{dtype}"
    load = _declare(module, f"llvm.masked.load.{suffix}.p0", ir.FunctionType(vec, [PTR, mask_ty, vec]))
    gather = _declare(module, f"llvm.masked.gather.{suffix}.v{lanes}p0",
                      ir.FunctionType(vec, [ptrs_ty, mask_ty, vec]))
    store = _declare(module, f"llvm.masked.store.{suffix}.p0",
                     ir.FunctionType(ir.VoidType(), [vec, PTR, mask_ty]))
    fn = ir.Function(module, FUNCTION_TYPE, name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("alwaysinline")
    for arg, arg_name in zip(fn.args, ARGS):
        arg.name = arg_name
    dst, src, stride, j0, j1, lo, hi = fn.args
    entry, unit, strided = (fn.append_basic_block(n) for n in ("entry", "unit", "strided"))
    bld = ir.IRBuilder(entry)
    zero = ir.Constant(vec, [0.0] * lanes)
    bounds = [_splat(bld, v, idx_ty) for v in (j0, j1, lo, hi)]
    stride_vec = _splat(bld, stride, idx_ty)
    src_vec = _splat(bld, bld.ptrtoint(src, I64), idx_ty)
    itemsize = {"f32": 4, "f64": 8}[dtype]
    bld.cbranch(bld.icmp_unsigned("==", stride, ir.Constant(I64, 1)), unit, strided)
    for block, unit_stride in ((unit, True), (strided, False)):
        bld.position_at_end(block)
        for v in range(nwin // lanes):
            lane = ir.Constant(idx_ty, [v * lanes + i for i in range(lanes)])
            inside = [bld.icmp_signed(">=", lane, bounds[0]), bld.icmp_signed("<", lane, bounds[1]),
                      bld.icmp_signed(">=", lane, bounds[2]), bld.icmp_signed("<", lane, bounds[3])]
            store_mask, load_mask = bld.and_(inside[0], inside[1]), bld.and_(inside[2], inside[3])
            if unit_stride:
                value = bld.call(load, [bld.gep(src, [ir.Constant(I64, v * lanes)], source_etype=scalar),
                                        load_mask, zero])
            else:
                # lane addresses src + lane*stride*itemsize (llvmlite has no vector GEP)
                offsets = bld.mul(bld.mul(lane, stride_vec), ir.Constant(idx_ty, [itemsize] * lanes))
                ptrs = bld.inttoptr(bld.add(src_vec, offsets), ptrs_ty)
                value = bld.call(gather, [ptrs, load_mask, zero])
            bld.call(store, [value, bld.gep(dst, [ir.Constant(I64, v * lanes)], source_etype=scalar),
                             store_mask])
        bld.ret_void()
    return fn


@lru_cache(maxsize=None)
def row_copy_intrinsic(dtype, lanes, nwin):
    """numba intrinsic ``copy_row(dst_addr, src_addr, stride, j0, j1, lo, hi)`` (addresses as
    ints, e.g. ``arr.ctypes.data`` plus a byte offset)."""

    @intrinsic
    def copy_row(typingctx, dst, src, stride, j0, j1, lo, hi):
        if not all(isinstance(t, types.Integer) for t in (dst, src, stride, j0, j1, lo, hi)):
            return None

        def codegen(context, builder, signature, args):
            fn = define_row_copy(builder.module, dtype, lanes, nwin)
            builder.call(fn, [builder.inttoptr(args[0], PTR), builder.inttoptr(args[1], PTR),
                              *args[2:]])
            return context.get_dummy_value()

        return types.void(*([types.intp] * 7)), codegen

    return copy_row
