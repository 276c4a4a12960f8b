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
loaded and stored masked, a whole one plainly, asking first for the lines of the next block
along each row it stores (a hint, never a fault). One row written to consecutive elements
(``rows`` and ``ldd`` 1: a one-pixel output plane, where a 1x1 layer is a matrix-vector
product) is its own transpose: one vector, moved as it is.
"""
from llvmlite import ir

from .activation import load_params, store_activation
from .ir import (ACCUMULATE, ACTIVATE, BIAS, I32, I64, PTR, VectorTypes, bias_splat, flags_on,
                 lane_ids, lane_number, masked_access, new_function, prefetch_for_write, splat,
                 zero_slot)

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
    plain, partial = fn.append_basic_block("whole"), fn.append_basic_block("partial")
    part, empty = fn.append_basic_block("part"), fn.append_basic_block("empty")
    bias_on, activate_on = flags_on(bld, flags, BIAS, ACTIVATE)
    epilogue_on = bld.or_(bias_on, activate_on)
    bld.cbranch(whole, plain, partial)
    # an empty block reads nothing (a partial one reads its first row whatever ``rows`` says)
    bld.position_at_end(partial)
    zero = ir.Constant(I64, 0)
    bld.cbranch(bld.or_(bld.icmp_signed("<=", rows, zero), bld.icmp_signed("<=", cols, zero)),
                empty, part)
    bld.position_at_end(empty)
    bld.ret_void()
    for head, masked in ((plain, False), (part, True)):
        # dst is read only when it is accumulated into; a block with no epilogue (a slab's
        # NCHW planes, a reorder's) moves bare: the zero bias's adds took shuffle ports
        bld.position_at_end(head)
        adding, rest = fn.append_basic_block("adding"), fn.append_basic_block("not_adding")
        writing, bare = fn.append_basic_block("writing"), fn.append_basic_block("bare")
        bld.cbranch(accumulate_on, adding, rest)
        bld.position_at_end(rest)
        bld.cbranch(epilogue_on, writing, bare)
        for block, accumulate, epilogue in ((adding, True, True), (writing, False, True),
                                            (bare, False, False)):
            bld.position_at_end(block)
            _transpose(module, bld, spec, fn.args, masked, accumulate, epilogue)
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


def _transpose(module, bld, spec, args, masked, accumulate, epilogue):
    """The block's loads, shuffles, epilogue and stores; ``masked``: to ``rows`` x ``cols``,
    else the whole lanes x lanes block; ``accumulate``: added to what ``dst`` holds;
    ``epilogue``: the bias and activation as ``flags`` say, else none. Returns with ``bld``
    after the stores."""
    types = VectorTypes(spec)
    lanes, scalar, vec, zero, align = types.lanes, types.scalar, types.vec, types.zero, types.align
    load, store = masked_access(module, vec)
    src, lds, dst, ldd, rows, cols, bias, flags, params = args
    ids = lane_ids(lanes)
    row_mask, col_mask = (bld.icmp_signed("<", ids, splat(bld, lane_number(bld, n, lanes), ids.type))
                          for n in (rows, cols))
    # a partial block's rows past ``rows`` read its last row again (valid memory: one mask for
    # every load, where a mask a row cost more than the shuffles); their lanes are never stored
    last_row = bld.sub(rows, ir.Constant(I64, 1))   # (rows >= 1 here)
    data = []
    for i in range(lanes):
        row = ir.Constant(I64, i)
        if masked and i:
            row = bld.select(bld.icmp_signed("<", row, rows), row, last_row)
        ptr = bld.gep(src, [bld.mul(row, lds)], source_etype=scalar)
        data.append(bld.call(load, [ptr, col_mask, zero]) if masked
                    else bld.load(ptr, typ=vec, align=align))
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
    if epilogue:
        bias_on, activate_on = flags_on(bld, flags, BIAS, ACTIVATE)
        values = load_params(bld, spec.activation, params, types)
        slot = zero_slot(bld, scalar)

    def store_column(j):
        ptr = bld.gep(dst, [bld.mul(ir.Constant(I64, j), ldd)], source_etype=scalar)
        value = data[j]
        if accumulate:
            value = bld.fadd(value, bld.call(load, [ptr, row_mask, zero]) if masked
                             else bld.load(ptr, typ=vec, align=align))
        if epilogue:
            value = bld.fadd(value, bias_splat(bld, bias_on, bld.gep(
                bias, [ir.Constant(I64, j)], source_etype=scalar), slot, types))
            value = store_activation(bld, activate_on, spec.activation, value, values)
        if masked:
            bld.call(store, [value, ptr, row_mask])
        else:
            bld.store(value, ptr, align=align)

    if not masked:
        # each row's next block along asked for first: callers walk along the rows (the
        # band pass's k blocks inside its p blocks, back to each row a block later), and its
        # lines are cold where the output was evicted since the last call
        for j in range(lanes):
            prefetch_for_write(module, bld, bld.gep(
                dst, [bld.add(bld.mul(ir.Constant(I64, j), ldd), ir.Constant(I64, lanes))],
                source_etype=scalar))
            store_column(j)
        return
    # columns cols-1 down to 0, entered at the last: column j (and its bias) only when it
    # exists, with no mask a column
    fn = bld.function
    columns = [fn.append_basic_block(f"column{j}") for j in range(lanes)]
    done = fn.append_basic_block("stored")
    switch = bld.switch(cols, done)
    for j, block in enumerate(columns):
        switch.add_case(ir.Constant(I64, j + 1), block)
    for j in reversed(range(lanes)):
        bld.position_at_end(columns[j])
        store_column(j)
        bld.branch(columns[j - 1] if j else done)
    bld.position_at_end(done)
