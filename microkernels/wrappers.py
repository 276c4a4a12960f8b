"""Generated kernels called from Python on NumPy arrays, for tests and ``dump`` only: a ctypes
call costs microseconds, so the loop nests call kernels through their addresses instead.

``compile(spec)`` compiles (or loads) the kernel of any family's spec and returns a callable
that checks every size and stride against the family's contract, so that no call from Python
touches memory outside its arrays; it takes the arguments of the family's reference
(``microkernels.reference``), element offsets and steps where the kernel takes addresses and
byte steps. ``.ir`` and ``.asm`` show the optimised code.
"""
import ctypes
from functools import lru_cache

import numpy as np

from . import activation, depthwise, depthwise_blocked, outer_product, row_copy, transpose
from .ir import BIAS, I64
from .jit import native_function
from .reference import stored_windows
from .spec import (ACTIVATIONS, ActivationSpec, BlockedDepthwiseSpec, DepthwiseSpec, KernelSpec,
                   RowCopySpec, TapCopySpec, TransposeSpec)

# spec type -> (generator, its function type)
GENERATORS = {
    KernelSpec: (outer_product.define_kernel, outer_product.FUNCTION_TYPE),
    DepthwiseSpec: (depthwise.define_depthwise, depthwise.FUNCTION_TYPE),
    BlockedDepthwiseSpec: (depthwise_blocked.define_blocked_depthwise,
                           depthwise_blocked.FUNCTION_TYPE),
    TransposeSpec: (transpose.define_transpose, transpose.FUNCTION_TYPE),
    RowCopySpec: (row_copy.define_row_copy, row_copy.FUNCTION_TYPE),
    TapCopySpec: (row_copy.define_tap_copy, row_copy.TAP_FUNCTION_TYPE),
    ActivationSpec: (activation.define_activation, activation.FUNCTION_TYPE),
}


def generator(spec):
    """The function defining kernel ``spec``'s IR: ``generator(spec)(module, spec)``."""
    return GENERATORS[type(spec)][0]


def _need(ok, message):
    if not ok:
        raise ValueError(message)


def _address(name, arr, dtype, first, end, writeable=False):
    """The address of ``arr`` (C-contiguous, of ``dtype``) after checking that elements
    ``first`` .. ``end`` - 1, the ones the kernel touches, lie inside it."""
    _need(isinstance(arr, np.ndarray) and arr.dtype == dtype and arr.flags.c_contiguous
          and (first >= end or 0 <= first and end <= arr.size),
          f"{name} must be a C-contiguous {dtype} array holding elements {first} .. {end - 1}, "
          f"got {getattr(arr, 'dtype', type(arr).__name__)} of shape {getattr(arr, 'shape', None)}")
    _need(not writeable or arr.flags.writeable, f"{name} must be writeable")
    return arr.ctypes.data


class _Kernel:
    """A compiled kernel: ``spec``, ``.ir`` (optimised LLVM IR), ``.asm`` and ``_function``,
    its ctypes function taking raw addresses (argument types from the generator's)."""

    def __init__(self, spec):
        self.spec = spec
        define, function_type = GENERATORS[type(spec)]
        native = native_function(define, spec)
        self._module = native.module
        self._function = native.module.function(
            native.name, None, *[ctypes.c_int64 if t == I64 else ctypes.c_void_p
                                 for t in function_type.args])
        self.itemsize = spec.np_dtype.itemsize

    @property
    def ir(self):
        return self._module.ir

    @property
    def asm(self):
        return self._module.asm


    def _params(self, kind, params):
        """``params``, the parameters of activation ``kind``, as an array of the dtype."""
        names = ACTIVATIONS[kind]
        values = np.array(params, self.spec.np_dtype).reshape(-1)
        _need(values.size == len(names),
              f"{kind} takes {len(names)} parameters {names}, got {values.size}")
        return values


