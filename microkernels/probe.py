"""What one core can do: an FMA-only probe (the hardware ceiling) and a micro-kernel alone on
L1-resident tiles (the ceiling for the convolution loop nests). Used by ``bench``."""
import ctypes
import re
import time

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .aligned import aligned_empty
from .ir import ACCUMULATE, fma, splat
from .isa import default_isa
from .jit import JitModule, native_function
from .loop_ir import LoopCode
from .once import compiled_once
from .outer_product import FUNCTION_TYPE, define_kernel

FMA_CHAINS = 12            # independent accumulators: >= FMA latency x FMA pipes, so no stalls
UKERNEL_K = 256            # packed rows per call; 8x32 float32 tiles: A 32 KiB + B 8 KiB, in L1
SHIFT = 16                 # elements (a 64-byte line in f32) the tiles move by from one call to the next


def seconds(run, calls=1):
    """The wall time of ``calls`` back-to-back calls of ``run()``."""
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return time.perf_counter() - start


def _best_seconds(run, trials=3):
    return min(seconds(run) for _ in range(trials))


def best_of_rounds(runs, rounds=3, min_seconds=0.0):
    """{name: the highest rate runs[name]() returned} over ``rates_by_round``'s rounds."""
    return {name: max(rates) for name, rates in rates_by_round(runs, rounds, min_seconds).items()}


def rates_by_round(runs, rounds=3, min_seconds=0.0):
    """{name: the rates runs[name]() returned, a round each}: each run once a round, for
    ``rounds`` rounds and until ``min_seconds`` have passed, each round starting one name
    further along (none always runs right after the same one): a disturbance (another
    process, a VM's slow phase) then slows the runs of every name alike, or some rounds
    only, where runs of one name back to back could all fall in it and leave that name alone
    measured slow."""
    names = list(runs)
    found = {name: [] for name in names}
    start, done = time.perf_counter(), 0
    while done < rounds or time.perf_counter() - start < min_seconds:
        first = done % len(names)
        for name in names[first:] + names[:first]:
            found[name].append(runs[name]())
        done += 1
    return found


