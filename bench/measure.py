"""Timing: the engines side by side, CSA's two schedules, and cso's time breakdown.

Every number is a median over ``repeat`` samples; calls shorter than MIN_SAMPLE_SECONDS are
repeated within a sample so that timer resolution does not dominate. What is compared
(engines, schedules, phases) is timed in blocks: one engine's warm-up and back-to-back samples,
then the next's, never one sample of each in turn (a thread pool that spins on after a call
would sit beside the next engine's timed run); the blocks run twice, in one order and then in
the reverse, so that a machine whose speed drifts over seconds (frequency, neighbours on a
shared host) moves all of them alike and their ratios hold.
"""
import statistics
import time

import numpy as np

import csa
import cso
from cso.loop_nests import PACK, POST

from .engines import ENGINES, Unsupported, as_nchw, check, cso_engine, fed, reference

MIN_SAMPLE_SECONDS = 0.005
# how long other engines' pools spin on after a call (onnxruntime's: tens of ms)
OTHER_POOLS_SPIN_SECONDS = 0.05
SETTLE_MARGIN_SECONDS = 0.02
# after a rest, a block's warm-up runs this long (one call at least): the workers it wakes (any
# engine's) ran the first 5-10 ms slowly, their vCPUs idle until then (Xeon VM, 2 threads:
# 96 -> 192 1x1 at 32 x 32, 2-4 ms samples at 76-84 GFLOP/s after one warm-up call, then
# 200-360; cso's pool before and after its change of 2026-12-06 alike)
REST_WARM_UP_SECONDS = 0.03
COPY = "copy"   # the copy-bandwidth probe timed beside depthwise convolutions


def median_seconds(runs, repeat, settle=0.0):
    """{name: median over ``repeat`` samples of the time of one call ``runs[name]()``}, taken
    in blocks (see the module's docstring): each block ``settle`` seconds of rest (for the
    thread pools that spin on after a call, the last block's or the caller's, to stop), an
    untimed warm-up (one call; after a rest, calls for REST_WARM_UP_SECONDS), then about
    half the samples back to back."""
    calls = {}
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        calls[name] = max(1, int(MIN_SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-7)))
    samples = {name: [] for name in runs}
    halves = (repeat - repeat // 2, repeat // 2)
    for order, count in zip((list(runs), list(runs)[::-1]), halves):
        for name in order:
            run = runs[name]
            time.sleep(settle)
            start = time.perf_counter()
            run()
            while settle and time.perf_counter() - start < REST_WARM_UP_SECONDS:
                run()
            for _ in range(count):
                start = time.perf_counter()
                for _ in range(calls[name]):
                    run()
                samples[name].append((time.perf_counter() - start) / calls[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def settle_seconds(threads):
    """The rest before each block on ``threads`` threads: longer than any engine's pool spins
    on after a call (cso's: ``cso.get_spin()``), so none sits beside the next block; none on
    one thread."""
    if threads <= 1:
        return 0.0
    return max(cso.get_spin(), OTHER_POOLS_SPIN_SECONDS) + SETTLE_MARGIN_SECONDS


def _timed(make):
    start = time.perf_counter()
    made = make()
    return made, time.perf_counter() - start


def operands(spec, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.input_shape, dtype=np.float32),
            rng.standard_normal(spec.weight_shape, dtype=np.float32))


def measure_conv(spec, engines, repeat, threads=1):
    """One convolution: every engine's output checked against the float64 reference, then
    timed; for cso also the one-off costs and the steady-state breakdown."""
    x, w = operands(spec)
    ref = reference(spec, x, w)
    result = {"spec": str(spec), "gflop": spec.flops / 1e9}
    runs, inputs = {}, {}
    for name in engines:
        try:
            run, load = _timed(lambda: ENGINES[name](spec, w, threads))
        except Unsupported as reason:
            result.setdefault("unsupported", {})[name] = str(reason)
            continue
        inputs[name] = fed(name, x)
        out, first = _timed(lambda: run(inputs[name]))
        check(name, spec, as_nchw(name, out), ref)
        runs[name] = run
        if name == "cso":
            result["cso"] = {"load_s": load, "first_call_s": first,
                             "plan": plan_facts(run.plan_for(x.shape))}
    timed = {name: (lambda run=run, x=inputs[name]: run(x)) for name, run in runs.items()}
    depthwise = "cso" in runs and csa.is_depthwise(spec)
    if depthwise:   # a copy of as many bytes, timed beside the engines
        moved = csa.moved_bytes(spec)
        src = np.ones(moved // 2 // x.itemsize, x.dtype)
        dst = np.empty_like(src)
        timed[COPY] = lambda: np.copyto(dst, src)
    seconds = median_seconds(timed, repeat, settle_seconds(threads))
    if depthwise:
        copy = seconds.pop(COPY)
        result["bandwidth"] = {"bytes": moved, "cso_gbs": moved / seconds["cso"] / 1e9,
                               "copy_gbs": 2 * src.nbytes / copy / 1e9}
    if "cso" in runs:
        result["cso"]["breakdown_s"] = breakdown(runs["cso"], x, repeat, seconds["cso"])
    result["seconds"] = seconds
    result["gflops"] = {name: spec.flops / s / 1e9 for name, s in seconds.items()}
    return result


def plan_facts(plan):
    if isinstance(plan, csa.DepthwisePlan):
        return {"kind": "depthwise", "block_vectors": plan.block_vectors, "nc": plan.nc, "band": plan.band}
    source = ("read in place" if plan.reads_input_unpacked else "slab" if plan.slab
              else "packed tiles")
    return {"kind": "slicing", "schedule": plan.schedule, "vectors_along": plan.vectors_along,
            "input": source, "microtile": [plan.nwin, plan.nf],
            "nc": plan.nc, "k2": plan.k2, "k3": plan.k3, "tuned": bool(plan.origin)}


def breakdown(conv, x, repeat, call_seconds):
    """The ``call_seconds`` of a steady-state call split in ConvBench's terms, from runs of some
    loop-nest phases alone on the same tiles: input packing, micro-kernel, post-conv (the
    transposition of a filters-in-vectors output) and the rest (argument checks, buffers, loop
    control)."""
    alone = median_seconds({phases: (lambda phases=phases: conv.call_phases(x, phases))
                            for phases in (0, PACK, POST)}, repeat)
    packing = max(0.0, alone[PACK] - alone[0])
    post = max(0.0, alone[POST] - alone[0])
    return {"packing": packing, "micro-kernel": max(0.0, call_seconds - alone[0] - packing - post),
            "post-conv": post, "other": alone[0]}


def measure_schedules(spec, repeat):
    """GFLOP/s of cso with IS and WS forced, and the schedule CSA picks."""
    x, w = operands(spec)
    chosen = cso_engine(spec, w).plan_for(spec.input_shape).schedule
    runs = {schedule: cso_engine(spec, w, plan_overrides={"schedule": schedule})
            for schedule in ("IS", "WS")}
    seconds = median_seconds({name: (lambda run=run: run(x)) for name, run in runs.items()}, repeat)
    gflops = {name: spec.flops / s / 1e9 for name, s in seconds.items()}
    return {"spec": str(spec), "gflop": spec.flops / 1e9, "chosen": chosen, "gflops": gflops}
