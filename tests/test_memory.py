"""Bounded memory: a call's workspace is bounded by the tiles CSA chose (a thread's share of
L3 per part), never by the input size; plan and kernel caches are bounded, so calls over ever
new shapes keep the resident memory flat. ``CSO_LONG_TESTS=1`` runs the 10,000-call version."""
import os

import numpy as np
import pytest

import cso
from bench.memory import peak_extra
from cso import host_machine

LONG = os.environ.get("CSO_LONG_TESTS") == "1"

# (input shape, weight shape, conv arguments): planes far larger than any cache (outputs of
# 1-4 GB, planned, not run: a Xeon's L3 of 300 MiB held the planes of a quarter the size)
LARGE = {
    "padded_tiny_input": ((1, 2, 5, 5), (3, 2, 3, 3), dict(padding=10000)),
    "wide_rows": ((1, 3, 4, 32_000_000), (8, 3, 3, 3), dict(padding=1)),
    "resnet_like_112": ((1, 256, 112, 112), (256, 256, 3, 3), dict(padding=1)),
    "filters_in_vectors_forced": ((1, 16, 4000, 4000), (64, 16, 3, 3),
                                  dict(padding=1, plan_overrides={"vectors_along": "filters"})),
    "direct_forced": ((1, 16, 4000, 4000), (64, 16, 3, 3),
                      dict(padding=1, plan_overrides={"vectors_along": "filters", "slab": True})),
    "depthwise": ((1, 16, 8000, 8000), (16, 1, 3, 3), dict(padding=1, groups=16)),
}


def workspace_bytes(conv, shape, threads):
    prepared = conv._prepared(shape, np.dtype(np.float32), threads)
    per_part = (prepared.scratch_elements + prepared.out_t_elements) * 4
    return per_part, len(prepared.parts), prepared.plan


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", sorted(LARGE))
def test_workspace_is_bounded_by_the_tiles(name, threads):
    """Planned, not run: each part's workspace is its slab or transposed output band, within
    its thread's share of L3, and its packed tiles, within it too (``csa.blocking.blocking``),
    whatever the plane."""
    shape, weight_shape, kwargs = LARGE[name]
    conv = cso.Conv2d(np.ones(weight_shape, np.float32), **kwargs)
    per_part, parts, plan = workspace_bytes(conv, shape, threads)
    share = host_machine().per_thread(parts).l3
    assert per_part <= 2 * share, (per_part, share, plan.explain())
    output = np.prod(plan.spec.output_shape) * 4
    assert output > 4 * share or name == "resnet_like_112"   # the bound is not the plane


def test_a_call_allocates_its_workspace_and_output_only():
    """Measured: the peak a call allocates beyond its output is its planned workspace (a
    plane of 3 x 3003 x 3003 outputs, 108 MB, for a 2 x 5 x 5 input)."""
    x = np.ones((1, 2, 5, 5), np.float32)
    conv = cso.Conv2d(np.ones((3, 2, 3, 3), np.float32), padding=1500)
    extra, y = peak_extra(conv, x)
    per_part, parts, _ = workspace_bytes(conv, x.shape, cso.get_num_threads())
    assert y.shape == (1, 3, 3003, 3003) and y[0, :, 1500, 1500].tolist() == [18.0] * 3
    assert extra <= per_part * parts + 64 * 1024, (extra, per_part, parts)


def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_resident_memory_stays_flat_over_ever_new_shapes(rng):
    """Every call has a new input shape, through both a Conv2d and conv2d (which plans each
    time): past the bounded caches' sizes (1024 plans, 64 prepared shapes) the process does not
    grow. 3,000 calls in CI, 10,000 with CSO_LONG_TESTS=1."""
    calls = 10_000 if LONG else 3_000
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    dw = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, padding=1)
    sizes = []
    for i in range(calls):   # 10,000 distinct shapes, their sizes spread the same throughout
        rows, cols = i % 100, (i % 100 + i // 100) % 100
        x = rng.standard_normal((1, 4, 5 + rows, 5 + cols)).astype(np.float32)
        conv(x)
        cso.conv2d(x, dw, padding=1, groups=4)
        if i in (calls // 2, calls - 1):
            sizes.append(resident_mb())
    assert sizes[1] - sizes[0] < 4, sizes
