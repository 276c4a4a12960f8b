"""Lowering of depthwise plans: the compiled loop nest around the depthwise micro-kernel.

Work is cut into units, (image, channel, output band) triples in that order; a part is a run of
units. Per unit the loop nest fills the channel's slab (its zero-padded stride phase planes,
the band's rows: ``packing.inputs.define_fill_slab``), then calls the depthwise kernel once per
filter of the channel (the channel multiplier), each writing one output plane band. When whole
planes fit (one band), a fill holds up to ``nc`` channels, moved together row by row. As in
the slicing loop nest, the kernel and the row copies are called through their addresses in
``geom``: one loop nest per dtype.

On channel-blocked values (``define_blocked_depthwise_loop_nest``) a unit is (image, block of
the lanes' channels, band), the band's rows read in place or from a slab of the block, and the
kernel (``microkernels.depthwise_blocked``) computes a row's tiles of windows, a channel a lane.
"""
import numpy as np

from microkernels import (BlockedDepthwiseSpec, DepthwiseSpec, TransposeSpec, depthwise,
                          depthwise_blocked, row_copy, transpose)
from microkernels.spec import STORE_ACTIVATION
from microkernels.jit import native_function
from microkernels.loop_ir import LoopCode
from microkernels.dtypes import DTYPES, dtype_name
from packing import row_copier
from packing.inputs import define_fill_slab

from .entry import EntryCode, Geom
from .loop_nests import (ALL_PHASES, BLOCKS, CHANNELS_LAST, KERNEL, PACK, PLANES,
                         define_blocked_offsets, define_fill_slab_of, define_slab_offsets,
                         pixel_copies, row_column)

GEOM = Geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q", "P", "M", "nc", "band", "Hb", "Ws",
            "planes", "epilogue", "phases", "fill_width", "kernel", "copy_rows", "shuffle",
            "params")
# vectors per row run the slab filler moves at once: a slab row's width, up to this many (a
# call per run and channel costs more than its few vectors on small planes; csa/TUNING.md)
MAX_FILL_VECTORS = 4


# a blocked plan's: its windows per row tile, the kernel of one fewer, whether it reads in place,
# how its input and its output are held (LAYOUT_CODES), the block transpose, where in the
# scratch output rows' blocks go (elements: after the slab) and how many rows go there at once
BLOCKED_GEOM = Geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl", "Q", "P", "band", "Hb", "Hs",
                    "Ws", "lanes", "windows", "row_tiles", "unpacked", "epilogue", "phases",
                    "kernel", "tail_kernel", "params", "in_layout", "out_layout", "transpose",
                    "row_at", "store_rows")
# output pixels a blocked plan moves into NCHW planes or channels-last pixels at once: rows
# narrower than this many blocks go out several at a time (a 7-wide row alone is a partial
# block transpose, at the cost of a whole one)
STORE_BLOCKS = 8

# how a blocked depthwise loop nest's input and output are held (geom in_layout, out_layout)
LAYOUT_CODES = {"blocked": BLOCKS, "nchw": PLANES, "nhwc": CHANNELS_LAST}


