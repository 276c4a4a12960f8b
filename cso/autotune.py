"""Autotuning: time the plans CSA ranks best for a convolution on this host, keep the fastest.

``tune`` (and ``Conv2d(..., tune=True)`` on each new input shape, ``python -m bench --tune``)
times the candidates of ``csa.tuning_candidates`` (the model's plan first, then the other
orientations, schedule, micro-tiles and thread splits) on random data, in ROUNDS interleaved
rounds of about ``budget`` seconds of timed calls in all (compiling is not counted), and keeps
the fastest: the model's plan unless another beats it by more than MARGIN (noise). The result
is saved in the persistent cache, keyed by the CPU, the ISA, the convolution and the thread
count; a later process loads it. A tuned plan's ``explain()`` says so, with the times measured
and the model's prediction.
"""
import time
from dataclasses import replace

import numpy as np

import csa
from microkernels import cache
from microkernels.once import compiled_once
from microkernels import probe
from packing import pack_filters

from . import host
from .calibration import calibration, enabled as calibrated
from .jobs import unrecorded
from .loop_nests import ALL_PHASES
from .prepared import Prepared
from .threads import get_num_threads

BUDGET = 1.0     # seconds of timed calls per convolution
ROUNDS = 3       # each candidate timed once a round, the rounds interleaved: drift hits all
MARGIN = 0.03    # another plan must be this much faster than the model's to be kept
VERSION = 1


@compiled_once
def tuned(spec, isa_name, threads, budget=BUDGET):
    """The tuning record of ``spec`` on ``threads`` threads with ``isa_name`` kernels (a dict:
    ``overrides`` of the plan kept, ``timed`` [{overrides, seconds, predicted}], the model's
    ``model_seconds``, ``seconds`` of the kept plan): loaded from the persistent cache, else
    measured and saved. Once per process and key."""
    path = cache.record_path("tuned", str(spec), isa_name, threads)
    found = cache.load_record(path, VERSION)
    if found is None:
        found = measure(spec, isa_name, threads, budget)
        cache.save_record(path, found)
    return found


def tuned_plan(plan, record):
    """``plan`` (made with ``record``'s overrides) marked as tuned, for ``explain()``."""
    timed = record["timed"]
    predicted = timed[[t["overrides"] for t in timed].index(record["overrides"])]["predicted"]
    bound = f"; the model's compute bound {1e3 * predicted:.3f} ms" if predicted else ""
    kept = record["overrides"] or "none: the model's plan"
    return replace(plan, origin=(
        f"tuned on this host ({record['date']}): the fastest of {len(timed)} plans timed, "
        f"{1e3 * record['seconds']:.3f} ms a call against the model plan's "
        f"{1e3 * record['model_seconds']:.3f} ms{bound}; overrides kept: {kept}"))


@unrecorded
def measure(spec, isa_name, threads, budget):
    """Time each candidate plan of ``spec`` and choose (see the module's docstring)."""
    candidates = csa.tuning_candidates(spec, host.host_machine(isa_name), threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(spec.input_shape).astype(spec.dtype)
    w = rng.standard_normal(spec.weight_shape).astype(spec.dtype)
    peak = calibration(isa_name)["fma_gflops"] if calibrated() else None
    runs = []
    bias = np.empty(0, spec.dtype)
    for _, plan in candidates:   # each run as a Conv2d of its overrides would
        prepared = Prepared(plan, 0, isa_name)
        packed = pack_filters(w, plan.nf, spec.groups)
        out = np.empty(spec.output_shape, spec.dtype)
        runs.append(lambda p=prepared, packed=packed, out=out:
                    p.run(x, packed, bias, out, ALL_PHASES, threads))
    for run in runs:   # compiles (or loads) each plan's code: not timed
        run()
    first = [probe.seconds(run) for run in runs]
    calls = [max(1, int(budget / ROUNDS / len(runs) / max(f, 1e-6))) for f in first]
    best = [float("inf")] * len(runs)
    for _ in range(ROUNDS):
        for i, run in enumerate(runs):
            best[i] = min(best[i], probe.seconds(run, calls[i]) / calls[i])
    timed = [{"overrides": _plain(overrides), "seconds": seconds,
              "predicted": plan.compute_bound(peak) if peak else None}
             for (overrides, plan), seconds in zip(candidates, best)]
    kept = choose(best)
    return {"version": VERSION, "spec": str(spec), "isa": isa_name, "threads": threads,
            "date": time.strftime("%Y-%m-%d"), "overrides": timed[kept]["overrides"],
            "seconds": best[kept], "model_seconds": best[0], "timed": timed}


def choose(seconds):
    """The index of the plan kept among those timed at ``seconds`` a call, the model's first:
    the fastest when it beats the model's by more than MARGIN, else the model's."""
    fastest = min(range(len(seconds)), key=seconds.__getitem__)
    return fastest if seconds[fastest] < (1 - MARGIN) * seconds[0] else 0


def _plain(overrides):
    """Overrides as JSON keeps them (tuples as lists), so that a loaded record compares equal."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()}


def tune(convolutions, isa=None, budget=BUDGET):
    """Tune each of ``convolutions`` (``csa.ConvSpec`` or their names, as for ``cso.warmup``)
    for ``get_num_threads()`` threads, or load its earlier result: ``Conv2d(..., tune=True)``
    then runs the plan kept. Returns [(spec, record)] (see ``tuned``)."""
    isa_name, threads = host.check_isa(isa), get_num_threads()
    return [(spec, tuned(spec, isa_name, threads, budget))
            for spec in (host.as_spec(c, "tune") for c in convolutions)]
