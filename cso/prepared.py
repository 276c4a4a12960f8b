"""A plan bound to its compiled loop nest, and the C entry every call runs parts through."""
import ctypes

import numpy as np

from csa import DepthwisePlan
from microkernels.numba_bridge import c_entry
from microkernels.once import compiled_once

from . import depthwise
from . import lowering as slicing
from .lowering import ALL_PHASES
from .threads import run_parts

# a call's arguments, one int64 word each, shared by its parts: what ``Prepared.run`` writes
# and the C entry reads (``*_row``: elements from one part's workspace row to the next)
CALL_ARGS = ("x", "n", "c", "h", "w", "weights", "weights_size", "bias", "bias_size",
             "out", "out_n", "out_k", "out_p", "out_q", "geom", "geom_size", "parts",
             "scratch", "scratch_row", "out_t", "out_t_row", "rows", "rows_row")
X_ARG, W_ARG, BIAS_ARG, OUT_ARG, GEOM_ARG, PARTS_ARG, SCRATCH_ARG, OUT_T_ARG, ROWS_ARG = (
    CALL_ARGS.index(name)
    for name in ("x", "weights", "bias", "out", "geom", "parts", "scratch", "out_t", "rows"))
PART_WORDS = 4   # a ``parts`` row: first window tile, end, first filter tile, end


@compiled_once
def part_entry(loop_nest, dtype):
    """``loop_nest`` (``slicing.conv_loop_nest`` or ``depthwise.depthwise_loop_nest``) for
    ``dtype`` arrays as a C function ``void run_part(int64 *args, int64 part)``, ``args`` laid
    out as ``CALL_ARGS``: part ``part`` of a call, on its rows of the workspaces. Every call
    runs through it (one part on the calling thread, several on the pool's workers too), never
    holding the GIL; compiled once, then loaded from the persistent cache by llvmlite alone."""
    def build():
        from numba import carray, cfunc, njit, types

        from microkernels.numba_bridge import address_as_pointer as pointer

        run, item = loop_nest(), dtype.itemsize

        @njit(inline="always")
        def rows_of(a, at, part, kind, size):   # the part's row of a workspace
            return carray(pointer(a[at] + part * a[at + 1] * size), (a[at + 1],), kind)

        def run_part(a, part):
            x = carray(pointer(a[X_ARG]), (a[X_ARG + 1], a[X_ARG + 2], a[X_ARG + 3],
                                           a[X_ARG + 4]), dtype)
            out = carray(pointer(a[OUT_ARG]), (a[OUT_ARG + 1], a[OUT_ARG + 2], a[OUT_ARG + 3],
                                               a[OUT_ARG + 4]), dtype)
            run(x, carray(pointer(a[W_ARG]), (a[W_ARG + 1],), dtype),
                carray(pointer(a[BIAS_ARG]), (a[BIAS_ARG + 1],), dtype), out,
                carray(pointer(a[GEOM_ARG]), (a[GEOM_ARG + 1],), np.int64),
                carray(pointer(a[PARTS_ARG] + part * PART_WORDS * 8), (PART_WORDS,), np.int64),
                rows_of(a, SCRATCH_ARG, part, dtype, item), rows_of(a, OUT_T_ARG, part, dtype, item),
                rows_of(a, ROWS_ARG, part, np.int64, 8))

        return cfunc(types.void(types.CPointer(types.int64), types.int64))(run_part)

    return c_entry(f"{loop_nest.__module__}.{loop_nest.__name__} {dtype}", build)


def _data_address(array):
    """The address of ``array``'s data, read from the array object itself (PyArrayObject: the
    object header, then ``char *data``, NumPy's C ABI): 0.2 us, against 1.4 us for
    ``array.ctypes.data``, and a call reads nine."""
    return ctypes.c_size_t.from_address(id(array) + object.__basicsize__).value


_probe = np.empty(3)
if _data_address(_probe) != _probe.ctypes.data:   # not CPython's object layout: the slow way
    def _data_address(array):   # noqa: F811
        return array.ctypes.data
del _probe


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
        self.entry = part_entry(lowering.loop_nest(plan), np.dtype(plan.spec.dtype))
        self.geom = lowering.geometry(plan, self.kernel, epilogue_flags)
        self.phases_at = lowering.GEOM_FIELDS.index("phases")
        self.parts = lowering.output_parts(plan)
        self.scratch_elements = lowering.scratch_elements(plan)
        self.out_t_elements = lowering.out_t_elements(plan)
        self.rows_elements = lowering.rows_elements(plan)

    def warm(self, threads):
        """Compile (or load) what a call with up to ``threads`` threads runs besides the loop
        nest: the pool when the plan has parts to share."""
        if len(self.parts) > 1 and threads > 1:
            from microkernels.pool import compiled_pool
            compiled_pool()

    def run(self, x, packed_w, bias, out, phases=ALL_PHASES, threads=1):
        """``x`` 4-D C-contiguous (N >= 1), ``packed_w`` from ``packing.pack_filters`` with the
        plan's filter tile, ``bias`` 1-D (length K, or empty for none), ``out`` 4-D
        C-contiguous of the output shape. The plan's output parts run on up to ``threads``
        threads, each with its own rows of the workspaces: concurrent calls share nothing.
        Fewer ``phases`` than all (PACK | KERNEL | POST) leave ``out`` undefined: they exist to
        time the phases apart."""
        geom = self.geom
        if phases != ALL_PHASES:
            geom = geom.copy()
            geom[self.phases_at] = phases
        parts = len(self.parts)
        scratch = _rows(parts, self.scratch_elements, x.dtype)
        out_t = _rows(parts, self.out_t_elements, x.dtype)
        rows = _rows(parts, self.rows_elements, np.int64)
        # bare addresses: every array they point into stays referenced here until the end
        args = np.array((_data_address(x), *x.shape, _data_address(packed_w), packed_w.size,
                         _data_address(bias), bias.size, _data_address(out), *out.shape,
                         _data_address(geom), geom.size, _data_address(self.parts),
                         _data_address(scratch), scratch.shape[1], _data_address(out_t),
                         out_t.shape[1], _data_address(rows), rows.shape[1]), np.int64)
        if parts == 1:
            self.entry.call(_data_address(args), 0)
        else:
            run_parts(self.entry.address, args, parts, threads)


def _rows(count, elements, dtype):
    """``count`` rows of at least ``elements`` each, starting a cache line apart (exactly
    ``elements`` for one row): one per part."""
    per_line = 64 // np.dtype(dtype).itemsize
    row = elements if count == 1 else -(-elements // per_line) * per_line
    return workspace(count * row, dtype).reshape(count, row)
