"""A plan bound to its compiled loop nest, and the C entry every call runs parts through."""
import array
import ctypes
import threading
from dataclasses import replace

import numpy as np

from csa import DepthwisePlan
from microkernels.aligned import DATA_OFFSET, part_stride
from microkernels.jit import native_function
from microkernels.once import compiled_once
from microkernels.dtypes import dtype_name

from . import depthwise
from . import lowering as slicing
from .entry import CALL_ARGS, define_call_on_arrays
from .loop_nests import ALL_PHASES
from . import jobs
from .jobs import active_recording, data_address, run_parts
from .pool import compiled_pool
from .threads import pool_address, spin_ns

X_ARG, W_ARG, BIAS_ARG, OUT_ARG, GEOM_ARG, PARTS_ARG, SCRATCH_ARG, OUT_T_ARG, ROWS_ARG = (
    CALL_ARGS.index(name)
    for name in ("x", "weights", "bias", "out", "geom", "parts", "scratch", "out_t", "rows"))


@compiled_once
def call_on_arrays():
    """``call(args)`` (``entry.define_call_on_arrays``) through ctypes, which releases the GIL
    for the call; None where arrays are not laid out as CPython's (``DATA_OFFSET``)."""
    if DATA_OFFSET is None:
        return None
    native = native_function(define_call_on_arrays, DATA_OFFSET)
    return native.module.function(native.name, None, ctypes.c_void_p)


@compiled_once
def part_entry(define_loop_nest, dtype):
    """The C entry ``void run_part(int64 *args, int64 part)`` (``cso.entry``) that
    ``define_loop_nest`` (a ``loop_nests`` generator or
    ``depthwise.define_depthwise_loop_nest``) generates for ``dtype``, compiled once (or
    loaded from the persistent cache): its ``.address``. Every call runs through it
    (``jobs.run_parts``): one part on the calling thread, several on the pool's workers too."""
    return native_function(define_loop_nest, dtype_name(dtype))


