"""Block transpose with the convolution epilogue, generated as LLVM IR and called from the
compiled loop nest: the last pass of the filters-in-vectors orientation, which accumulates the output
transposed (windows x filters) and must write it as NCHW (filters x windows).

``transpose_block(src, lds, dst, ldd, rows, cols, bias, flags, params)`` reads a ``rows`` x
``cols`` block (row i at ``src + i*lds`` elements; rows, cols <= lanes) and writes its transpose
(row j at ``dst + j*ldd``), adding what ``dst`` holds (flag ACCUMULATE: a residual), ``bias[j]``
(flag BIAS) and applying ``spec.activation`` with its parameters at ``params`` (flag ACTIVATE;
the same for every block of a layer, so a select).
The transpose is log2(lanes) rounds of two-source constant shuffles, each swapping one bit of
the row index with the same bit of the lane index; a block smaller than lanes x lanes is
loaded and stored masked, a whole one plainly. One row written to consecutive elements (``rows``
and ``ldd`` 1: a one-pixel output plane, where a 1x1 layer is a matrix-vector product) is its own
transpose: one vector, moved as it is.
"""
from llvmlite import ir

from .activation import load_params, store_activation
from .ir import (ACCUMULATE, ACTIVATE, BIAS, I1, I32, I64, PTR, VectorTypes, bias_splat, flags_on,
                 lane_ids, lane_number, masked_access, new_function, splat, zero_slot)

ARGS = ("src", "lds", "dst", "ldd", "rows", "cols", "bias", "flags", "params")
FUNCTION_TYPE = ir.FunctionType(ir.VoidType(), [PTR, I64, PTR, I64, I64, I64, PTR, I64, PTR])


def define_transpose(module, spec):
    """Define the block transpose for ``spec`` (a ``TransposeSpec``) in ``module`` and return
    it."""
    fn = new_function(module, spec.name, FUNCTION_TYPE, ARGS)
    lanes = spec.lanes
    src, lds, dst, ldd, rows, cols, bias, flags, params = fn.args
    bld = ir.IRBuilder(fn.append_basic_block("entry"))
    # a whole block (every block but a plane's or a band's last) moves with plain loads and
    # stores: masked stores are microcoded on AMD cores (AVX2 ``vmaskmovps``)
    full = ir.Constant(I64, lanes)
    whole = bld.and_(bld.icmp_signed("==", rows, full), bld.icmp_signed("==", cols, full))
    (accumulate_on,) = flags_on(bld, flags, ACCUMULATE)
    one = ir.Constant(I64, 1)
    row = bld.and_(bld.icmp_signed("==", rows, one), bld.icmp_signed("==", ldd, one))
    single, square = fn.append_basic_block("row"), fn.append_basic_block("square")
    bld.cbranch(row, single, square)
    bld.position_at_end(single)
    row_plain, row_part = fn.append_basic_block("row_whole"), fn.append_basic_block("row_part")
    bld.cbranch(bld.icmp_signed("==", cols, full), row_plain, row_part)
    for head, masked in ((row_plain, False), (row_part, True)):
        bld.position_at_end(head)
        _move_row(module, bld, spec, fn.args, masked)
        bld.ret_void()
    bld.position_at_end(square)
    plain, part = fn.append_basic_block("whole"), fn.append_basic_block("part")
    bld.cbranch(whole, plain, part)
    for head, masked in ((plain, False), (part, True)):
        # dst is read only when it is accumulated into
        bld.position_at_end(head)
        adding, writing = fn.append_basic_block("adding"), fn.append_basic_block("writing")
        bld.cbranch(accumulate_on, adding, writing)
        for block, accumulate in ((adding, True), (writing, False)):
            bld.position_at_end(block)
            _transpose(module, bld, spec, fn.args, masked, accumulate)
            bld.ret_void()
    return fn


