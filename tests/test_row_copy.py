"""The packers' copy kernels over their edges, against their NumPy references: row copies
(every stride path: shuffled and gathered) and tap copies (every tap count and stride), rows
narrower, as wide as and wider than a vector, runs covering all or part of a row. The source
is exactly what a call may read, flush against a guard page (a read past it faults); the
destination has NaN guards around its rows and the slack a blend may read."""
import numpy as np
import pytest

import microkernels as mk
from .guarded import guarded_copy
from microkernels.row_copy import MAX_TAPS, SAMPLED_STRIDES, max_taps

ISAS = [isa.name for isa in mk.supported_isas()]


def widths(dtype, isa):
    lanes = mk.RowCopySpec(dtype, 1, isa).lanes
    return sorted({1, 5, 6, 7, 14, lanes - 1 or 1, lanes, lanes + 1, 2 * lanes + 3})


def specs(spec_type):
    return [spec_type(dtype, width, isa) for isa in ISAS for dtype in ("f32", "f64")
            for width in widths(dtype, isa)]


def runs(width):
    """(j0, j1, lo, hi): whole rows, a run ending or starting inside the row, padding on
    either side, a run wholly in the padding, an empty run."""
    mid = width // 2
    return sorted({(0, width, 0, width), (0, width, 1 % width, width - 1 or 1),
                   (0, mid, 0, mid), (mid, width, mid, width), (1 % width, width, 0, width),
                   (0, width, 0, 0), (mid, mid, 0, width), (0, width, mid, mid + 1)})


def check_copy(spec, rng, dst_rows, call):
    """Run ``call(kernel_or_reference, dst)`` on a NaN-guarded destination of ``dst_rows``
    elements (plus a blend's slack) through the kernel and the reference: equal, guards
    kept."""
    dt, guard = spec.np_dtype, 3
    dst = np.full(guard + dst_rows + spec.lanes + guard, np.nan, dt)
    dst[guard:guard + dst_rows] = rng.standard_normal(dst_rows)
    expected = dst.copy()
    call(mk.compile(spec), dst, guard)
    call(mk.reference_kernel(spec), expected, guard)
    np.testing.assert_array_equal(dst, expected)


def source(rng, dt, size, at):
    """``size`` random values flush against a guard page at its ``at`` end."""
    return guarded_copy(rng.standard_normal(max(size, 1)).astype(dt), at)


@pytest.mark.parametrize("spec", specs(mk.RowCopySpec), ids=str)
def test_row_copy(spec, rng):
    width = spec.width
    for stride in range(1, SAMPLED_STRIDES + 3):
        for count, (j0, j1, lo, hi) in enumerate(runs(width)):
            count %= 4
            src_step = (hi - 1) * stride + 3   # rows overlap no read, odd
            first, end = lo * stride, (hi - 1) * stride + 1 if hi > lo else lo * stride
            size = max(0, (count - 1)) * src_step + end - first
            src = source(rng, spec.np_dtype, size, "end" if count % 2 else "start")
            dst_step = width + 2 * (count % 2)

            def call(kernel, dst, guard):
                kernel(dst, guard, dst_step, src, -first, src_step, count, stride, j0, j1, lo, hi)
            check_copy(spec, rng, max(count, 1) * dst_step, call)


@pytest.mark.parametrize("spec", specs(mk.TapCopySpec), ids=str)
def test_tap_copy(spec, rng):
    """Every tap count (those past ``max_taps`` and odd strides store nothing), end past the
    run (the tail zeroed), windows in the padding."""
    width = spec.width
    for taps in range(1, MAX_TAPS + 2):
        for stride in (1, 2, 3):
            for count, (j0, j1, lo, hi) in enumerate(runs(width)):
                count %= 3
                end = min(width, j1 + count)
                lo, hi = lo * stride, hi * stride + taps - 1   # positions in the input row
                first, last = max(lo, j0 * stride), min(hi, (j1 - 1) * stride + taps)
                src_step = width * stride + taps + 1
                size = max(0, count - 1) * src_step + max(0, last - first)
                src = source(rng, spec.np_dtype, size, "end" if taps % 2 else "start")
                tap_step, dst_step = width + 1, taps * (width + 1) + 2

                def call(kernel, dst, guard):
                    kernel(dst, guard, dst_step, tap_step, src, -first, src_step, count, taps,
                           stride, j0, j1, end, lo, hi)
                check_copy(spec, rng, max(count, 1) * dst_step, call)
    assert max_taps(spec) <= MAX_TAPS


def test_wrapper_refuses_reads_outside_the_source():
    spec = mk.RowCopySpec("f32", 8, ISAS[-1])
    src, dst = np.zeros(8, np.float32), np.zeros(16, np.float32)
    mk.compile(spec)(dst, 0, 8, src, 0, 8, 1, 1, 0, 8, 0, 8)
    for args in [(dst, 0, 8, src, 1, 8, 1, 1, 0, 8, 0, 8), (dst, 0, 8, src, 0, 8, 2, 1, 0, 8, 0, 8),
                 (dst, 9, 8, src, 0, 8, 1, 1, 0, 8, 0, 8), (dst, 0, 8, src, 0, 8, 1, 1, 0, 9, 0, 8)]:
        with pytest.raises(ValueError):
            mk.compile(spec)(*args)
