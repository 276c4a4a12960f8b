"""A program's values planned in one arena (``cso.onnx.arena``): the plan never puts two
values alive at once in the same bytes, and the planned pool hands out an array at its offset
only while nothing refers to the arrays planned in the same bytes."""
import numpy as np
import pytest

from cso.jobs import LINE, data_address
from cso.onnx.arena import Planned, Sizing, new_arena


def _spans(plan):
    """(start, stop) of each planned array in the arena."""
    return [(offset, offset + int(np.prod(shape)) * dtype.itemsize)
            for offset, (shape, dtype) in zip(plan.offsets, plan.requests)]


def _run_ops(sizing, ops):
    """Run ``ops`` on ``sizing``: ("get", key, shape) makes array ``key``, ("view", key, new)
    keeps a view of it as ``new``, ("drop", key) drops a reference; return what is held."""
    held = {}
    for op in ops:
        if op[0] == "get":
            held[op[1]] = sizing.get(op[2], np.float32)
        elif op[0] == "view":
            held[op[2]] = held[op[1]][1:]
        else:
            del held[op[1]]
    return held


def _assert_apart(plan, deaths, count):
    """No two arrays alive at once share a byte, and each starts on a line."""
    spans = _spans(plan)
    ends = [count + 1 if death is None else death for death in deaths]
    for i, (start, stop) in enumerate(spans):
        assert start % LINE == 0
        for j in range(i + 1, len(spans)):
            if j < ends[i]:   # j was asked for while i lived
                assert stop <= spans[j][0] or spans[j][1] <= start, (i, j)


def test_a_chain_takes_its_two_largest_neighbours():
    """A chain's values (each alive until the next step has made its output) take what the
    largest pair of neighbours needs: the first value's bytes go to the third, and so on."""
    sizing = Sizing()
    sizes = [88, 48, 84, 44, 80, 40]
    previous = None
    for size in sizes:
        value = sizing.get((size * 1024,), np.float32)
        previous = value   # (the one before dies here)
    del value, previous
    plan = sizing.plan()
    assert sizing.deaths == [2, 3, 4, 5, 6, 6]
    _assert_apart(plan, sizing.deaths, sizing.count)
    assert plan.nbytes == max(a + b for a, b in zip(sizes, sizes[1:])) * 4096
    assert plan.offsets[0] == plan.offsets[2] == plan.offsets[4] == 0


def test_views_keep_their_arrays_alive_in_the_plan():
    sizing = Sizing()
    held = _run_ops(sizing, [("get", "a", (1000,)), ("get", "b", (500,)), ("drop", "a"),
                           ("get", "c", (900,)), ("view", "c", "v"), ("drop", "c"),
                           ("get", "d", (100,)), ("drop", "b"), ("drop", "v")])
    assert sizing.deaths == [2, 4, 4, None]   # c lived on in its view until d was made
    plan = sizing.plan()
    _assert_apart(plan, sizing.deaths, sizing.count)
    start_a, _ = _spans(plan)[0]
    start_c, _ = _spans(plan)[2]
    assert start_a == start_c   # c took a's bytes, dead before it
    assert list(held) == ["d"]


@pytest.mark.parametrize("seed", range(5))
def test_random_lives_never_share_bytes(seed):
    rng = np.random.default_rng(seed)
    sizing, held = Sizing(), []
    for _ in range(300):
        if held and rng.random() < 0.45:
            held.pop(rng.integers(len(held)))
        else:
            held.append(sizing.get((int(rng.integers(1, 5000)),), np.float32))
    plan = sizing.plan()
    _assert_apart(plan, sizing.deaths, sizing.count)
    sizes = [stop - start for start, stop in _spans(plan)]
    ends = [sizing.count + 1 if death is None else death for death in sizing.deaths]
    live_at_once = max(sum(size for i, size in enumerate(sizes) if i <= t < ends[i])
                       for t in range(sizing.count))
    assert live_at_once <= plan.nbytes <= sum(-(-size // LINE) * LINE for size in sizes)


def _planned_chain():
    """A Planned pool of a chain of three values (the third in the first one's bytes)."""
    sizing = Sizing()
    a = sizing.get((64, 8), np.float32)
    b = sizing.get((32, 8), np.float32)
    del a
    c = sizing.get((48, 8), np.float32)
    del b, c
    plan = sizing.plan()
    arena = new_arena(plan.nbytes)
    return Planned(arena, plan), plan, arena


def test_planned_arrays_are_at_their_offsets_run_after_run():
    pool, plan, arena = _planned_chain()
    first = data_address(arena) + (-data_address(arena) % LINE)
    made = []
    for _ in range(2):
        pool.rewind(0)
        a = pool.get((64, 8), np.float32)
        b = pool.get((32, 8), np.float32)
        del a
        c = pool.get((48, 8), np.float32)
        made.append(id(c))   # (the pool keeps it: an array kept here would not be reused)
        assert [data_address(x) - first for x in (b, c)] == plan.offsets[1:]
        assert pool.owns(c[3:]) and not pool.owns(np.empty(3))
        del b, c
    assert made[0] == made[1] and pool.nbytes == 0   # the same array, nothing spilled


def test_planned_pool_spills_what_the_plan_does_not_hold():
    """An array asked for out of the plan's order, past its end, or in bytes that an array
    still referred to holds comes from blocks of the pool's own, apart from every other."""
    pool, plan, _ = _planned_chain()
    a = pool.get((64, 8), np.float32)
    a[:] = 7
    kept = a[2:]               # the third value's bytes are still a's: not handed out
    del a
    b = pool.get((32, 8), np.float32)
    c = pool.get((48, 8), np.float32)
    c[:] = 1
    assert not np.shares_memory(c, kept) and np.all(kept == 7)
    assert pool.nbytes > 0 and pool.owns(c)
    wrong = pool.get((5,), np.float64)   # past the plan
    assert not any(np.shares_memory(wrong, x) for x in (b, c, kept))
    pool.rewind(0)
    other = pool.get((64, 4), np.float32)   # not the shape planned first
    assert not any(np.shares_memory(other, x) for x in (b, c, kept, wrong))
