"""A plan bound to its compiled loop nest, and the C entry the thread pool runs parts through."""
import numpy as np
from numba import carray, types

from csa import DepthwisePlan
from microkernels.cache import cached_cfunc, cached_njit
from microkernels.numba_bridge import address_as_pointer
from microkernels.once import compiled_once
from microkernels.pool import compiled_pool

from . import depthwise
from . import lowering as slicing
from .lowering import ALL_PHASES, loop_nest_signature
from .threads import run_parts

# a part's arguments, one int64 word each: what ``part_args`` writes and ``part_function`` reads
PART_ARGS = ("x", "n", "c", "h", "w", "weights", "weights_size", "bias", "bias_size",
             "out", "out_n", "out_k", "out_p", "out_q", "geom", "geom_size", "part",
             "scratch", "scratch_size", "out_t", "out_t_size")
X_ARG, W_ARG, BIAS_ARG, OUT_ARG, GEOM_ARG, PART_ARG, SCRATCH_ARG, OUT_T_ARG = (
    PART_ARGS.index(name)
    for name in ("x", "weights", "bias", "out", "geom", "part", "scratch", "out_t"))


@compiled_once
def part_function(run, dtype):
    """Loop nest ``run`` (for ``dtype`` arrays) as a C function ``void run_part(int64 *args)``,
    ``args`` laid out as ``PART_ARGS``: what the thread pool's compiled workers call, without
    the GIL."""
    def run_part(a):
        x = carray(address_as_pointer(a[X_ARG]),
                   (a[X_ARG + 1], a[X_ARG + 2], a[X_ARG + 3], a[X_ARG + 4]), dtype)
        out = carray(address_as_pointer(a[OUT_ARG]),
                     (a[OUT_ARG + 1], a[OUT_ARG + 2], a[OUT_ARG + 3], a[OUT_ARG + 4]), dtype)
        run(x, carray(address_as_pointer(a[W_ARG]), (a[W_ARG + 1],), dtype),
            carray(address_as_pointer(a[BIAS_ARG]), (a[BIAS_ARG + 1],), dtype), out,
            carray(address_as_pointer(a[GEOM_ARG]), (a[GEOM_ARG + 1],), np.int64),
            carray(address_as_pointer(a[PART_ARG]), (4,), np.int64),
            carray(address_as_pointer(a[SCRATCH_ARG]), (a[SCRATCH_ARG + 1],), dtype),
            carray(address_as_pointer(a[OUT_T_ARG]), (a[OUT_T_ARG + 1],), dtype))

    return cached_cfunc(run_part, types.void(types.CPointer(types.int64)),
                        f"part_function {run.cache_key} {dtype}")


@compiled_once
def part_args_builder(dtype):
    """``part_args(x, weights, bias, out, geom, parts, scratch, out_t)``: the ``PART_ARGS`` of
    each row of ``parts``, with that row of ``scratch`` and ``out_t`` (compiled: reading
    addresses from Python costs about 1 us each)."""
    x, weights, bias, out, geom, _, row, _ = loop_nest_signature(dtype).args
    rows = types.Array(row.dtype, 2, "C")
    table = types.Array(types.int64, 2, "C", readonly=True)

    def part_args(x, weights, bias, out, geom, parts, scratch, out_t):
        args = np.empty((parts.shape[0], len(PART_ARGS)), np.int64)
        for i in range(parts.shape[0]):
            a = args[i]
            a[X_ARG], a[W_ARG], a[BIAS_ARG] = x.ctypes.data, weights.ctypes.data, bias.ctypes.data
            a[OUT_ARG], a[GEOM_ARG] = out.ctypes.data, geom.ctypes.data
            a[X_ARG + 1], a[X_ARG + 2], a[X_ARG + 3], a[X_ARG + 4] = x.shape
            a[OUT_ARG + 1], a[OUT_ARG + 2], a[OUT_ARG + 3], a[OUT_ARG + 4] = out.shape
            a[W_ARG + 1], a[BIAS_ARG + 1], a[GEOM_ARG + 1] = weights.size, bias.size, geom.size
            a[PART_ARG] = parts.ctypes.data + i * parts.strides[0]
            a[SCRATCH_ARG] = scratch.ctypes.data + i * scratch.strides[0]
            a[OUT_T_ARG] = out_t.ctypes.data + i * out_t.strides[0]
            a[SCRATCH_ARG + 1], a[OUT_T_ARG + 1] = scratch.shape[1], out_t.shape[1]
        return args

    return cached_njit(part_args,
                       types.Array(types.int64, 2, "C")(x, weights, bias, out, geom, table, rows,
                                                        rows),
                       f"part_args {dtype}")