def _fma_probe_module(lanes, chains):
    """``float fma_probe(i64 n, float m, float a)``: n iterations of ``chains`` independent
    vector FMAs acc = acc*m + a. m and a are arguments and the lanes are summed into the result,
    so LLVM can neither fold the loop nor drop it."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    module = ir.Module(name="fma_probe")
    module.triple = llvm.get_process_triple()
    vector_fma = fma(module, vec)
    fn = ir.Function(module, ir.FunctionType(f32, [i64, f32, f32]), "fma_probe")
    n, m, a = fn.args
    entry, loop, done = (fn.append_basic_block(name) for name in ("entry", "loop", "done"))
    bld = ir.IRBuilder(entry)
    m_vec, a_vec = (splat(bld, v, vec) for v in (m, a))
    bld.branch(loop)
    bld.position_at_end(loop)
    i = bld.phi(i64)
    accs = [bld.phi(vec) for _ in range(chains)]
    new = [bld.call(vector_fma, [acc, m_vec, a_vec]) for acc in accs]
    i_next = bld.add(i, ir.Constant(i64, 1))
    bld.cbranch(bld.icmp_unsigned("<", i_next, n), loop, done)
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(i_next, loop)
    for j, (acc, upd) in enumerate(zip(accs, new)):
        acc.add_incoming(ir.Constant(vec, [float(j)] * lanes), entry)
        acc.add_incoming(upd, loop)
    bld.position_at_end(done)
    total = new[0]
    for v in new[1:]:
        total = bld.fadd(total, v)
    result = bld.extract_element(total, ir.Constant(i64, 0))
    for lane in range(1, lanes):
        result = bld.fadd(result, bld.extract_element(total, ir.Constant(i64, lane)))
    bld.ret(result)
    return str(module)


@compiled_once
def _fma_probe(lanes, chains):
    return JitModule(_fma_probe_module(lanes, chains))


def fma_probe(iterations=1 << 27, isa=None, chains=FMA_CHAINS):
    """(a function that runs the probe once and returns its GFLOP/s, full-width vector FMA
    instructions in the compiled probe: x86 vfmadd, aarch64 fmla) at the vector width of
    ``isa`` (default: the kernel ISA). One ctypes call runs ``iterations`` of ``chains``
    FMAs, so the call overhead is negligible. With ``chains=1`` every FMA waits for the one
    before: the rate then measures the FMA latency."""
    vector_bytes = (isa or default_isa()).vector_bytes
    lanes, register = vector_bytes // 4, {64: "zmm", 32: "ymm", 16: "xmm"}[vector_bytes]
    compiled = _fma_probe(lanes, chains)
    fma_count = len(re.findall(rf"^\s*(vfmadd\w*ps\s.*%{register}|fmla\s+v\d+\.4s)",
                               compiled.asm, re.M))
    probe = compiled.function("fma_probe", ctypes.c_float, ctypes.c_int64, ctypes.c_float,
                              ctypes.c_float)
    probe(1000, 1.0, 1e-7)  # page in the code, spin the core up
    flops = 2 * chains * lanes * iterations
    return lambda: flops / seconds(lambda: probe(iterations, 1.0, 1e-7)) / 1e9, fma_count


def fma_peak(iterations=1 << 27, isa=None, chains=FMA_CHAINS):
    """(GFLOP/s, FMA instructions in the probe): the best of 3 runs of ``fma_probe``."""
    run, fma_count = fma_probe(iterations, isa, chains)
    return best_of_rounds({"probe": run})["probe"], fma_count


READ_CHAINS = 8   # independent sums: enough vector adds in flight for two loads a cycle


def _read_probe_module(lanes):
    """``float read_probe(float *p, i64 n, i64 passes)``: ``passes`` sums over the first n
    floats of p (n a multiple of READ_CHAINS vectors), READ_CHAINS vector loads a step into
    as many sums, returned added up (so the loads cannot be dropped)."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    module = ir.Module(name="read_probe")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(f32, [f32.as_pointer(), i64, i64]), "read_probe")
    p, n, passes = fn.args
    entry, outer, inner, next_pass, done = (fn.append_basic_block(name) for name in
                                            ("entry", "outer", "inner", "next_pass", "done"))
    bld = ir.IRBuilder(entry)
    zero, step = ir.Constant(vec, [0.0] * lanes), ir.Constant(i64, READ_CHAINS * lanes)
    bld.branch(outer)
    bld.position_at_end(outer)
    pass_no = bld.phi(i64)
    sums_in = [bld.phi(vec) for _ in range(READ_CHAINS)]
    bld.branch(inner)
    bld.position_at_end(inner)
    i = bld.phi(i64)
    sums = [bld.phi(vec) for _ in range(READ_CHAINS)]
    new = []
    for j, acc in enumerate(sums):
        at = bld.gep(p, [bld.add(i, ir.Constant(i64, j * lanes))])
        new.append(bld.fadd(acc, bld.load(bld.bitcast(at, vec.as_pointer()), align=4)))
    i_next = bld.add(i, step)
    bld.cbranch(bld.icmp_unsigned("<", i_next, n), inner, next_pass)
    bld.position_at_end(next_pass)
    pass_next = bld.add(pass_no, ir.Constant(i64, 1))
    bld.cbranch(bld.icmp_unsigned("<", pass_next, passes), outer, done)
    pass_no.add_incoming(ir.Constant(i64, 0), entry)
    pass_no.add_incoming(pass_next, next_pass)
    i.add_incoming(ir.Constant(i64, 0), outer)
    i.add_incoming(i_next, inner)
    for acc_in, acc, upd in zip(sums_in, sums, new):
        acc_in.add_incoming(zero, entry)
        acc_in.add_incoming(upd, next_pass)
        acc.add_incoming(acc_in, outer)
        acc.add_incoming(upd, inner)
    bld.position_at_end(done)
    total = new[0]
    for v in new[1:]:
        total = bld.fadd(total, v)
    bld.ret(bld.extract_element(total, ir.Constant(i64, 0)))
    return str(module)


