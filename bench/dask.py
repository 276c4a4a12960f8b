"""``python -m bench --dask``: images/s of a layer and of a model over a batch, cso in this
process on W threads against ``cso.dask`` on a LocalCluster of W worker processes with one thread
each (W = 2 by default).

The batch is made on the workers and kept there (a cluster's job reads its images where it
runs); the cluster's time is that of a computation, from the graph sent to the outputs gathered
in this process, after a warm-up computation (each worker packs the layer and loads its kernels
once). Its output is checked against this process's first: the same bits. The layer,
ResNet-50's 3x3 convolution at 56 x 56, gives 800 KB of output per image, which the cluster
sends back; the model, SqueezeNet (when onnx is installed), 4 KB.
"""
import numpy as np

from .measure import median_seconds, settle_seconds
from .models import bench_model

BATCH = 32
CHUNK = 4   # images per task
LAYER = (64, 56, 64, 3)   # channels, height and width, filters, kernel size (padding 1)
MODEL = "squeezenet"
HEADER = ["workload", "one process img/s", "LocalCluster img/s", "cluster / one"]


def workloads():
    """[(name, a Conv2d or a cso.onnx.Model, one image's shape)]: the layer, and the model when
    onnx is installed."""
    import importlib.util

    import cso
    channels, size, filters, kernel = LAYER
    weight = np.random.default_rng(0).standard_normal((filters, channels, kernel, kernel),
                                                      dtype=np.float32)
    found = [(f"conv {channels}x{size}x{size} -> {filters}, {kernel}x{kernel}",
              cso.Conv2d(weight, padding=kernel // 2), (channels, size, size))]
    if all(importlib.util.find_spec(m) for m in ("onnx", "threadpoolctl")):
        import cso.onnx
        model = cso.onnx.load(bench_model(MODEL))
        ((shape, _),) = model.inputs.values()
        found.append((MODEL, model, shape[1:]))
    return found


def measure(workers, repeat):
    """[{"workload", "one", "cluster"}]: images/s of each workload in this process on
    ``workers`` threads and on a LocalCluster of ``workers`` processes x 1 thread."""
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import cso
    import cso.dask
    cso.set_num_threads(workers)
    results = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster):
        for name, layer, image in workloads():
            chunks = (CHUNK,) + (-1,) * len(image)   # along the batch only
            x = da.random.default_rng(0).standard_normal((BATCH, *image), chunks=chunks,
                                                         dtype=np.float32).persist()
            wait(x)
            local = x.compute()
            y = cso.dask.apply(layer, x)
            if not np.array_equal(y.compute(), layer(local)):
                raise AssertionError(f"cso.dask on the cluster differs from cso in one process "
                                     f"on {name}")
            seconds = median_seconds({"one": lambda: layer(local), "cluster": y.compute},
                                     repeat, settle_seconds(workers))
            results.append({"workload": name, **{k: BATCH / s for k, s in seconds.items()}})
    return results


def rows(results):
    return [[r["workload"], f"{r['one']:.1f}", f"{r['cluster']:.1f}",
             f"{r['cluster'] / r['one']:.2f}x"] for r in results]
