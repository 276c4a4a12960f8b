"""cso.onnx.kernels in cso's persistent cache: numba compiles a kernel once and its object code
is saved; a later process loads it with llvmlite, without setting up numba's compiler (whose
CPU target took about 0.35 s of every model load), and computes exactly what numba's code
computed; an entry whose symbols do not resolve is not loaded (numba compiles instead); and a
model loads on a warm cache without numba's compiler."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .children import CHILD_CWD

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="numba's object code is kept on ELF hosts only")

# Every kernel on edge geometries (windows over the padding, int8 and float64 pools, LRN with
# the square-root exponent and with pow, the exp of softmax), on two threads; saves the
# outputs and prints the kernels' code kinds, the cache's events and whether numba's compiler
# was set up (its target context imports numba.np.linalg when it first compiles or loads).
EVERY_KERNEL = r"""
import collections, json, sys
import numpy as np
import cso
from cso.onnx import kernels
from microkernels import cache

compiled, parts = kernels._compiled, {}


def recording(maker, *key):   # every kernel the calls below take, with its code
    part = parts[repr((maker.__name__,) + key)] = compiled(maker, *key)
    return part


kernels._compiled = recording
cso.set_num_threads(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 5, 13, 11)).astype(np.float32)
outputs = {}
for dtype in (np.float32, np.float64, np.int8):
    xd = (x * 40).astype(dtype)
    out = np.empty((2, 5, 7, 6), dtype)
    outputs[f"max_{np.dtype(dtype).name}"] = kernels.pool(
        "max", xd, out, (3, 3), (2, 2), (1, 1), (1, 1), None, 2)
for dtype in (np.float32, np.float64):
    out = np.empty((2, 5, 12, 13), dtype)
    outputs[f"average_{np.dtype(dtype).name}"] = kernels.pool(
        "average", x.astype(dtype), out, (2, 3), (1, 1), (1, 1), (0, 2), ((0, 13), (0, 11)), 2)
for beta in (0.75, 0.6):
    outputs[f"lrn_{beta}"] = kernels.lrn(x, np.empty_like(x), 5, 1e-4, beta, 1.0, 2)
scale, shift = rng.standard_normal(5).astype(np.float32), np.ones(5, np.float32)
outputs["affine"] = kernels.affine(x, np.empty_like(x), scale, shift, True, 2)
outputs["copy"] = kernels.copy(x, np.empty_like(x), 2)
outputs["softmax"] = kernels.softmax(x, np.empty_like(x), 2)
outputs["transpose"] = kernels.transpose(x.reshape(10, 143), np.empty((143, 10), np.float32), 2)
outputs["permute"] = kernels.permute(x, np.empty((2, 13, 5, 11), np.float32), (0, 2, 1, 3), 2)
outputs["add"] = kernels.add(x, x, np.empty_like(x), 2)
for kind in ("max", "average", "sum"):
    outputs[f"global_{kind}"] = kernels.global_pool(kind, x, np.empty((2, 5, 1, 1), np.float32), 2)
rows = rng.standard_normal(11), rng.standard_normal(11)
outputs["layer_norm"] = kernels.layer_norm(x, np.empty_like(x), *rows, 1e-5, 2)
np.savez(sys.argv[1], **outputs)
kinds = collections.Counter(type(part.code).__name__ for part in parts.values())
print(json.dumps(dict(cache.stats(), numba_compiler="numba.np.linalg" in sys.modules,
                      kinds=kinds, kernels=len(parts))))