def workspace(elements, dtype):
    """Every scratch and transposed-output buffer a call uses (a module attribute, so that the
    guard-page tests can place them against inaccessible pages)."""
    return np.empty(elements, dtype)


class Prepared:
    """A plan bound to its micro-kernel, compiled loop nest, ``geom`` vector and output parts:
    what a call on one input shape needs besides the data. ``epilogue_flags`` (BIAS | RELU)
    apply once, on the last channel tile (or in the transposing pass)."""

    def __init__(self, plan, epilogue_flags, isa):
        self.plan = plan
        lowering = depthwise if isinstance(plan, DepthwisePlan) else slicing
        self.kernel = lowering.kernel_spec(plan, isa)
        self.loop_nest = lowering.loop_nest(plan)
        self.geom = lowering.geometry(plan, self.kernel, epilogue_flags)
        self.phases_at = lowering.GEOM_FIELDS.index("phases")
        self.parts = lowering.output_parts(plan)
        self.scratch_elements = lowering.scratch_elements(plan)
        self.out_t_elements = lowering.out_t_elements(plan)

    def warm(self, threads):
        """Compile (or load) what a call with up to ``threads`` threads runs besides the loop
        nest: the C entry and the pool when the plan has parts to share."""
        if len(self.parts) > 1 and threads > 1:
            dtype = self.plan.spec.dtype
            part_function(self.loop_nest, np.dtype(dtype))
            part_args_builder(np.dtype(dtype))
            compiled_pool()

    def run(self, x, packed_w, bias, out, phases=ALL_PHASES, threads=1):
        """``x`` 4-D C-contiguous (N >= 1), ``packed_w`` from ``packing.pack_filters`` with the
        plan's filter tile, ``bias`` 1-D (length K, or empty for none), ``out`` 4-D
        C-contiguous of the output shape. The plan's output parts run on up to ``threads``
        threads, each with its own scratch: concurrent calls share nothing. Fewer ``phases``
        than all (PACK | KERNEL | POST) leave ``out`` undefined: they exist to time the phases
        apart."""
        geom = self.geom
        if phases != ALL_PHASES:
            geom = geom.copy()
            geom[self.phases_at] = phases
        weights = packed_w.reshape(-1)
        if len(self.parts) == 1:
            self.loop_nest(x, weights, bias, out, geom, self.parts[0],
                           workspace(self.scratch_elements, x.dtype),
                           workspace(self.out_t_elements, x.dtype))
            return
        # args hold bare addresses: every array they point into stays referenced here
        scratch = _rows(len(self.parts), self.scratch_elements, x.dtype)
        out_t = _rows(len(self.parts), self.out_t_elements, x.dtype)
        args = part_args_builder(x.dtype)(x, weights, bias, out, geom, self.parts, scratch, out_t)
        run_parts(part_function(self.loop_nest, x.dtype).address, args, threads)


def _rows(count, elements, dtype):
    """``count`` rows of at least ``elements`` each, starting a cache line apart: one per part."""
    per_line = 64 // np.dtype(dtype).itemsize
    row = -(-elements // per_line) * per_line
    return workspace(count * row, dtype).reshape(count, row)
