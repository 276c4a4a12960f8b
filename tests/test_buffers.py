"""The reused arrays of cso.onnx's values and of large convolution outputs (``cso.buffers``)
and the line-aligned arrays cso makes
(``microkernels.aligned``): every array starts on a cache line, and a reused array is handed
out again only when neither it nor any view of it is alive; a thread's kept workspaces
(``cso.jobs.workspace``), of which a call's kernels read only what the call wrote."""
import ctypes
import platform
import sys
import threading
import weakref

import numpy as np
import pytest

import csa
import cso
from cso.buffers import Buffers
from microkernels.aligned import LINE, aligned_empty
from microkernels.jit import JitModule

from .reference import conv2d_reference


@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3, 5), (1, 64, 55, 55), (0, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_aligned_empty(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert a.size == 0 or a.ctypes.data % LINE == 0   # an empty array has no data to align
    a[...] = 1   # all of it is writable memory of its own
    assert np.all(a == 1)


def test_conv2d_output_of_a_page_or_more_starts_on_a_line(rng):
    """(Smaller outputs are where NumPy puts them: aligning costs more than it saves there.)"""
    x = rng.standard_normal((1, 3, 17, 17)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    y = cso.conv2d(x, w)
    assert y.nbytes >= cso.api.ALIGNED_OUTPUT_BYTES and y.ctypes.data % LINE == 0


@pytest.mark.parametrize("shape, aligned", [
    ((1, 8, 16, 16), True), ((1, 2048, 1, 1), False), ((4, 1024, 2, 2), False),
    ((1, 1024, 4, 4), True), ((1, 128, 1, 1, 16), True), ((1, 4, 1, 1, 16), False)])
def test_outputs_are_aligned_where_their_images_span_a_line(shape, aligned):
    """A page or more, and each channel's plane (or block's pixels) at least a line: planes
    shorter than a line start mid-line whatever the array's start, so aligning such an output
    (a squeeze and excitation's one pixel) would cost its call 1-2 us for nothing."""
    make = cso.api._output_maker(shape, np.dtype(np.float32))
    assert make is (aligned_empty if aligned else np.empty)


def test_buffers_hands_out_an_array_again_only_when_nothing_refers_to_it():
    buffers = Buffers()
    first = buffers.get((2, 3, 4), np.float32)
    assert first.shape == (2, 3, 4) and first.dtype == np.float32
    assert first.ctypes.data % LINE == 0
    address = first.ctypes.data
    view = first.reshape(-1)[5:]
    del first
    second = buffers.get((2, 3, 4), np.float32)   # a view of the first is alive
    assert second.ctypes.data != address
    del view
    third = buffers.get((2, 3, 4), np.float32)
    assert third.ctypes.data == address           # nothing refers to the first any more
    held = second.ctypes.data
    assert buffers.get((2, 3, 4), np.float32).ctypes.data not in (address, held)  # both held
    view_of_view = second[1:][0]
    del second                                    # only a view of a view of it is alive
    assert buffers.get((2, 3, 4), np.float32).ctypes.data not in (address, held)
    del view_of_view
    again = buffers.get([2, 3, 4], "float32")     # the same array, however shape and dtype say it
    assert again.ctypes.data == held and again.shape == (2, 3, 4)
    other = buffers.get((2, 3, 4), np.float64)    # another dtype: an array of its own
    assert other.ctypes.data not in (address, held)
    assert buffers.nbytes >= 3 * 24 * 4 + 24 * 8
    buffers.clear()
    assert buffers.nbytes == 0


def test_buffers_share_a_free_block_between_shapes_of_close_sizes():
    """A value takes the smallest free block that holds it, of at most ``SLACK`` times its
    bytes (values of other shapes whose lives do not overlap share memory); a smaller one
    gets a block of its own."""
    from cso.buffers import SLACK
    buffers = Buffers()
    big, small = buffers.get((4, 100), np.float32), buffers.get((2, 100), np.float32)
    big_at, small_at = big.ctypes.data, small.ctypes.data
    del big, small
    other = buffers.get((3, 5, 20), np.float32)    # 1200 bytes: the 1600-byte block
    assert other.ctypes.data == big_at and other.shape == (3, 5, 20)
    assert other.ctypes.data % LINE == 0
    half = buffers.get((200,), np.float32)         # 800 bytes: the 800-byte one, not a new one
    assert half.ctypes.data == small_at
    del half
    tiny = buffers.get((800 // SLACK // 4 - 1,), np.float32)   # under 1/SLACK of the free one
    assert tiny.ctypes.data not in (big_at, small_at)
    as_bytes = buffers.get((800,), np.uint8)       # any dtype: the free 800-byte block
    assert as_bytes.ctypes.data == small_at
    del as_bytes
    assert buffers.owns(other) and buffers.owns(tiny[1:]) and not buffers.owns(np.zeros(3))
    np.testing.assert_array_equal(buffers.get((3, 5, 20), np.float32).shape, (3, 5, 20))
    kept = buffers.get((7, 9), np.float32)   # asked for again once free: the same array
    made = weakref.ref(kept)
    del kept
    assert buffers.get((7, 9), np.float32) is made()


def test_buffers_keep_at_most_their_most_recent_blocks():
    """``Buffers(most=2)``: a third block lets the least recently handed out one go (its
    arrays keep it), so dropped outputs hold at most two blocks."""
    buffers = Buffers(most=2)
    first, second = buffers.get((64,), np.float32), buffers.get((64,), np.float32)
    first_at = first.ctypes.data
    del first
    again = buffers.get((64,), np.float32)     # free: reused, now the most recent
    assert again.ctypes.data == first_at
    third = buffers.get((64,), np.float32)     # both in use: a new block, and second's goes
    assert len(buffers._blocks) == 2 and not buffers.owns(second) and buffers.owns(third)


def test_large_outputs_reuse_a_dropped_outputs_memory(restore_threads):
    """A convolution's outputs from ``LARGE_OUTPUT_BYTES`` up (which glibc maps, and the OS
    zeroes, anew each call): a dropped output's memory serves the next call, never one still
    referred to (by the output or a view of it), nor one another thread's call holds; the
    values are the call's own."""
    from cso.buffers import LARGE_OUTPUT_BYTES
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((512, 4, 1, 1)).astype(np.float32)
    xs = [rng.standard_normal((1, 4, 130, 128)).astype(np.float32) for _ in range(3)]
    conv = cso.Conv2d(weight)
    expected = [conv(x, out=np.empty((1, 512, 130, 128), np.float32)) for x in xs]
    assert expected[0].nbytes >= LARGE_OUTPUT_BYTES
    first = conv(xs[0])
    at = first.ctypes.data
    view = first[0, 3]
    del first
    second = conv(xs[1])                       # a view of the first is alive
    assert second.ctypes.data != at
    np.testing.assert_array_equal(view, expected[0][0, 3])
    np.testing.assert_array_equal(second, expected[1])
    second_at = second.ctypes.data
    del view, second
    third = conv(xs[2])                        # nothing refers to the first or second
    assert third.ctypes.data in (at, second_at)
    np.testing.assert_array_equal(third, expected[2])
    del third
    results = {}

    def calls(i):
        for _ in range(3):
            out = conv(xs[i])
            results.setdefault(i, []).append((out.ctypes.data, out))   # all kept alive

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    addresses = [a for i in results for a, _ in results[i]]
    assert len(set(addresses)) == 6              # none shared while alive
    for i in results:
        for _, out in results[i]:
            np.testing.assert_array_equal(out, expected[i])


def _in_a_new_thread(body):
    """Run ``body()`` on a thread of its own (one with no kept workspaces yet), re-raising."""
    failed = []

    def run():
        try:
            body()
        except BaseException as err:   # (re-raised on the test's thread)
            failed.append(err)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _transposing_layer(rng, c, h, k):
    """A 1x1 forced to filters in vectors, whose plan needs two workspaces (its packed input
    and its transposed output band), with its input and reference output."""
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    w = rng.standard_normal((k, c, 1, 1)).astype(np.float32)
    conv = cso.Conv2d(w, input_shape=x.shape, plan_overrides={"vectors_along": "filters"})
    return conv, x, conv2d_reference(x, w)


def test_a_layer_makes_its_workspaces_once_whatever_their_size(rng, monkeypatch):
    """Up to ``REUSED_WORKSPACE_BYTES`` a thread's calls share its kept workspaces: one made
    and dropped each call can page-fault every page it touched, each call again."""
    made = []
    new = cso.jobs.new_workspace
    monkeypatch.setattr(cso.jobs, "new_workspace", lambda *a: made.append(new(*a)) or made[-1])
    conv, x, want = _transposing_layer(rng, 72, 14, 512)
    prepared = conv._prepared(x.shape, x.dtype, 1)
    assert len(prepared.workspaces) == 2
    assert cso.jobs.KEPT_WORKSPACE_MIN_BYTES < prepared.workspace_bytes
    assert prepared.workspace_bytes <= cso.jobs.REUSED_WORKSPACE_BYTES

    def body():
        for _ in range(5):
            np.testing.assert_allclose(conv(x), want, rtol=1e-4, atol=1e-4)
        assert len(made) == 2   # one of each kind, on the first call
    _in_a_new_thread(body)


def test_a_grown_workspace_is_the_one_every_layer_uses_after(rng, monkeypatch):
    """A thread's workspace of a kind grows when a layer needs more; the layers that used the
    smaller one take the larger on their next call, and the smaller one is let go."""
    made = []
    new = cso.jobs.new_workspace
    monkeypatch.setattr(cso.jobs, "new_workspace", lambda *a: made.append(new(*a)) or made[-1])
    small, x_small, want_small = _transposing_layer(rng, 24, 14, 64)
    large, x_large, want_large = _transposing_layer(rng, 72, 14, 512)

    def body():
        np.testing.assert_allclose(small(x_small), want_small, rtol=1e-4, atol=1e-4)
        first = list(made)
        needs = small._prepared(x_small.shape, x_small.dtype, 1).workspaces
        assert sorted(a.nbytes for a in first) == sorted(
            max(e * t.itemsize, cso.jobs.KEPT_WORKSPACE_MIN_BYTES) for _, e, t in needs)
        np.testing.assert_allclose(large(x_large), want_large, rtol=1e-4, atol=1e-4)
        grown = len(made) - len(first)
        assert 1 <= grown <= 2
        for _ in range(3):
            np.testing.assert_allclose(small(x_small), want_small, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(large(x_large), want_large, rtol=1e-4, atol=1e-4)
        assert len(made) == len(first) + grown   # nothing made since
        spaces = [space for space, _ in cso.jobs.kept_workspaces().values()]
        replaced = [i for i, space in enumerate(first) if not any(space is s for s in spaces)]
        assert len(replaced) == grown
        for i in replaced:   # held by ``first`` and ``made`` alone (+ getrefcount's argument)
            references = sys.getrefcount(first[i])
            assert references == 3
    _in_a_new_thread(body)


def test_parts_of_a_call_have_workspace_rows_on_pages_of_their_own(rng, monkeypatch,
                                                                   restore_threads):
    """A call of several parts gives each its rows of a page-aligned workspace, whole pages
    apart (``cso.jobs.part_stride``): parts on two cores whose rows met in a page slowed each
    other (their prefetchers fetch ahead within a page); a call of one part takes its rows
    as they are. The result is the same either way."""
    made = []
    new = cso.jobs.new_workspace
    monkeypatch.setattr(cso.jobs, "new_workspace", lambda *a: made.append(new(*a)) or made[-1])
    x = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    w = rng.standard_normal((64, 4, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, padding=1, groups=16, plan_overrides={"split": (1, 4)})
    many = conv._prepared(x.shape, x.dtype, 2)
    assert many.part_count == 4 and many.workspaces
    for at, elements, dtype in many.workspaces:
        row = many.row_lengths[at] * dtype.itemsize
        assert row % cso.jobs.PAGE == 0 and elements == 4 * many.row_lengths[at]
    one = cso.Conv2d(w, padding=1, groups=16, plan_overrides={"split": (1, 1)})
    single = one._prepared(x.shape, x.dtype, 1)
    assert single.part_count == 1
    assert all(single.row_lengths[at] * t.itemsize % cso.jobs.PAGE
               for at, _, t in single.workspaces)   # (rows of a few KiB, not padded)
    cso.set_num_threads(2)

    def body():
        np.testing.assert_array_equal(conv(x), one(x))
        assert made and all(cso.jobs.data_address(a) % cso.jobs.PAGE == 0 for a in made)
    _in_a_new_thread(body)


# MXCSR's sticky flags, read and cleared: bit 1 (DE) is set by any SSE/AVX operation that
# takes a subnormal operand, whether or not its result is kept
_TAKE_FLAGS_IR = """
declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @llvm.x86.sse.ldmxcsr(ptr)
define i32 @take_flags() {
  %at = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %at)
  %was = load i32, ptr %at
  %cleared = and i32 %was, -64
  store i32 %cleared, ptr %at
  call void @llvm.x86.sse.ldmxcsr(ptr %at)
  ret i32 %was
}
"""
DENORMAL_OPERAND = 2


def _reads_only_what_it_wrote(conv, x, want):
    """Whether ``conv``'s call on ``x`` (``want``) takes no subnormal operand with the
    thread's workspaces full of subnormals (MXCSR's DE flag), the input and filters having
    none: its kernels read only what its call wrote."""
    take_flags = JitModule(_TAKE_FLAGS_IR).function("take_flags", ctypes.c_int32)
    read = []

    def body():
        conv(x)
        for space, _ in cso.jobs.kept_workspaces().values():
            space.view(np.float32)[:] = np.float32(1e-40)   # subnormal
        take_flags()
        y = conv(x)
        read.append(take_flags() & DENORMAL_OPERAND)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    _in_a_new_thread(body)
    return read == [0]


X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not X86, reason="reads the x86 MXCSR flags")
@pytest.mark.parametrize("band", [1, 3])
@pytest.mark.parametrize("x_shape,w_shape,stride", [
    ((1, 8, 30, 30), (16, 8, 3, 3), 1), ((1, 5, 21, 37), (8, 5, 3, 3), 1),
    ((1, 6, 71, 71), (8, 6, 5, 5), 2)])
def test_a_windows_slab_plan_reads_only_what_its_call_wrote(rng, x_shape, w_shape, stride,
                                                            band):
    """A windows-in-vectors slab plan's kernels read only slab elements its call wrote, in
    bands of ``band`` tiles. The last row a band's windows reach through the padding columns'
    taps (a row further) was left unwritten, and a subnormal an earlier job left there (heap
    garbage, reinterpreted integers) slowed such calls 1.5-1.8x, every FMA on it
    microcoded."""
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    pad = w_shape[2] // 2
    conv = cso.Conv2d(w, stride=stride, padding=pad,
                      plan_overrides={"vectors_along": "windows", "slab": True, "band": band,
                                      "split": (1, 1)})   # (run on the calling thread)
    assert conv.plan_for(x.shape).band == band
    assert _reads_only_what_it_wrote(conv, x, conv2d_reference(
        x, w, stride=(stride, stride), padding=(pad,) * 4))


@pytest.mark.skipif(not X86, reason="reads the x86 MXCSR flags")
@pytest.mark.parametrize("x_shape,kernel,stride", [
    ((1, 32, 14, 14), 1, 2), ((1, 16, 15, 15), 1, 2), ((1, 16, 20, 20), 3, 2),
    ((1, 16, 19, 23), 3, 1)])
def test_a_depthwise_plan_reads_only_what_its_call_wrote(rng, x_shape, kernel, stride):
    """A depthwise plan's kernels read only slab elements its call wrote: a 1x1 at stride 2
    fills one phase plane of four, and a channel's last vectors read into the next plane."""
    c = x_shape[1]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((c, 1, kernel, kernel)).astype(np.float32)
    pad = kernel // 2
    conv = cso.Conv2d(w, stride=stride, padding=pad, groups=c, plan_overrides={"split": (1, 1)})
    assert isinstance(conv.plan_for(x.shape), csa.DepthwisePlan)
    assert _reads_only_what_it_wrote(conv, x, conv2d_reference(
        x, w, stride=(stride, stride), padding=(pad,) * 4, groups=c))