class OuterProduct(_Kernel):
    def __call__(self, k, a, b, c, ldc, width_used, rows_used, bias=None, flags=0, lda=None,
                 ldb=None, slab_rows=None, col0=0, row_width=None, gap=0, params=(), ldv=None,
                 next_address=0, next_step=0):
        """``lda`` and ``ldb`` default to packed tiles' ``width`` and ``broadcasts``. A slab,
        direct or blocked kernel takes ``slab_rows`` (int64 element offsets of A's rows, or
        B's), a slab kernel also its virtual row (``col0``, ``row_width``, ``gap``), a blocked
        kernel ``ldb`` (its broadcasts' stride, default 1) and ``ldv`` (C's vector stride). A
        ``prefetch_next`` kernel asks for lines from ``next_address`` on, ``next_step`` bytes
        a row (any address: prefetches never fault)."""
        spec, dt = self.spec, self.spec.np_dtype
        blocked = spec.variant == "blocked"
        lda = spec.width if lda is None else lda
        ldb = (1 if blocked else spec.broadcasts) if ldb is None else ldb
        ldv = spec.lanes if ldv is None else ldv
        _need(k >= 1 and lda >= spec.width and ldb >= (1 if blocked else spec.broadcasts)
              and ldv >= spec.lanes
              and 1 <= rows_used <= spec.broadcasts and 1 <= width_used <= spec.width,
              f"need k >= 1, lda >= {spec.width}, ldb >= {spec.broadcasts} (1 blocked), ldv >= "
              f"{spec.lanes}, 1 <= rows_used <= {spec.broadcasts}, 1 <= width_used <= "
              f"{spec.width}; got k={k}, lda={lda}, ldb={ldb}, ldv={ldv}, rows_used={rows_used}, "
              f"width_used={width_used}")
        a_end, b_end, rows_address = (k - 1) * lda + spec.width, (k - 1) * ldb + spec.broadcasts, 0
        if spec.variant != "packed":
            _need(isinstance(slab_rows, np.ndarray) and slab_rows.dtype == np.int64
                  and slab_rows.flags.c_contiguous and slab_rows.size >= k
                  and slab_rows[:k].min() >= 0,
                  f"slab_rows must be a C-contiguous int64 array of at least k={k} non-negative "
                  "offsets")
            rows_address = slab_rows.ctypes.data
        if spec.variant == "direct":
            b_end = int(slab_rows[:k].max()) + spec.broadcasts
        if blocked:
            b_end = int(slab_rows[:k].max()) + (spec.broadcasts - 1) * ldb + 1
        if spec.variant == "slab":
            _need(row_width is not None and 0 <= gap < row_width and 0 <= col0 < row_width
                  and col0 + spec.width <= 2 * row_width,
                  f"need 0 <= gap < row_width, 0 <= col0 < row_width, col0 + {spec.width} <= "
                  f"2*row_width; got col0={col0}, row_width={row_width}, gap={gap}")
            a_end = int(slab_rows[:k].max()) + spec.width
        elements, offsets = stored_windows(width_used, col0,
                                           row_width if spec.variant == "slab" else None, gap)
        if blocked:
            offsets = elements // spec.lanes * ldv + elements % spec.lanes
            _need(ldc >= spec.lanes and (ldv >= ldc * spec.broadcasts or ldc >= width_used),
                  f"a blocked kernel's C rows and vectors must not overlap: need ldc >= "
                  f"{spec.lanes} and ldv >= ldc*{spec.broadcasts} (blocks) or ldc >= "
                  f"width_used (channels last); got ldc={ldc}, ldv={ldv}")
        row_end = offsets.max() + 1 if offsets.size else 0
        values = self._params(spec.activation, params)   # referenced until the call returns
        _need(blocked or ldc >= row_end, f"need ldc >= the {row_end} columns a C row is stored "
                                         f"on, got ldc={ldc}")
        self._function(
            k, _address("a", a, dt, 0, a_end), lda, _address("b", b, dt, 0, b_end), ldb,
            _address("c", c, dt, 0, (rows_used - 1) * ldc + row_end, writeable=True), ldc, ldv,
            width_used, rows_used,
            _address("bias", bias, dt, 0, width_used if blocked else rows_used)
            if flags & BIAS else 0,
            flags, rows_address, col0, row_width or 0, gap, values.ctypes.data, next_address,
            next_step)