def _move_row(module, bld, spec, args, masked):
    """A one-row block written to consecutive elements: ``cols`` elements of ``src`` (plus
    ``dst``'s with ACCUMULATE, the ``bias`` vector with BIAS, the activation) stored at
    ``dst`` as one vector, ``masked`` past ``cols`` or whole. (A one-pixel plane's
    transposing pass was sixteen masked moves a block, one lane each: a 60 -> 1024 1x1 on one
    pixel spent 30% of its time there, Zen 3.)"""
    types = VectorTypes(spec)
    vec, zero, align = types.vec, types.zero, types.align
    load, store = masked_access(module, vec)
    src, lds, dst, ldd, rows, cols, bias, flags, params = args
    keep = bld.icmp_signed("<", lane_ids(types.lanes), splat(
        bld, lane_number(bld, cols, types.lanes), ir.VectorType(I32, types.lanes)))

    def read(ptr):
        return bld.call(load, [ptr, keep, zero]) if masked else bld.load(ptr, typ=vec,
                                                                         align=align)

    def plus(value, on, ptr):   # value + the vector at ptr when on (ptr read only then)
        before = bld.block
        adding, added = bld.append_basic_block("add"), bld.append_basic_block("added")
        bld.cbranch(on, adding, added)
        bld.position_at_end(adding)
        summed = bld.fadd(value, read(ptr))
        bld.branch(added)
        bld.position_at_end(added)
        result = bld.phi(vec)
        result.add_incoming(summed, adding)
        result.add_incoming(value, before)
        return result

    accumulate_on, bias_on, activate_on = flags_on(bld, flags, ACCUMULATE, BIAS, ACTIVATE)
    value = plus(plus(read(src), accumulate_on, dst), bias_on, bias)
    value = store_activation(bld, activate_on, spec.activation, value,
                             load_params(bld, spec.activation, params, types))
    if masked:
        bld.call(store, [value, dst, keep])
    else:
        bld.store(value, dst, align=align)


def _transpose(module, bld, spec, args, masked, accumulate):
    """The block's loads, shuffles, epilogue and stores; ``masked``: to ``rows`` x ``cols``,
    else the whole lanes x lanes block; ``accumulate``: added to what ``dst`` holds."""
    types = VectorTypes(spec)
    lanes, scalar, vec, zero, align = types.lanes, types.scalar, types.vec, types.zero, types.align
    mask_ty = ir.VectorType(I1, lanes)
    load, store = masked_access(module, vec)
    src, lds, dst, ldd, rows, cols, bias, flags, params = args
    ids = lane_ids(lanes)
    row_mask, col_mask = (bld.icmp_signed("<", ids, splat(bld, lane_number(bld, n, lanes), ids.type))
                          for n in (rows, cols))
    # rows past ``rows`` are read as zeros (their loads fully masked); never stored
    data = []
    for i in range(lanes):
        ptr = bld.gep(src, [bld.mul(ir.Constant(I64, i), lds)], source_etype=scalar)
        if not masked:
            data.append(bld.load(ptr, typ=vec, align=align))
            continue
        keep = bld.and_(col_mask, splat(bld, bld.icmp_signed("<", ir.Constant(I64, i), rows), mask_ty))
        data.append(bld.call(load, [ptr, keep, zero]))
    h = 1
    while h < lanes:
        for i in range(lanes):
            if i & h:
                continue
            j = i | h
            low = [k if not k & h else lanes + k - h for k in range(lanes)]
            high = [k + h if not k & h else lanes + k for k in range(lanes)]
            mask = ir.VectorType(I32, lanes)
            data[i], data[j] = (bld.shuffle_vector(data[i], data[j], ir.Constant(mask, low)),
                                bld.shuffle_vector(data[i], data[j], ir.Constant(mask, high)))
        h *= 2
    bias_on, activate_on = flags_on(bld, flags, BIAS, ACTIVATE)
    values = load_params(bld, spec.activation, params, types)
    slot = zero_slot(bld, scalar)
    for j in range(lanes):
        # column j exists only when j < cols: its bias is read and its row stored only then
        exists = bld.icmp_signed("<", ir.Constant(I64, j), cols)
        ptr = bld.gep(dst, [bld.mul(ir.Constant(I64, j), ldd)], source_etype=scalar)
        stored = bld.and_(row_mask, splat(bld, exists, mask_ty)) if masked else None
        value = data[j]
        if accumulate:
            value = bld.fadd(value, bld.call(load, [ptr, stored, zero]) if masked
                             else bld.load(ptr, typ=vec, align=align))
        value = bld.fadd(value, bias_splat(bld, bld.and_(bias_on, exists), bld.gep(
            bias, [ir.Constant(I64, j)], source_etype=scalar), slot, types))
        value = store_activation(bld, activate_on, spec.activation, value, values)
        if masked:
            bld.call(store, [value, ptr, stored])
        else:
            bld.store(value, ptr, align=align)