def geometry(plan, kspec, epilogue_flags, params, channel_shuffle=1, in_block=None,
             out_block=None):
    """The ``geom`` vector for ``plan`` around depthwise kernel ``kspec``, compiling the
    functions it calls on first use; ``params``: the address of the activation's parameters;
    ``channel_shuffle`` groups: see ``Conv2d``. A blocked plan reads and writes values held
    as ``in_block`` and ``out_block`` say: blocks of the lanes, of one channel (NCHW), or of
    all the channels (channels last: the convolution's C and K)."""
    if plan.blocked:
        return _blocked_geometry(plan, kspec, epilogue_flags, params,
                                 held_as(plan, in_block, plan.spec.c),
                                 held_as(plan, out_block, plan.spec.k))
    s = plan.spec
    ws = plan.slab_shape[1]
    fill_width = kspec.lanes * min(MAX_FILL_VECTORS, -(-ws // kspec.lanes))
    return GEOM.pack(
        R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
        pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, M=s.k_per_group, nc=plan.nc,
        band=plan.band, Hb=plan.band_rows, Ws=ws, planes=plan.slab_planes,
        epilogue=epilogue_flags, phases=ALL_PHASES, fill_width=fill_width,
        kernel=native_function(depthwise.define_depthwise, kspec).address,
        copy_rows=row_copier(kspec, fill_width), shuffle=channel_shuffle, params=params)


def held_as(plan, block, channels):
    """The ``LAYOUT_CODES`` layout of values of ``channels`` held in blocks of ``block``."""
    for layout, size in (("blocked", plan.lanes), ("nchw", 1), ("nhwc", channels)):
        if block == size:
            return LAYOUT_CODES[layout]
    raise ValueError(f"a blocked depthwise plan reads and writes blocks of {plan.lanes}, "
                     f"NCHW or channels last ({channels} channels), not blocks of {block}")


def _blocked_geometry(plan, kspec, epilogue_flags, params, in_layout, out_layout):
    s = plan.spec
    hs, ws = plan.slab_shape
    hb = plan.band_rows
    unpacked = plan.reads_input_unpacked and in_layout == BLOCKS   # others: a slab of blocks
    if unpacked:   # the taps' offsets on the input's blocks
        hb, ws = s.h, s.w
    tail = (native_function(depthwise_blocked.define_blocked_depthwise,
                            BlockedDepthwiseSpec(kspec.dtype, kspec.windows - 1, kspec.isa,
                                                 kspec.activation)).address
            if s.q % plan.row_tiles else 0)
    transposes = PLANES in (in_layout, out_layout)
    return BLOCKED_GEOM.pack(
        R=s.r, S=s.s, sh=s.stride[0], sw=s.stride[1], dh=s.dilation[0], dw=s.dilation[1],
        pt=s.padding[0], pl=s.padding[2], Q=s.q, P=s.p, band=plan.band, Hb=hb, Hs=hs, Ws=ws,
        lanes=plan.lanes, windows=plan.block_vectors, row_tiles=plan.row_tiles,
        unpacked=unpacked, epilogue=epilogue_flags, phases=ALL_PHASES,
        kernel=native_function(depthwise_blocked.define_blocked_depthwise, kspec).address,
        tail_kernel=tail, params=params, in_layout=in_layout, out_layout=out_layout,
        transpose=native_function(transpose.define_transpose,
                                  TransposeSpec(kspec.dtype, kspec.isa)).address
        if transposes else 0, row_at=_blocked_slab_elements(plan), store_rows=store_rows(plan))


def _blocked_slab_elements(plan):
    """A blocked plan's band slab (its room also where the input is read in place)."""
    return plan.band_rows * plan.slab_shape[1] * plan.lanes


def store_rows(plan):
    """Output rows a blocked plan moves out of its blocks at once (NCHW or channels-last
    output): as many as STORE_BLOCKS blocks of pixels hold, at least one, at most a band."""
    return max(1, min(plan.band, plan.spec.p, STORE_BLOCKS * plan.lanes // plan.spec.q))


def geom_fields(plan):
    """The ``Geom`` of ``plan``'s loop nest's ``geom`` vector: a blocked plan's has fields of
    its own, in another order."""
    return BLOCKED_GEOM if plan.blocked else GEOM


def kernel_spec(plan, isa, activation=STORE_ACTIVATION):
    family = BlockedDepthwiseSpec if plan.blocked else DepthwiseSpec
    return family(dtype_name(plan.spec.dtype), plan.block_vectors, isa, activation)


def loop_nest(plan):
    """The generator of ``plan``'s loop nest (see ``define_depthwise_loop_nest`` and
    ``define_blocked_depthwise_loop_nest``)."""
    return define_blocked_depthwise_loop_nest if plan.blocked else define_depthwise_loop_nest


def rows_elements(plan):
    """The int64 tap offsets the kernel reads."""
    return plan.spec.r * plan.spec.s


def out_t_elements(plan, out_block=None):
    return 0


def scratch_elements(plan):
    """The slabs of one fill and a tail: the kernel's last vector reads up to a vector past
    the last channel's slab, and its aligned loads (``microkernels.depthwise``) one more; then
    the slack the filler's blended stores may rewrite (``row_copy.SCRATCH_SLACK``)."""
    if plan.blocked:   # a band's slab, then output rows' blocks (NCHW, channels last)
        return (_blocked_slab_elements(plan) + store_rows(plan) * plan.spec.q * plan.lanes
                + row_copy.SCRATCH_SLACK // plan.spec.itemsize)
    return (plan.nc * plan.channel_elements + 2 * plan.lanes
            + row_copy.SCRATCH_SLACK // plan.spec.itemsize)


def output_parts(plan):
    """The plan's parts (``parts`` near-equal runs of units) as the loop nest's ``part``
    vectors (first unit, end unit, 0, 0)."""
    units, a = plan.units, plan.parts
    return np.array([(units * i // a, units * (i + 1) // a, 0, 0) for i in range(a)], np.int64)


def define_depthwise_loop_nest(module, dtype):
    """The loop nest as the C entry ``depthwise_loop_nest_{dtype}(args, part)``
    (``cso.entry``; ``out_t`` unused, ``rows`` holds the R*S tap offsets) around the depthwise
    kernel ``geom`` names (``geometry``), computing the units part[0] .. part[1]-1;
    ``weights`` holds each output channel's R*S weights in a row (``packing.pack_filters``
    with one filter per tile)."""
    code = EntryCode(module, f"depthwise_loop_nest_{dtype}", GEOM)
    item = DTYPES[dtype].itemsize
    R, S, sh, sw, dh, dw, pt, pl, Q, P = code.geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl",
                                                   "Q", "P")
    M, nc_max, band, Hb, Ws, planes = code.geom("M", "nc", "band", "Hb", "Ws", "planes")
    epilogue, phases = code.geom("epilogue", "phases")
    params = code.geom("params")
    fill_width, ukernel, copy_rows, shuffle = code.geom("fill_width", "kernel", "copy_rows",
                                                        "shuffle")
    x_addr, C, H, W, w_addr, bias_addr, out_addr, K = (
        code.call_arg(a) for a in ("x", "c", "h", "w", "weights", "bias", "out", "out_k"))
    scratch_addr, offsets = code.workspace("scratch", item), code.workspace("rows", 8)
    first, end = code.part_field(0), code.part_field(1)
    taps = R * S
    code.call(define_slab_offsets(module), offsets, 1, R, S, sh, sw, dh, dw, Hb, Ws)
    channel = sh * sw * Hb * Ws
    # the tail the last vectors read past the slabs
    code.zero(scratch_addr + nc_max * channel * item,
              (code.call_arg("scratch_row") - nc_max * channel) * item)
    # the phase planes no tap reads, which no fill writes (a 1x1's at stride 2): a channel's
    # last vectors read into the next one, and what the workspace held there (subnormals,
    # say) would slow them
    with code.if_(planes != -1):
        with code.range(0, sh * sw) as phase:
            with code.if_((planes >> phase) & 1 == 0):
                with code.range(0, nc_max) as i:
                    code.zero(scratch_addr + (i * channel + phase * Hb * Ws) * item,
                              Hb * Ws * item)
    bands = (P + band - 1) // band
    # channel c reads input plane c, or with a shuffle of g groups of C/g channels (g > 1)
    # plane (c % g) * C/g + c // g: a fill then stays in a run of g channels, C/g planes apart
    per_group = C // shuffle
    u = code.var(first)
    with code.while_(lambda: u < end):
        n, c, b = u // (C * bands), u // bands % C, u % bands
        # channels of this fill: with whole planes, up to nc of this image in the part
        run_left = code.choose(shuffle == 1, C - c, shuffle - c % shuffle)
        count = code.choose(bands == 1, code.min(nc_max, end - u, run_left), 1)
        plane = code.choose(shuffle == 1, c, c % shuffle * per_group + c // shuffle)
        plane_step = code.choose(shuffle == 1, 1, per_group)
        oh0 = b * band
        rows = code.min(band, P - oh0)
        with code.if_(phases & PACK):
            code.call(define_fill_slab(module, dtype), x_addr + (n * C + plane) * H * W * item,
                      plane_step * H * W * item, H, W, count, sh, sw, Hb, Ws, oh0, Hb, pt, pl,
                      planes, scratch_addr, fill_width, copy_rows)   # (zero rows past the input)
        with code.if_(phases & KERNEL):
            positions = (rows - 1) * Ws + Q
            with code.range(0, count) as i:
                with code.range(0, M) as j:
                    k = (c + i) * M + j
                    code.call((ukernel, depthwise.FUNCTION_TYPE), taps,
                              scratch_addr + i * channel * item, offsets,
                              w_addr + k * taps * item,
                              out_addr + ((n * K + k) * P + oh0) * Q * item, positions, Ws, Q,
                              bias_addr + k * item, epilogue, params)
        u.set(u + count)
    code.ret()
    return code.function


def define_blocked_depthwise_loop_nest(module, dtype):
    """A blocked plan's loop nest as the C entry ``blocked_depthwise_loop_nest_{dtype}(args,
    part)``: units (image, block, band) part[0] .. part[1]-1 (image, band, block for channels
    last), per unit the block's band read in place or filled into a slab with its zero padding
    (``define_fill_slab_of``), then per output row its
    tiles of windows (``row_tiles``, evened out, a ``tail_kernel`` for the shorter ones), into
    the output's blocks or rows of blocks then moved into NCHW planes or channels-last pixels,
    ``store_rows`` rows at a time (``define_store_rows``); ``weights`` holds a block's R*S
    weight vectors in turn, ``bias`` the padded channels'. ``in_layout`` and ``out_layout``
    (``LAYOUT_CODES``) say how the values are held."""
    code = EntryCode(module, f"blocked_depthwise_loop_nest_{dtype}", BLOCKED_GEOM)
    item = DTYPES[dtype].itemsize
    R, S, sh, sw, dh, dw, pt, pl, Q, P = code.geom("R", "S", "sh", "sw", "dh", "dw", "pt", "pl",
                                                   "Q", "P")
    band, Hb, Hs, Ws, L, windows, row_tiles, unpacked = code.geom(
        "band", "Hb", "Hs", "Ws", "lanes", "windows", "row_tiles", "unpacked")
    epilogue, phases, params = code.geom("epilogue", "phases", "params")
    kernel, tail = code.geom("kernel", "tail_kernel")
    in_layout, out_layout, block_transpose, row_at, rows_out = code.geom(
        "in_layout", "out_layout", "transpose", "row_at", "store_rows")
    x_addr, C, H, W, w_addr, bias_addr, out_addr, K = (
        code.call_arg(a) for a in ("x", "c", "h", "w", "weights", "bias", "out", "out_k"))
    scratch, offsets = code.workspace("scratch", item), code.workspace("rows", 8)
    row_blocks = scratch + row_at * item   # output rows' blocks, moved out after
    first, end = code.part_field(0), code.part_field(1)
    code.call(define_blocked_offsets(module), offsets, 1, R, S, dh, dw, Hb, Ws, L)
    blocks, bands = (C + L - 1) // L, (P + band - 1) // band
    # channels last: a band's blocks in turn (their pixels share the band's lines), else a
    # block's bands
    pixels_first = (in_layout == CHANNELS_LAST) | (out_layout == CHANNELS_LAST)
    with code.range(first, end) as u:
        n = u // (blocks * bands)
        cb = code.choose(pixels_first, u % blocks, u // bands % blocks)
        oh0 = code.choose(pixels_first, u // blocks % bands, u % bands) * band
        held = code.min(L, C - cb * L)   # the block's channels (the rest: padding lanes)
        row0 = code.choose(unpacked != 0, 0, oh0 * sh)
        # the block's first value: its block, NCHW plane or channels-last pixel
        block = x_addr + code.choose(
            in_layout == CHANNELS_LAST, n * C * H * W + cb * L, (n * C + cb * L) * H * W) * item
        base = code.choose(unpacked != 0, block, scratch)
        with code.if_((unpacked == 0) & ((phases & PACK) != 0)):
            code.call(define_fill_slab_of(module), in_layout, block, C, held, H, W, L, item,
                      Hb, Ws, row0, code.min(Hb, Hs - row0), pt, pl, scratch, block_transpose)
        with code.if_((phases & KERNEL) != 0):
            out_held = code.min(L, K - cb * L)
            oh_end = code.min(P, oh0 + band)
            kept = code.var(0)   # rows before this one in row_blocks
            with code.range(oh0, oh_end) as oh:
                row_out = code.choose(out_layout != BLOCKS, row_blocks + kept * Q * L * item,
                                      out_addr + ((n * K + cb * L) * P * Q + oh * Q * L) * item)
                with code.range(0, row_tiles) as j:
                    ow0 = row_column(j, row_tiles, Q)
                    count = row_column(j + 1, row_tiles, Q) - ow0
                    code.call((code.choose(count < windows, tail, kernel),
                               depthwise_blocked.FUNCTION_TYPE), R * S,
                              base + ((oh * sh - row0) * Ws + ow0 * sw) * L * item, offsets,
                              sw * L, w_addr + cb * R * S * L * item, row_out + ow0 * L * item,
                              bias_addr + cb * L * item, epilogue, params)
                store = (kept + 1 == rows_out) | (oh + 1 == oh_end)
                with code.if_((out_layout != BLOCKS) & store):
                    code.call(define_store_rows(module), out_layout, row_blocks, out_addr,
                              n, cb, (oh - kept) * Q, (kept + 1) * Q, P * Q, K, out_held, L,
                              item, block_transpose)
                kept.set(code.choose(store, 0, kept + 1))
    code.ret()
    return code.function


def define_store_rows(module):
    """``store_rows(layout, rows, out, n, cb, p0, count, PQ, K, held, L, item, transpose)`` in
    ``module`` (defined once): output pixels p0 .. p0+count-1 (whole rows, consecutive in
    the output as in ``rows``) of block ``cb`` of image ``n``, of L lanes at ``rows``, into
    the output at ``out`` (PQ pixels a plane): its ``held`` channels' NCHW planes (PLANES, by
    block transposes of L pixels, across rows) or channels-last pixels (CHANNELS_LAST)."""
    if "store_rows" in module.globals:
        return module.globals["store_rows"]
    code = LoopCode(module, "store_rows", ("layout", "rows", "out", "n", "cb", "p0", "count",
                                           "PQ", "K", "held", "L", "item", "transpose"),
                    internal=True)
    layout, rows, out, n, cb, p0, count, PQ, K, held, L, item, block_transpose = code.args(
        *code.arg_names)
    pixel = L * item
    with code.if_(layout == PLANES):
        planes = out + ((n * K + cb * L) * PQ + p0) * item
        with code.range(0, count, L) as q0:
            code.call((block_transpose, transpose.FUNCTION_TYPE), rows + q0 * pixel, L,
                      planes + q0 * item, PQ, code.min(L, count - q0), held, 0, 0, 0)
    with code.if_(layout == CHANNELS_LAST):
        pixel_copies(code, out + ((n * PQ + p0) * K + cb * L) * item, K * item, rows, pixel,
                     count, held * item, pixel)
    code.ret()
    return code.function