class Depthwise(_Kernel):
    def __call__(self, slab, offsets, weights, out, positions, row_width, q, bias=None,
                 flags=0, params=()):
        """Taps as many as ``offsets`` (int64, non-negative); the slab must hold two vectors
        past the last position a tap reads (the kernel reads up to one, its aligned loads one
        more)."""
        dt, lanes = self.spec.np_dtype, self.spec.lanes
        _need(isinstance(offsets, np.ndarray) and offsets.dtype == np.int64
              and offsets.flags.c_contiguous and offsets.size >= 1 and offsets.min() >= 0,
              "offsets must be a C-contiguous int64 array of at least one non-negative offset")
        _need(positions >= 1 and 1 <= q <= row_width,
              f"need positions >= 1, 1 <= q <= row_width; got positions={positions}, q={q}, "
              f"row_width={row_width}")
        taps, last = offsets.size, positions - 1
        values = self._params(self.spec.activation, params)
        out_end = (last // row_width) * q + min(last % row_width + 1, q)
        self._function(
            taps, _address("slab", slab, dt, 0, positions + int(offsets.max()) + 2 * lanes),
            offsets.ctypes.data, _address("weights", weights, dt, 0, taps),
            _address("out", out, dt, 0, out_end, writeable=True), positions, row_width, q,
            _address("bias", bias, dt, 0, 1) if flags & BIAS else 0, flags, values.ctypes.data)


class BlockedDepthwise(_Kernel):
    def __call__(self, x, offsets, step, weights, out, bias=None, flags=0, params=()):
        """Taps as many as ``offsets`` (int64, non-negative); window t of tap i reads the
        lanes at ``offsets[i] + t*step`` of ``x``, ``weights`` holds a vector per tap."""
        spec, dt, lanes = self.spec, self.spec.np_dtype, self.spec.lanes
        _need(isinstance(offsets, np.ndarray) and offsets.dtype == np.int64
              and offsets.flags.c_contiguous and offsets.size >= 1 and offsets.min() >= 0
              and step >= 0,
              "offsets must be a C-contiguous int64 array of at least one non-negative offset, "
              f"step >= 0; got step={step}")
        taps = offsets.size
        values = self._params(spec.activation, params)
        self._function(
            taps, _address("x", x, dt, 0, int(offsets.max()) + (spec.windows - 1) * step + lanes),
            offsets.ctypes.data, step, _address("weights", weights, dt, 0, taps * lanes),
            _address("out", out, dt, 0, spec.windows * lanes, writeable=True),
            _address("bias", bias, dt, 0, lanes) if flags & BIAS else 0, flags,
            values.ctypes.data)


class Transpose(_Kernel):
    def __call__(self, src, lds, dst, ldd, rows, cols, bias=None, flags=0, params=()):
        dt, lanes = self.spec.np_dtype, self.spec.lanes
        _need(1 <= rows <= lanes and 1 <= cols <= lanes and lds >= cols and ldd >= rows,
              f"need 1 <= rows, cols <= {lanes}, lds >= cols, ldd >= rows; got rows={rows}, "
              f"cols={cols}, lds={lds}, ldd={ldd}")
        values = self._params(self.spec.activation, params)
        self._function(
            _address("src", src, dt, 0, (rows - 1) * lds + cols), lds,
            _address("dst", dst, dt, 0, (cols - 1) * ldd + rows, writeable=True), ldd, rows,
            cols, _address("bias", bias, dt, 0, cols) if flags & BIAS else 0, flags,
            values.ctypes.data)


class _Copy(_Kernel):
    def _rows(self, name, arr, start, step, count, first, end, writeable=False):
        """The address of element ``start`` of ``arr`` after checking that elements ``first``
        .. ``end`` - 1 of each of ``count`` rows ``step`` apart from there lie inside it."""
        span = (count - 1) * step
        low, high = (start + first + min(0, span), start + end + max(0, span)) if (
            count > 0 and first < end) else (0, 0)
        return (_address(name, arr, self.spec.np_dtype, low, high, writeable)
                + start * self.itemsize)

    def _dst_end(self):
        """How far past a row's start the kernel touches: its blends read whole vectors."""
        return -(-self.spec.width // self.spec.lanes) * self.spec.lanes


class RowCopy(_Copy):
    def __call__(self, dst, dst_start, dst_step, src, src_start, src_step, count, stride, j0, j1,
                 lo, hi):
        width = self.spec.width
        _need(count >= 0 and stride >= 1 and 0 <= j0 <= j1 <= width and 0 <= lo <= hi <= width,
              f"need count >= 0, stride >= 1, 0 <= j0 <= j1 <= {width}, 0 <= lo <= hi <= {width}; "
              f"got count={count}, stride={stride}, j0={j0}, j1={j1}, lo={lo}, hi={hi}")
        item = self.itemsize
        self._function(
            self._rows("dst", dst, dst_start, dst_step, count, 0, self._dst_end(), True),
            dst_step * item,
            self._rows("src", src, src_start, src_step, count, lo * stride, (hi - 1) * stride + 1),
            src_step * item, count, stride, j0, j1, lo, hi)


class TapCopy(_Copy):
    def __call__(self, dst, dst_start, dst_step, tap_step, src, src_start, src_step, count, taps,
                 stride, j0, j1, end, lo, hi):
        width = self.spec.width
        _need(count >= 0 and taps >= 1 and stride >= 1 and 0 <= j0 <= j1 <= end <= width,
              f"need count >= 0, taps, stride >= 1, 0 <= j0 <= j1 <= end <= {width}; got "
              f"count={count}, taps={taps}, stride={stride}, j0={j0}, j1={j1}, end={end}")
        item = self.itemsize
        # the positions a row's run reads: through every tap, inside [lo, hi)
        first, last = max(lo, j0 * stride, 0), min(hi, (j1 - 1) * stride + taps)
        dst_end = (taps - 1) * tap_step + self._dst_end()
        self._function(
            self._rows("dst", dst, dst_start, dst_step, count, 0, dst_end, True),
            dst_step * item, tap_step * item,
            self._rows("src", src, src_start, src_step, count, first, last), src_step * item,
            count, taps, stride, j0, j1, end, lo, hi)


class Activation(_Kernel):
    def __call__(self, x, out, params=()):
        """out[:x.size] = the activation of ``x``'s elements; ``out`` may be ``x``;
        ``params``: the kind's parameters (``ACTIVATIONS``)."""
        spec, dt = self.spec, self.spec.np_dtype
        values = self._params(spec.kind, params)
        n = x.size if isinstance(x, np.ndarray) else 0
        self._function(_address("x", x, dt, 0, n), _address("out", out, dt, 0, n, True), n,
                       values.ctypes.data)


WRAPPERS = {KernelSpec: OuterProduct, DepthwiseSpec: Depthwise,
            BlockedDepthwiseSpec: BlockedDepthwise, TransposeSpec: Transpose,
            RowCopySpec: RowCopy, TapCopySpec: TapCopy, ActivationSpec: Activation}


@lru_cache(maxsize=64)
def compile(spec):  # noqa: A001 - the public name the architecture asks for
    """Kernel ``spec`` (any family's spec) compiled for the host and wrapped for Python."""
    return WRAPPERS[type(spec)](spec)