class Prepared:
    """A plan bound to its micro-kernel, compiled loop nest, ``geom`` vector and output parts:
    what a call on one input shape needs besides the data. ``epilogue_flags`` (BIAS |
    ACTIVATE) apply once, on the last channel tile (or in the transposing pass), ACTIVATE
    applying ``activation`` (a ``cso.Activation``; ReLU when None); a depthwise plan may read
    its input channels through a ``channel_shuffle`` (see ``Conv2d``); a blocked plan reads
    blocks of ``blocks[0]`` channels and writes blocks of ``blocks[1]`` (``cso.layouts``; 1:
    NCHW planes); ``merged``: its filters are groups merged onto blocks
    (``packing.merge_groups``), which its kernel masks (``KernelSpec.merged``)."""

    def __init__(self, plan, epilogue_flags, isa, channel_shuffle=1, activation=None,
                 blocks=None, merged=False):
        self.plan = plan
        self.image_output_shape = plan.spec.output_shape[1:]   # (K, P, Q)
        lowering = depthwise if isinstance(plan, DepthwisePlan) else slicing
        dtype = np.dtype(plan.spec.dtype)
        self.kernel = (lowering.kernel_spec(plan, isa) if activation is None
                       else lowering.kernel_spec(plan, isa, activation.kind))
        if merged:
            self.kernel = replace(self.kernel, merged=True)
        self.params = np.empty(0, dtype) if activation is None else activation.vector(dtype)
        self.entry = part_entry(lowering.loop_nest(plan), dtype)
        extra = {"channel_shuffle": channel_shuffle} if channel_shuffle > 1 else {}
        if blocks:
            extra = dict(zip(("in_block", "out_block"), blocks))
        self.geom = lowering.geometry(plan, self.kernel, epilogue_flags,
                                      data_address(self.params), **extra)
        self.phases_at = lowering.geom_fields(plan).index("phases")
        self.parts = lowering.output_parts(plan)
        self.part_count = len(self.parts)
        self._template = None   # see _arguments
        self._own = None        # see _own_arguments
        self.scratch_elements = lowering.scratch_elements(plan)
        self.out_t_elements = lowering.out_t_elements(plan, blocks[1] if blocks else None)
        self.rows_elements = lowering.rows_elements(plan)
        # each workspace's row per part (CALL_ARGS index -> elements) and those a call
        # allocates, not empty: (index, elements in all, dtype); an empty one's address is a
        # fixed empty array's
        dtype, count = np.dtype(plan.spec.dtype), len(self.parts)
        sizes = ((SCRATCH_ARG, self.scratch_elements, dtype),
                 (OUT_T_ARG, self.out_t_elements, dtype),
                 (ROWS_ARG, self.rows_elements, np.dtype(np.int64)))
        self.row_lengths = {at: _row_length(count, elements, t.itemsize)
                            for at, elements, t in sizes}
        self.workspaces = [(at, count * self.row_lengths[at], t)
                           for at, elements, t in sizes if elements]
        self.workspace_bytes = max((e * t.itemsize for _, e, t in self.workspaces), default=0)
        self.array_call = call_on_arrays() if count == 1 else None   # (see run)

    def warm(self, threads):
        """Compile (or load) what a call with up to ``threads`` threads runs besides the loop
        nest: the pool when the plan has parts to share."""
        if len(self.parts) > 1 and threads > 1:
            compiled_pool()

    def run(self, x, packed_w, bias, out, phases=ALL_PHASES, threads=1):
        """``x`` 4-D C-contiguous (N >= 1), ``packed_w`` from ``packing.pack_filters`` with the
        plan's filter tile, ``bias`` 1-D (length K, or empty for none), ``out`` 4-D
        C-contiguous of the output shape; for a blocked plan ``x`` and ``out`` are 5-D, N x
        blocks x H x W x block (``x`` may be 4-D NCHW: blocks of one channel), and ``bias``
        covers the output's blocks. The plan's output parts run on up to ``threads``
        threads, each with its own rows of the workspaces: concurrent calls share nothing.
        Fewer ``phases`` than all (PACK | KERNEL | POST) leave ``out`` undefined: they exist to
        time the phases apart."""
        recording = active_recording()   # (whose jobs, run one at a time, share workspaces)
        if (recording is None and phases == ALL_PHASES
                and self.workspace_bytes <= jobs.REUSED_WORKSPACE_BYTES):
            # this thread's vector, written in place: no copy, no workspace to find
            own = self._own_arguments(x, packed_w, bias, out)   # (held until the call ends)
            args, address = own[5], own[6]
            if self.array_call is not None:   # (x's and out's addresses read in there)
                args[X_ARG], args[OUT_ARG] = id(x), id(out)
                self.array_call(address)
            else:
                args[X_ARG], args[OUT_ARG] = data_address(x), data_address(out)
                run_parts(self.entry.address, address, self.part_count, threads)
            return
        args = self._arguments(x, packed_w, bias, out)
        if phases != ALL_PHASES:
            geom = self.geom.copy()
            geom[self.phases_at] = phases
            args[GEOM_ARG] = data_address(geom)
        held = []   # the workspaces, referenced here until the call returns
        for at, elements, dtype in self.workspaces:
            if recording is None:
                space, args[at] = jobs.workspace(at, elements, dtype)
            else:
                space = recording.workspace(at, elements, dtype)
                args[at] = data_address(space)
            held.append(space)
        # (a recorded job keeps what its arguments point to but ``x`` and ``out``)
        run_parts(self.entry.address, args.buffer_info()[0], self.part_count, threads,
                  keep=(args, held, self, packed_w, bias))

    def runner(self, packed_w, bias, threads, planned=None):
        """``run(x, out)``: ``self.run(x, packed_w, bias, out, ALL_PHASES, threads)`` for
        C-contiguous arrays of the shapes of the first call's (a plain call's, whose checks
        were made), each thread's argument vector kept for it, found in one lookup: a small
        layer's call is mostly Python, ``_own_arguments``' checks a good part of it.
        ``planned(x, out)``: the arrays as the plan reads them, where the calls pass others
        over the same data (a channels-last or blocked pixel: its NCHW array), made only for
        a thread's first call (its vector) and where the call is checked (``self.run``)."""
        planned = planned or (lambda x, out: (x, out))

        def checked(x, out):
            x, out = planned(x, out)
            return self.run(x, packed_w, bias, out, ALL_PHASES, threads)
        if self.workspace_bytes > jobs.REUSED_WORKSPACE_BYTES or (
                self.part_count == 1 and self.array_call is None):
            return checked
        array_call, kept = self.array_call, threading.local()
        # several parts: the pool's entry called here, not through ``run_parts`` (a
        # microsecond of Python less)
        parts, entry = self.part_count, self.entry.address
        helpers, run_pool = max(0, min(parts, threads) - 1), compiled_pool().run

        def run(x, out):
            if active_recording() is not None:
                return checked(x, out)
            try:
                spaces, args, address = kept.vector
            except AttributeError:   # (this thread's first call)
                spaces = None
            if spaces is not jobs.kept_workspaces():   # (its first, or a workspace grew)
                plan_x, plan_out = planned(x, out)
                kept.held = self._own_arguments(plan_x, packed_w, bias, plan_out)
                spaces, args, address = kept.vector = kept.held[0], kept.held[5], kept.held[6]
            if parts == 1:
                args[X_ARG], args[OUT_ARG] = id(x), id(out)
                array_call(address)
            else:
                args[X_ARG], args[OUT_ARG] = data_address(x), data_address(out)
                run_pool(pool_address(helpers), entry, address, parts, helpers, spin_ns())
        return run

    def _own_arguments(self, x, packed_w, bias, out):
        """This thread's ``CALL_ARGS`` vector for these arrays, as (owner, weights, bias,
        shapes, the vector, its address, its workspaces): the workspaces the thread's kept
        ones (``jobs.workspace``), the entry's address in ``ENTRY_WORD``. The same vector call
        after call on one thread, for the caller to write ``x`` and ``out`` into (a recorded
        job keeps its own: it takes ``_arguments``); made again when another thread, other
        weights or other shapes used it last. Held with its workspaces: a thread that ends
        leaves none of its addresses dangling."""
        found = self._own
        if (found is None or found[0] is not jobs.kept_workspaces() or found[1] is not packed_w
                or found[2] is not bias or found[3] != x.shape or found[4] != out.shape):
            found = self._own = self._new_own_arguments(x, packed_w, bias, out)
        return found

    def _new_own_arguments(self, x, packed_w, bias, out):
        """A new ``_own_arguments`` tuple, for this thread."""
        args = self._arguments(x, packed_w, bias, out)
        args.append(self.entry.address)   # (ENTRY_WORD)
        held = []
        for at, elements, dtype in self.workspaces:
            space, args[at] = jobs.workspace(at, elements, dtype)
            held.append(space)
        return (jobs.kept_workspaces(), packed_w, bias, x.shape, out.shape, args,
                args.buffer_info()[0], held)

    def _arguments(self, x, packed_w, bias, out):
        """A new ``CALL_ARGS`` vector for these arrays, but the workspaces' addresses: a copy
        of the one made for the last call's weights and bias, when they are the same arrays
        (kept referenced here, so that their addresses stay theirs) and the shapes the same."""
        found = self._template
        if (found is None or found[0] is not packed_w or found[1] is not bias
                or found[2] != x.shape or found[3] != out.shape):
            rows, none = self.row_lengths, {t: data_address(a) for t, a in _NONE.items()}
            values = dict(x=0, n=x.shape[0], c=_channels(x), h=x.shape[2], w=x.shape[3],
                          weights=data_address(packed_w), bias=data_address(bias), out=0,
                          out_k=_channels(out), geom=data_address(self.geom),
                          parts=data_address(self.parts), scratch=none[x.dtype],
                          scratch_row=rows[SCRATCH_ARG], out_t=none[x.dtype],
                          out_t_row=rows[OUT_T_ARG], rows=none[np.dtype(np.int64)],
                          rows_row=rows[ROWS_ARG])
            found = self._template = (packed_w, bias, x.shape, out.shape,
                                      array.array("q", (values[a] for a in CALL_ARGS)))
        args = found[4][:]
        args[X_ARG], args[OUT_ARG] = data_address(x), data_address(out)
        return args


def _channels(array):
    """Channels an image of ``array`` holds: NCHW's, or blocks x block (padding included)."""
    return array.shape[1] * (array.shape[4] if array.ndim == 5 else 1)


def _row_length(count, elements, itemsize):
    """A part's row of a workspace: ``elements``, rounded up to whole pages when there are
    several parts (``part_stride``: parts running side by side never share a page)."""
    return elements if count == 1 else part_stride(elements * itemsize) // itemsize


_NONE = {np.dtype(t): np.empty(0, t) for t in (np.float32, np.float64, np.int64)}