@compiled_once
def _read_probe(lanes):
    return JitModule(_read_probe_module(lanes))


def read_bandwidth(size, isa=None, trial_bytes=64e6):
    """GB/s of one core reading ``size`` bytes over and over with vector loads of ``isa``'s
    width (default: the kernel ISA), best of 3 runs of about ``trial_bytes`` each: the
    bandwidth of the cache level (or memory) that holds ``size`` bytes."""
    lanes = (isa or default_isa()).vector_bytes // 4
    values = np.ones(max(READ_CHAINS * lanes, size // 4 // (READ_CHAINS * lanes)
                         * READ_CHAINS * lanes), np.float32)
    probe = _read_probe(lanes).function("read_probe", ctypes.c_float, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64)
    passes = max(1, int(trial_bytes // values.nbytes))
    probe(values.ctypes.data, values.size, 1)   # page in
    best = _best_seconds(lambda: probe(values.ctypes.data, values.size, passes))
    return passes * values.nbytes / best / 1e9


LOOP_ARGS = ("a", "b", "c", "bias", "rows", "calls", "kernel", "width", "broadcasts",
             "shift_bytes")


def _define_kernel_loop(module):
    """``kernel_loop(LOOP_ARGS)``: ``calls`` calls of the micro-kernel at address ``kernel``,
    as a loop nest makes them."""
    code = LoopCode(module, "kernel_loop", LOOP_ARGS)
    a, b, c, bias, rows, calls, kernel, width, broadcasts, shift_bytes = code.args(*LOOP_ARGS)
    with code.range(0, calls) as i:
        # A and B start SHIFT elements further each call, cycling over 4 offsets: the 4
        # overlapping tiles together stay L1-resident
        offset = (i & 3) * shift_bytes
        code.call((kernel, FUNCTION_TYPE), UKERNEL_K, a + offset, width, b + offset, broadcasts, c,
                  width, 0, width, broadcasts, bias, ACCUMULATE, rows, 0, width, 0, bias, 0, 0)
    code.ret()
    return code.function


def kernel_run(spec, calls=200_000):
    """A function that calls micro-kernel ``spec`` ``calls`` times back to back from compiled
    code on L1-resident tiles of UKERNEL_K rows, accumulating into one C tile, and returns its
    GFLOP/s. A slab kernel reads the same tiles through its row offsets (rows as packed: one
    virtual row as wide as the tile)."""
    rng = np.random.default_rng(0)
    a, b = (aligned_empty(UKERNEL_K * n + 3 * SHIFT, spec.np_dtype)
            for n in (spec.width, spec.broadcasts))
    # on cache lines, as the packed tiles a convolution reads (NumPy aligns to 16 bytes only:
    # every other vector load could cross a line, depending on where the arrays fell)
    a[:], b[:] = rng.standard_normal(a.size), rng.standard_normal(b.size)
    c = np.zeros(spec.broadcasts * spec.width, spec.np_dtype)
    bias = np.zeros(spec.broadcasts, spec.np_dtype)
    rows = np.arange(UKERNEL_K, dtype=np.int64) * (spec.broadcasts if spec.variant == "direct"
                                                   else spec.width)
    kernel = native_function(define_kernel, spec).address

    loop = native_function(_define_kernel_loop)
    loop = loop.module.function(loop.name, None, *[ctypes.c_int64] * len(LOOP_ARGS))

    def run(count):
        loop(a.ctypes.data, b.ctypes.data, c.ctypes.data, bias.ctypes.data, rows.ctypes.data,
             count, kernel, spec.width, spec.broadcasts, SHIFT * a.itemsize)

    run(10)  # warm
    flops = 2 * UKERNEL_K * spec.width * spec.broadcasts * calls
    return lambda: flops / seconds(lambda: run(calls)) / 1e9


def kernel_throughput(spec, calls=200_000, trials=3):
    """GFLOP/s of micro-kernel ``spec``: the best of ``trials`` runs of ``kernel_run``."""
    return best_of_rounds({"kernel": kernel_run(spec, calls)}, trials)["kernel"]
