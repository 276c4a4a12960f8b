"""Extra memory: what a call allocates at its peak beyond its input and output, for cso and
for im2col + GEMM, on one large convolution. Traced with ``tracemalloc``, which sees every
NumPy allocation (cso's workspaces included); onnxruntime's arena is invisible to it, so it is
not measured."""
import threading
import tracemalloc

import numpy as np

from csa import ConvSpec

from .engines import cso_engine, im2col_engine

MEMORY_SPEC = ConvSpec(1, 256, 112, 112, 256, 3, 3, padding=(1, 1, 1, 1))


def peak_extra(run, x):
    """(peak bytes allocated during ``run(x)`` beyond the output it returns, that output). The
    traced call runs on a new thread: cso keeps a thread's workspaces from one call to the
    next (shared by every layer the thread runs), which a thread's first call makes."""
    run(x)   # compiled, planned and packed before tracing
    found = []
    thread = threading.Thread(target=lambda: found.append(run(x)))   # (made before tracing)
    tracemalloc.start()
    try:
        thread.start()
        thread.join()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if not found:
        raise RuntimeError("peak_extra: the traced call raised (see the thread's traceback)")
    return max(0, peak - found[0].nbytes), found[0]


def measure_memory(threads, spec=MEMORY_SPEC):
    """{"spec", "output_bytes", "cso_bytes", "im2col_bytes"}: the peak extra bytes of a call."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(spec.input_shape, np.float32)
    w = rng.standard_normal(spec.weight_shape, np.float32)
    return {"spec": str(spec), "output_bytes": int(np.prod(spec.output_shape)) * 4,
            "cso_bytes": peak_extra(cso_engine(spec, w, threads), x)[0],
            "im2col_bytes": peak_extra(im2col_engine(spec, w, threads), x)[0]}


def memory_lines(memory):
    mb = 1 / 2 ** 20
    return [f"{memory['spec']} (output {memory['output_bytes'] * mb:.1f} MiB): peak memory "
            f"beyond the output, cso {memory['cso_bytes'] * mb:.2f} MiB (its workspace, which a "
            f"thread keeps for its next calls), im2col "
            f"{memory['im2col_bytes'] * mb:.1f} MiB (its column matrix and padded copy)"]
