"""Thread scaling: each engine on 1 and N threads, in a process of its own.

Engines that share a process distort each other's threaded timings: onnxruntime's and
OpenBLAS's workers keep spinning for milliseconds after a call (OpenBLAS's for about 0.1 s), on
the cores the next engine wants. So ``python -m bench --threads N --scaling`` runs
``python -m bench.scaling`` once per engine; that child times its engine on 1 and on N
threads, in blocks (``median_seconds``, a rest before each for the other count's pool to stop
spinning), then each call after a 50 ms rest (a pool whose spin is shorter asleep by then), and
prints one JSON line per convolution. The parent prints the table: GFLOP/s on 1 and N threads,
the scaling factor, and cso's ratio to each other engine on N threads; and each engine's time
after a pause over its back-to-back time.

im2col is left out: OpenBLAS fixes its thread count when NumPy loads, so one process cannot
time it on two thread counts.
"""
import argparse
import json
import os
import subprocess
import sys

import csa

from .engines import ENGINES, Unsupported, as_nchw, check, fed, reference
from .measure import median_seconds, operands, settle_seconds
from .models import PAUSE_SECONDS, median_call_seconds

SCALING_ENGINES = ("cso", "onnxruntime", "torch", "xnnpack")


def _thread_setter(engine):
    """How ``engine``'s thread count is set per call, where it is a process-wide setting."""
    if engine == "cso":
        import cso
        return cso.set_num_threads
    if engine == "torch":
        import torch
        return torch.set_num_threads
    return None   # onnxruntime, XNNPACK: each session or interpreter keeps its own


def measure_scaling(spec, engine, threads, repeat):
    """``engine`` on ``spec`` with 1 and ``threads`` threads: both outputs checked against the
    float64 reference, then timed in blocks; then at each count, the median of ``repeat``
    calls each after PAUSE_SECONDS of rest, over the back-to-back time ("paused_x"). The
    engine is fed its own layout; one that refuses the convolution gives no figures
    ("unsupported")."""
    x, w = operands(spec)
    ref = reference(spec, x, w)
    set_threads = _thread_setter(engine)
    given = fed(engine, x)
    runs = {}
    for count in (1, threads):
        try:
            run = ENGINES[engine](spec, w, count)
        except Unsupported as reason:
            return {"spec": str(spec), "gflop": spec.flops / 1e9, "unsupported": str(reason)}

        def call(run=run, count=count):
            if set_threads is not None:
                set_threads(count)
            return run(given)

        check(f"{engine} on {count} thread(s)", spec, as_nchw(engine, call()), ref)
        runs[count] = call
    seconds = median_seconds(runs, repeat, settle_seconds(threads))
    paused = {count: median_call_seconds(run, repeat, PAUSE_SECONDS)
              for count, run in runs.items()}
    return {"spec": str(spec), "gflop": spec.flops / 1e9,
            "gflops": {str(count): spec.flops / s / 1e9 for count, s in seconds.items()},
            "paused_x": {str(count): paused[count] / seconds[count] for count in runs}}


def run_children(specs, engines, threads, repeat):
    """{engine: [measure_scaling results]}, each engine measured by a child process."""
    results = {}
    for engine in engines:
        print(f"{engine}: 1 and {threads} threads, in a process of its own", flush=True)
        command = [sys.executable, "-m", "bench.scaling", "--engine", engine,
                   "--threads", str(threads), "--repeat", str(repeat)] + [str(s) for s in specs]
        # one BLAS thread: the float64 reference's BLAS workers would spin on the cores the
        # timed calls want for about 0.1 s after it
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, env=env)
        results[engine] = [json.loads(line) for line in done.stdout.splitlines() if line]
    return results


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    parser.add_argument("--engine", choices=SCALING_ENGINES, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("specs", nargs="+", help="convolutions, e.g. n1c64h56w56k64r3s3p1u1")
    opts = parser.parse_args()
    for text in opts.specs:
        result = measure_scaling(csa.ConvSpec.parse(text), opts.engine, opts.threads, opts.repeat)
        print(json.dumps(result), flush=True)
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
