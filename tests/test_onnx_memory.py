"""What a loaded model costs in memory (``Model.memory``, ``Conv2d.nbytes``), measured where
nothing else runs: a child process, its peak RSS beyond what it held before loading."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")
import cso  # noqa: E402
import cso.onnx  # noqa: E402

from .test_onnx_program import fire_model  # noqa: E402

MIB = 2 ** 20

# a chain of six 3x3 convolutions at 56 x 56, wide and narrow in turn, each value a shape of
# its own (as DenseNet's Concats have them): memory shared between values of one shape only
# would hold all six, memory planned over the values' lives the two largest neighbours
CHILD = r"""
import gc, json, weakref
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import cso.onnx

def rss(field="VmRSS"):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) * 1024

rng = np.random.default_rng(0)
widths, size = [3, 88, 48, 84, 44, 80, 40], 56
inits, nodes, previous = [], [], "x"
for i, (c, k) in enumerate(zip(widths, widths[1:])):
    w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes += [helper.make_node("Conv", [previous, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    previous = f"r{i}"
graph = helper.make_graph(
    nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
    [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
xs = [rng.standard_normal((batch, 3, size, size)).astype(np.float32) for batch in (1, 8)]
found = {"weights": sum(t.dims[0] * t.dims[1] * 9 * 4 for t in inits),
         "values": [8 * k * size * size * 4 for k in widths[1:]]}
warm = cso.onnx.load(model)   # its kernels compiled (or read from the cache) first: LLVM's
for x in xs:                   # memory is not the model's
    warm(x)
del warm
gc.collect()
with open("/proc/self/clear_refs", "w") as f:   # the peak (VmHWM) from here on
    f.write("5")
before = rss()
for cycle in range(3):
    loaded = cso.onnx.load(model)
    for x in xs:   # planned, then recorded on the arena
        loaded(x)
        loaded(x)
    if cycle == 0:
        found["peak"] = rss("VmHWM") - before
        found["held"] = loaded.memory()
    dropped = weakref.ref(loaded)
    del loaded
    gc.collect()
    found[f"after_drop_{cycle}"] = rss() - before
    found[f"collected_{cycle}"] = dropped() is None
print(json.dumps(found))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_of_a_model_and_what_its_drop_gives_back():
    """Loaded, run at batch 1 then 8 (twice each), one thread. Its values' arena holds what
    the two values live at once need at batch 8 (a convolution's input and output), to the
    line: each array a shape of its own, as before values of other shapes shared memory, held
    the six of each batch (43 MiB here); blocks reused for values of about their size, at
    most twice what the widest of each parity needs (19 MiB; 11 MiB is the bound). The peak
    beyond what the process held before loading is bounded by what the model reports holding
    (filters packed once, values, workspaces, input copies), the caller's output, and 8 MiB
    for the allocator's rounding and Python's objects (the kernels were compiled by a run
    before, whose model was dropped: 1.7 MiB over what the model held, measured). The model
    dropped is collected and gives its memory back, every time it is loaded, run and dropped
    again (within 1 MiB of the process before it). glibc's malloc is told to map its large
    blocks (128 KiB or more) and to give back its heap's free top: by default it keeps the
    blocks freed last, such as the outputs the caller dropped, for the process's next
    allocations (5 MiB here once a first batch-8 output was freed)."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env={**os.environ, "CSO_NUM_THREADS": "1",
                               "MALLOC_MMAP_THRESHOLD_": "131072",
                               "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    values, held = found["values"], found["held"]   # (batch 8's, in the chain's order)
    assert held["weights"] >= found["weights"]
    live_at_once = max(a + b for a, b in zip(values, values[1:]))
    assert live_at_once <= held["values"] <= live_at_once + 64 * 1024
    bound = held["total"] + values[-1] + 8 * MIB
    assert found["peak"] <= bound, (found["peak"] / MIB, bound / MIB)
    assert all(found[f"collected_{cycle}"] for cycle in range(3))
    assert all(found[f"after_drop_{cycle}"] <= MIB for cycle in range(3))


def test_model_memory_reports_what_it_holds(rng):
    """``Model.memory()``: its layers' packed filters and biases (``Conv2d.nbytes``), the
    values' arena, the programs' workspaces and input copies, by kind, and their total."""
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    layers = [step.run.conv for step in loaded.steps if getattr(step.run, "conv", None)]
    assert len(layers) == 5
    held = loaded.memory()
    assert held["weights"] == sum(layer.nbytes for layer in layers)
    assert held["values"] == loaded._arena.nbytes > 0
    assert held["programs"] == 1 and held["inputs"] == 3 * 10 * 12 * 4
    assert held["total"] == sum(held[kind] for kind in ("weights", "values", "workspaces",
                                                        "inputs"))
    for _ in range(2):   # planned, then recorded
        loaded(rng.standard_normal((4, 3, 10, 12)).astype(np.float32))
    more = loaded.memory()   # the arena grew for batch 4, batch 1's program went with it
    assert more["programs"] == 1 and more["inputs"] == 4 * 3 * 10 * 12 * 4
    assert more["weights"] == held["weights"] and more["values"] > held["values"]
    loaded(rng.standard_normal((1, 3, 10, 12)).astype(np.float32))   # recorded again
    again = loaded.memory()
    assert again["programs"] == 2 and again["inputs"] == 5 * 3 * 10 * 12 * 4
    assert again["values"] == more["values"]


def test_conv2d_nbytes_counts_each_packing_it_holds(rng):
    """A layer holds its filters packed (once per filter tile its plans read) and its bias;
    nothing per call."""
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    conv = cso.Conv2d(w, np.zeros(64, np.float32), padding=1)
    first = conv.nbytes
    assert first >= w.nbytes + 64 * 4
    x = rng.standard_normal((1, 32, 12, 12)).astype(np.float32)
    for _ in range(3):
        conv(x)
    assert conv.nbytes == first + sum(
        packed.nbytes for key, packed in conv._packed.items() if key != next(iter(conv._packed)))


def test_a_large_classifier_holds_its_filters_once(rng):
    """A 1x1 on one pixel whose filters are more than L2 holds (a classifier at batch 1) takes
    the filter tile of its plans of a few pixels (batch 8; filters in vectors, as a
    classifier's 1000-4096 filters have them on AVX-512 and AVX2, forced here for any ISA):
    one packing of its filters for both, where a small one keeps its wider one-pixel tile
    (up to four vectors)."""
    machine = cso.host_machine()
    lanes = machine.vector_bytes // 4
    k = 4 * lanes
    c = machine.l2 // (k * 4) + lanes
    conv = cso.Conv2d(rng.standard_normal((k, c, 1, 1)).astype(np.float32),
                      input_shape=(1, c, 1, 1), plan_overrides={"vectors_along": "filters"})
    for m in (1, 8):
        x = rng.standard_normal((1, c, m, 1)).astype(np.float32)
        np.testing.assert_allclose(conv(x)[0, :, :, 0], _gemm(conv, x), rtol=1e-4, atol=1e-3)
    assert len(conv._packed) == 1
    assert conv.plan_for((1, c, 1, 1)).nf == conv.plan_for((1, c, 8, 1)).nf
    small = cso.Conv2d(rng.standard_normal((k, 16, 1, 1)).astype(np.float32),
                       input_shape=(1, 16, 1, 1))
    wide = min(4, (machine.vector_registers - 1) // 2) * lanes
    assert small.plan_for((1, 16, 1, 1)).nf == wide


def _gemm(conv, x):
    """The reference of a 1x1 ``conv`` on the column image ``x``: its filters times the
    pixels, in float64."""
    from packing import unpack_filters
    weight = unpack_filters(next(iter(conv._packed.values())), conv.weight_shape[0])
    return weight[:, :, 0, 0].astype(np.float64) @ x[0, :, :, 0].astype(np.float64)
