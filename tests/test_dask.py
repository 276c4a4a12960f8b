"""cso.dask on Dask's local threads and on a LocalCluster of two worker processes (one thread
each): the same bits as one process, one packing per layer per worker, a killed worker's chunks
retried, and the errors."""
import os
import subprocess
import sys

import numpy as np
import pytest

import cso

from .children import CHILD_CWD
from .layers import conv_case, images, light_model

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
import cso.dask  # noqa: E402

# seconds a computation on the cluster may take before the test fails: the killed worker's
# takes about 1 s, but once took 30 s here (in distributed's recovery; not understood)
TIMEOUT = 120


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster, set_as_default=False) as client:
            yield client


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("onnx")
    return light_model()


# (x's shape, its chunks, Conv2d case)
DASK_CASES = [
    ((7, 13, 9, 11), (3, -1, -1, -1), "plain"),
    ((6, 13, 9, 11), (2, 5, 4, 6), "bias_relu_same"),        # every axis chunked: rechunked
    ((5, 13, 10, 12), (1, -1, 5, -1), "strided_asymmetric"),
    ((4, 13, 9, 11), (4, 7, -1, -1), "grouped_input_shape"),
]


@pytest.mark.parametrize("shape, chunks, case", DASK_CASES)
def test_dask_conv2d_matches_cso_on_local_threads(rng, shape, chunks, case):
    weight, bias, kwargs = conv_case(rng, case)
    kwargs.pop("input_shape", None)
    x = images(rng, shape)
    y = cso.dask.conv2d(da.from_array(x, chunks=chunks), weight, bias, **kwargs)
    expected = cso.conv2d(x, weight, bias, **kwargs)
    assert y.chunks[0] == da.from_array(x, chunks=chunks).chunks[0]
    assert (y.shape, y.dtype) == (expected.shape, expected.dtype)
    assert np.array_equal(y.compute(scheduler="threads"), expected)


def test_dask_conv2d_on_cluster(rng, client):
    weight, bias, kwargs = conv_case(rng, "strided_asymmetric")
    x = images(rng, (6, 13, 10, 12))
    y = cso.dask.conv2d(da.from_array(x, chunks=(2, 7, 5, 12)), weight, bias, **kwargs)
    assert np.array_equal(client.compute(y).result(timeout=TIMEOUT),
                          cso.conv2d(x, weight, bias, **kwargs))


def test_apply_packs_a_layer_once_per_worker(rng, client):
    weight, bias, kwargs = conv_case(rng, "bias_relu_same")
    conv = cso.Conv2d(weight, bias, **kwargs)
    x = images(rng, (16, 13, 9, 11))
    threads = cso.get_num_threads()
    workers = list(client.scheduler_info()["workers"])
    # on each worker alone, then on both: later computations find the layer packed (each
    # computation with keys of its own, not the results of the one before)
    for where in [[address] for address in workers] + [None]:
        y = cso.dask.apply(conv, da.from_array(x, chunks=(2, -1, -1, -1), name=False))
        assert np.array_equal(client.compute(y, workers=where).result(timeout=TIMEOUT), conv(x))
    token = cso.dask.token(conv)
    assert client.run(lambda: cso.dask.unpickled[token]) == {address: 1 for address in workers}
    # cso ran on the workers' one thread each, and the client's setting is its own
    assert set(client.run(cso.get_num_threads).values()) == {1}
    assert cso.get_num_threads() == threads


def test_apply_model_on_cluster(rng, client, model):
    x = images(rng, (4, 3, 224, 224))
    y = cso.dask.apply(model, da.from_array(x, chunks=(2, -1, -1, -1)))
    assert (y.shape, y.chunks[0]) == ((4, 1000, 1, 1), (2, 2))
    assert np.array_equal(client.compute(y).result(timeout=TIMEOUT), model(x))


def test_apply_model_on_local_threads(rng, model):
    x = images(rng, (3, 3, 224, 224))
    y = cso.dask.apply(model, da.from_array(x, chunks=(1, 3, 100, 224)))
    assert np.array_equal(y.compute(scheduler="threads"), model(x))


def test_a_killed_worker_is_retried(rng, client, tmp_path):
    conv = cso.Conv2d(*conv_case(rng, "plain")[:2], padding=1)
    x = images(rng, (8, 13, 9, 11))
    marker = tmp_path / "killed"

    def kill_once(block, block_info=None):   # the worker running chunk 2 dies, the first time
        if block_info[0]["chunk-location"][0] == 2 and not marker.exists():
            marker.touch()
            os._exit(1)
        return block

    chunks = da.from_array(x, chunks=(2, -1, -1, -1)).map_blocks(kill_once, dtype=x.dtype)
    y = client.compute(cso.dask.apply(conv, chunks)).result(timeout=TIMEOUT)
    assert marker.exists()
    assert np.array_equal(y, conv(x))


def test_bench_dask_quick_run():
    pytest.importorskip("onnx")   # the model row
    done = subprocess.run([sys.executable, "-m", "bench", "--dask", "--quick"], cwd=CHILD_CWD,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("workload"):].splitlines()
    assert table[0].split()[1:4] == ["one", "process", "img/s"] and len(table) == 3
    assert table[1].startswith("conv 64x56x56") and table[2].startswith("squeezenet")
    assert all(row.endswith("x") for row in table[1:])


def test_errors(rng, model):
    weight = images(rng, (4, 3, 3, 3))
    x = images(rng, (2, 3, 8, 8))
    with pytest.raises(TypeError, match="x must be a dask array .* got ndarray"):
        cso.dask.conv2d(x, weight)
    with pytest.raises(ValueError, match=r"x must be 4-D \(N, C, H, W\).* shape \(3, 8, 8\)"):
        cso.dask.conv2d(da.from_array(x[0]), weight)
    with pytest.raises(ValueError, match=r"expected input with 3 channels .* shape \(2, 5, 8, 8\)"):
        cso.dask.conv2d(da.zeros((2, 5, 8, 8), dtype=np.float32), weight)
    with pytest.raises(TypeError, match="input dtype float64 differs from weight dtype float32"):
        cso.dask.conv2d(da.from_array(x.astype(np.float64)), weight)
    with pytest.raises(ValueError, match="groups=3 must divide the 4 filters"):
        cso.dask.conv2d(da.from_array(x), images(rng, (4, 3, 3, 3)), groups=3)
    with pytest.raises(ValueError, match="accumulate=True"):
        cso.dask.apply(cso.Conv2d(weight, accumulate=True), da.from_array(x))
    with pytest.raises(TypeError, match="layer must be a cso.Conv2d or a cso.onnx.Model, got "
                                        "ufunc"):
        cso.dask.apply(np.negative, da.from_array(x))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, 3, 224, 224\) and dtype "
                                         r"float32 .* got x of shape \(2, 3, 8, 8\)"):
        cso.dask.apply(model, da.from_array(x))