"""


def run(child, tmp_path, *args):
    env = dict(os.environ, CSO_CACHE_DIR=str(tmp_path / "cso"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"), CSO_CALIBRATE="0")
    done = subprocess.run([sys.executable, "-c", child, *map(str, args)], cwd=CHILD_CWD,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_process_loads_numba_s_code_from_cso_s_cache(tmp_path):
    """The first process compiles every kernel with numba and saves its object code (numba's
    own disk cache is not used); the second loads each from cso's cache, never sets up
    numba's compiler, and computes the same bits."""
    first = run(EVERY_KERNEL, tmp_path, tmp_path / "first.npz")
    assert first["numba_compiler"] is True
    assert first["kinds"] == {"CFunc": first["kernels"]} and first["kernels"] == 16
    assert first["saved"] >= first["kernels"]
    second = run(EVERY_KERNEL, tmp_path, tmp_path / "second.npz")
    assert second["numba_compiler"] is False
    assert second["kinds"] == {"JitModule": first["kernels"]}
    assert second["misses"] == second["saved"] == second["corrupt"] == 0
    assert second["hits"] == first["saved"]
    assert not list((tmp_path / "numba").rglob("*.nbi"))
    with np.load(tmp_path / "first.npz") as a, np.load(tmp_path / "second.npz") as b:
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        x = np.random.default_rng(0).standard_normal((2, 5, 13, 11)).astype(np.float32)
        softmax = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(b["softmax"], softmax / softmax.sum(-1, keepdims=True),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(b["global_max"][..., 0, 0], x.max(axis=(2, 3)))
        np.testing.assert_array_equal(b["permute"], x.transpose(0, 2, 1, 3))


# "plant": an entry for the softmax kernel whose code takes a symbol no process has; "use":
# the softmax run (checked), then the kernel's code kind and numba's disk cache hits
UNRESOLVED = r"""
import json, sys
import numpy as np
from cso.onnx import kernels
from microkernels import cache
from microkernels.jit import JitModule

key = (kernels._softmax_part, np.dtype(np.float32))
path = cache.native_path(kernels.__name__, key[0].__qualname__, *key[1:], *kernels._code_key())
if sys.argv[1] == "plant":
    module = JitModule('''
        declare void @cso_test_no_such_symbol()
        define void @part(i64* %args, i64 %index) {
          call void @cso_test_no_such_symbol()
          ret void
        }''')
    cache.save_native(path, ("part", module.object_code))
    print(json.dumps({}))
else:
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    out = kernels.softmax(x, np.empty_like(x), 1)
    expected = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, expected / expected.sum(-1, keepdims=True), rtol=1e-6)
    code = kernels._compiled(*key).code
    print(json.dumps(dict(cache.stats(), kind=type(code).__name__,
                          numba_cache_hits=code.cache_hits)))
"""


def test_an_entry_whose_symbols_do_not_resolve_is_not_loaded(tmp_path):
    """A cached kernel whose object code takes a symbol this process does not have is never
    linked (MCJIT would leave its calls at address 0): numba compiles the kernel, through its
    own disk cache from then on, and it computes the right result."""
    run(UNRESOLVED, tmp_path, "plant")
    for hits in (0, 1):
        events = run(UNRESOLVED, tmp_path, "use")
        assert events["kind"] == "CFunc" and events["numba_cache_hits"] == hits


MODEL = r"""
import json, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import cso.onnx

rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1]),
         helper.make_node("GlobalAveragePool", ["p"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("Softmax", ["f"], ["y"], axis=1)]
graph = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 20])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
loaded = cso.onnx.load(model)
y = loaded.run(None, {"x": rng.standard_normal((1, 3, 20, 20)).astype(np.float32)})[0]
np.save(sys.argv[1], y)
print(json.dumps({"numba_compiler": "numba.np.linalg" in sys.modules}))
"""


def test_a_model_loads_on_a_warm_cache_without_numba_s_compiler(tmp_path):
    """A model with a pool, a global pool and a softmax: numba compiles their kernels on an
    empty cache; on the warm cache the next process loads and runs the model without setting
    up numba's compiler, to the same bits."""
    pytest.importorskip("onnx")
    assert run(MODEL, tmp_path, tmp_path / "first.npy") == {"numba_compiler": True}
    assert run(MODEL, tmp_path, tmp_path / "second.npy") == {"numba_compiler": False}
    np.testing.assert_array_equal(np.load(tmp_path / "first.npy"),
                                  np.load(tmp_path / "second.npy"))
