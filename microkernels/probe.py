"""What one core can do: an FMA-only probe (the hardware ceiling) and a micro-kernel alone on
L1-resident tiles (the ceiling for the convolution loop nests). Used by ``bench``."""
import ctypes
import re
import time

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit

from .ir_gen import ACCUMULATE, FUNCTION_TYPE, define_kernel, splat
from .isa import default_isa
from .jit import JitModule, native_function
from .numba_bridge import caller
from .once import compiled_once

FMA_CHAINS = 12            # independent accumulators: >= FMA latency x FMA pipes, so no stalls
UKERNEL_K = 256            # packed rows per call; 8x32 float32 tiles: A 32 KiB + B 8 KiB, in L1
SHIFT = 16                 # elements (a 64-byte line in f32) the tiles move by from one call to the next


def _best_seconds(run, trials=3):
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _fma_probe_module(lanes):
    """``float fma_probe(i64 n, float m, float a)``: n iterations of FMA_CHAINS independent
    vector FMAs acc = acc*m + a. m and a are arguments and the lanes are summed into the result,
    so LLVM can neither fold the loop nor drop it."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    module = ir.Module(name="fma_probe")
    module.triple = llvm.get_process_triple()
    fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(f32, [i64, f32, f32]), "fma_probe")
    n, m, a = fn.args
    entry, loop, done = (fn.append_basic_block(name) for name in ("entry", "loop", "done"))
    bld = ir.IRBuilder(entry)
    m_vec, a_vec = (splat(bld, v, vec) for v in (m, a))
    bld.branch(loop)
    bld.position_at_end(loop)
    i = bld.phi(i64)
    accs = [bld.phi(vec) for _ in range(FMA_CHAINS)]
    new = [bld.call(fma, [acc, m_vec, a_vec]) for acc in accs]
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
def _fma_probe(lanes):
    return JitModule(_fma_probe_module(lanes))


def fma_peak(iterations=1 << 27):
    """(GFLOP/s, full-width vector FMA instructions in the compiled probe: x86 vfmadd, aarch64
    fmla) at the kernel ISA's vector width. One ctypes call runs ~10^8 iterations, so the call
    overhead is negligible."""
    vector_bytes = default_isa().vector_bytes
    lanes, register = vector_bytes // 4, {64: "zmm", 32: "ymm", 16: "xmm"}[vector_bytes]
    compiled = _fma_probe(lanes)
    fma_count = len(re.findall(rf"^\s*(vfmadd\w*ps\s.*%{register}|fmla\s+v\d+\.4s)",
                               compiled.asm, re.M))
    probe = compiled.function("fma_probe", ctypes.c_float, ctypes.c_int64, ctypes.c_float,
                              ctypes.c_float)
    probe(1000, 1.0, 1e-7)  # page in the code, spin the core up
    seconds = _best_seconds(lambda: probe(iterations, 1.0, 1e-7))
    return 2 * FMA_CHAINS * lanes * iterations / seconds / 1e9, fma_count


call_kernel = caller(FUNCTION_TYPE)


@njit(nogil=True)
def _kernel_loop(a, b, c, bias, rows, calls, kernel, nwin, nf):
    """``calls`` calls of the micro-kernel at address ``kernel``, as a loop nest makes them."""
    for i in range(calls):
        # A and B start SHIFT floats further each call, cycling over 4 offsets: the 4
        # overlapping tiles together stay L1-resident
        offset = (i & 3) * SHIFT * a.itemsize
        call_kernel(kernel, UKERNEL_K, a.ctypes.data + offset, nwin, b.ctypes.data + offset, nf,
                    c.ctypes.data, nwin, nwin, nf, bias.ctypes.data, ACCUMULATE,
                    rows.ctypes.data, 0, nwin, 0)


def kernel_throughput(spec, calls=200_000):
    """GFLOP/s of micro-kernel ``spec`` called back to back from compiled code on L1-resident
    tiles of UKERNEL_K rows, accumulating into one C tile. A slab kernel reads the same tiles
    through its row offsets (rows as packed: one virtual row as wide as the tile)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(UKERNEL_K * spec.nwin + 3 * SHIFT).astype(spec.np_dtype)
    b = rng.standard_normal(UKERNEL_K * spec.nf + 3 * SHIFT).astype(spec.np_dtype)
    c = np.zeros(spec.nf * spec.nwin, spec.np_dtype)
    bias = np.zeros(spec.nf, spec.np_dtype)
    rows = np.arange(UKERNEL_K, dtype=np.int64) * (spec.nf if spec.slab == "broadcast" else
                                                   spec.nwin)
    kernel = native_function(define_kernel, spec).address

    def run(count):
        _kernel_loop(a, b, c, bias, rows, count, kernel, spec.nwin, spec.nf)

    run(10)  # compile
    seconds = _best_seconds(lambda: run(calls))
    return 2 * UKERNEL_K * spec.nwin * spec.nf * calls / seconds / 1e9
