"""Host calibration: what no model knows about this CPU, measured once and kept.

The first plan made for a kernel ISA on a CPU measures, in about 1-2 s:

- the FMA peak (independent chains) and the FMA latency (one chain): their ratio is the FMAs
  a tile must keep in flight (latency x pipes), which the register-blocking model uses;
- the time a second part takes to hand to an awake pool worker (``handoff``), from which the
  least work worth a second thread and a part of its own follow (``THREAD_HANDOFFS`` and
  ``PART_HANDOFFS`` hand-offs of work at the peak: ``Tuning.thread_min_flops`` and
  ``part_min_flops``);
- the speed of each candidate micro-tile in each kernel variant
  (``csa.register_blocking.calibration_candidates``: the tiles the rules pick from the model
  and their neighbours), as a fraction of that peak, the tiles measured in turn (a run of
  each a round): the rules then choose only among tiles measured fast; a measurement in which
  a variant has no tile within ``PLAUSIBLE`` of the peak, or a tile runs past ``CEILING`` of
  it (a slow spell on the tiles, or on the probes) is made again, at most ``RETRIES`` more
  times, each rate's best kept;

What plans do not read is measured only when asked for (``host_facts``: the benchmark report,
``python -m cso calibration``), not on a first plan: the read bandwidth of each cache level and
of memory, and the cost of handing parts to the pool's workers, awake (back-to-back calls) and
asleep, for reading the benchmark figures (the cost model's weights and the thread thresholds
stay the record's, which were measured on whole convolutions).

Both records are saved in the persistent cache (``microkernels.cache``), keyed by the CPU's
name, its features and the ISA; later processes load them. ``CSO_CALIBRATE=0`` plans from the
tuning record alone. ``python -m cso calibration`` prints them (``--again``: measure anew).
"""
import os
import platform
import time
from dataclasses import replace

import llvmlite.binding as llvm
import numpy as np

import csa
from csa.register_blocking import TILE_VECTORS, calibration_candidates
from microkernels import KernelSpec, get_isa
from microkernels import cache
from microkernels.isa import masked_fma
from microkernels.jit import JitModule
from microkernels.once import compiled_once
from microkernels import probe

from .jobs import run_parts, unrecorded
from .cpus import available_cpus
from .threads import get_spin

ENV_VAR = "CSO_CALIBRATE"
VERSION = 5                 # of the record (its layout, or how it is measured: 3 kept the tiles'
                            # best runs): a record of another version is measured anew
FACTS_VERSION = 1           # of host_facts' layout
TRIAL_FLOPS = 2e8           # per timed run of a micro-kernel (about 2 ms at 100 GFLOP/s)
TRIALS = 5                  # rounds at least: a calibration must not keep one disturbed run
TILE_SECONDS = 0.4          # at least, for the tiles' rounds: longer than most disturbances
PLAUSIBLE = 0.9             # each kernel variant's fastest tile reaches this share of the peak
                            # (94% or more in every calm calibration on Zen 3, AVX2 and generic)
CEILING = 1.15              # of the peak, at most, for any tile: a kernel with loads does not
                            # outrun the probe's independent chains (calm records: up to 1.04);
                            # above it the probe ran in a slow spell (a Xeon VM kept an AVX2
                            # record of a peak at half its own, tiles at 0.35-2.05 of it)
RETRIES = 2                 # measurements more, at most, of a record where a kernel variant's
                            # fastest tile does not reach PLAUSIBLE, or a tile passes CEILING
HANDOFF_CALLS, HANDOFF_ROUNDS, SLEEPS = 400, 5, 12
# work worth a second thread, in hand-offs: Zen 3 measured 1 MFLOP on whole convolutions
# (csa/TUNING.md), 43 of its 0.23 us hand-offs at 102 GFLOP/s
THREAD_HANDOFFS = 40
PART_HANDOFFS = 50          # a part's work, in hand-offs: handing it over costs 2% of it
HANDOFF_RANGE = 4           # the factor a calibration may move the record's values by
SLEEP_AFTER_SPIN = 0.005    # seconds beyond the workers' spin window: they sleep then
NOOP_PART = "define void @noop(ptr %args, i64 %part) {\n  ret void\n}\n"


def enabled():
    return os.environ.get(ENV_VAR, "1").strip() not in ("0", "no", "off", "false")


def model_machine(isa_name):
    """The machine CSA plans for from the model alone: the host's caches, the vector facts of
    kernel ISA ``isa_name`` and its tuning record; its groups merged onto blocks on planes up
    to ``blended_merge_max_plane`` only where the host's FMAs take no lane mask at no cost
    (``microkernels.isa.masked_fma``): a merged kernel's blend after each FMA halved its speed
    (csa/TUNING.md, "Groups merged onto blocks: masked FMAs")."""
    isa = get_isa(isa_name)
    tuning = csa.tuning.record(isa_name)
    if not masked_fma():
        tuning = replace(tuning, merged_groups_max_plane=min(tuning.merged_groups_max_plane,
                                                             tuning.blended_merge_max_plane))
    return csa.Machine.host(vector_bytes=isa.vector_bytes, vector_registers=isa.vector_registers,
                            tuning=tuning)


def calibrated_machine(isa_name):
    """``model_machine`` with its tuning record corrected by this host's calibration, unless
    calibration is off."""
    machine = model_machine(isa_name)
    if not enabled():
        return machine
    found = calibration(isa_name)
    speeds = [(variant, TILE_VECTORS, int(b), speed)
              for variant, tiles in found["kernels"].items() for b, speed in tiles.items()]
    return machine.with_(tuning=machine.tuning.calibrated(
        found["fma_in_flight"], sorted(speeds), f"{found['cpu']}, calibrated {found['date']}",
        handoffs_work(found, THREAD_HANDOFFS, machine.tuning.thread_min_flops, highest=1),
        handoffs_work(found, PART_HANDOFFS, machine.tuning.part_min_flops)))


def handoffs_work(record, handoffs, recorded, highest=HANDOFF_RANGE):
    """The work (FLOP) of ``handoffs`` hand-offs to an awake worker at the FMA peak, by
    calibration ``record``, from a HANDOFF_RANGE-th of the tuning record's value ``recorded``
    to ``highest`` times it (on a VM, some processes measured every hand-off 10x slower than
    the others, and a calibration is kept); None on one CPU. The work worth a thread is never
    raised (``highest`` 1): slow hand-offs cost each part, but do not keep a second thread
    from paying off on small layers (csa/TUNING.md, "Host calibration")."""
    handoff_us = record["handoff_us"]
    if handoff_us is None:
        return None
    derived = handoffs * handoff_us * 1e-6 * record["fma_gflops"] * 1e9
    return min(max(derived, recorded / HANDOFF_RANGE), recorded * highest)


@compiled_once
def calibration(isa_name, again=False):
    """This host's calibration record for kernels of ``isa_name`` (a dict; see ``measure``):
    loaded from the persistent cache, else (or ``again``) measured and saved. Once per
    process and ISA."""
    return _record("calibration", VERSION, measure, isa_name, again)


@compiled_once
def host_facts(isa_name, again=False):
    """This host's facts beside the calibration, which plans do not read (a dict; see
    ``measure_facts``): loaded from the persistent cache, else (or ``again``) measured and
    saved. Once per process and ISA."""
    return _record("host_facts", FACTS_VERSION, measure_facts, isa_name, again)


def _record(kind, version, measure_record, isa_name, again):
    path = cache.record_path(kind, isa_name)
    found = None if again else cache.load_record(path, version)
    if found is None:
        found = measure_record(model_machine(isa_name), isa_name)
        cache.save_record(path, found)
    return found


@unrecorded
def measure(machine, isa_name):
    """Measure what the record holds: ``fma_gflops`` (one core), ``fma_in_flight``,
    ``kernels`` {kernel variant: {broadcasts: fraction of the FMA peak}}, ``handoff_us`` (to
    an awake worker; None on one CPU), with the CPU, ISA, date and seconds taken."""
    start = time.perf_counter()
    isa = get_isa(isa_name)
    candidates = calibration_candidates(machine)
    runs = {}
    for variant, counts in candidates.items():
        for b in counts:
            spec = KernelSpec("f32", b, TILE_VECTORS * isa.lanes(4), isa_name, variant)
            runs[variant, b] = probe.kernel_run(spec, _tile_calls(spec))
    best = _rates(runs, isa)
    for _ in range(RETRIES):
        if _plausible(best, candidates):
            break
        # a variant with no tile near the peak: a slow spell took the tiles' runs and not the
        # probes' (a VM kept a record of tiles at 67-90% of a peak itself 20% low), or a tile
        # past it: the probes' runs and not the tiles'; each rate's best of both
        again = _rates(runs, isa)
        best = {key: max(rate, again[key]) for key, rate in best.items()}
    peak, chain = best.pop("peak"), best.pop("chain")
    kernels = {variant: {b: round(best[variant, b] / peak, 3) for b in counts}
               for variant, counts in candidates.items()}
    return {
        "version": VERSION, "cpu": cpu_name(), "isa": isa_name,
        "date": time.strftime("%Y-%m-%d"), "fma_gflops": round(peak, 1),
        "fma_in_flight": max(1, round(peak / chain)), "kernels": kernels,
        "handoff_us": awake_handoff(),
        "seconds": round(time.perf_counter() - start, 2)}


@unrecorded
def measure_facts(machine, isa_name):
    """``read_gbs`` {cache level: GB/s}, ``handoff_us`` {"awake", "asleep": extra
    microseconds of a call split into two parts on two threads; None on one CPU}, with the
    CPU, ISA, date and seconds taken."""
    start = time.perf_counter()
    return {"version": FACTS_VERSION, "cpu": cpu_name(), "isa": isa_name,
            "date": time.strftime("%Y-%m-%d"),
            "read_gbs": read_bandwidth(machine, get_isa(isa_name)),
            "handoff_us": handoff(),
            "seconds": round(time.perf_counter() - start, 2)}


def _plausible(best, candidates):
    """Whether rates ``best`` (``_rates``) make a record: each kernel variant's fastest tile
    at PLAUSIBLE of the peak or more, no tile past CEILING of it."""
    peak = best["peak"]
    rates = [[best[variant, b] for b in counts] for variant, counts in candidates.items()]
    return (min(map(max, rates)) >= PLAUSIBLE * peak
            and max(map(max, rates)) <= CEILING * peak)


def _rates(runs, isa):
    """{key: rate}: of the tiles' ``runs``, in turn, a run of each a round, for at least
    TILE_SECONDS (a disturbance or the core's first, slower, milliseconds then slow every
    tile's runs alike, or some rounds only, where back to back they took all the runs of the
    tiles measured first and dropped those tiles from the plans: csa/TUNING.md, "Host
    calibration"), each tile's rate the best any tile ran at times the median over the
    rounds of its rate over the round's fastest (``_against_the_best``): one run in a fast
    moment does not set a tile apart from the others; then of the FMA probes, "peak"
    (independent chains) and "chain" (one chain: the latency), in turn too (their ratio, the
    FMAs in flight, then does not take one probe's slow spell: a Xeon VM measured 5 for 8),
    after the tiles (the core up to speed) and apart (a tile run just after the peak probe's
    long burst of FMAs measured up to 30% slow)."""
    best = _against_the_best(probe.rates_by_round(runs, TRIALS, TILE_SECONDS))
    probes = probe.rates_by_round({"peak": probe.fma_probe(1 << 24, isa)[0],
                                   "chain": probe.fma_probe(1 << 22, isa, chains=1)[0]}, TRIALS)
    best.update(_against_the_best(probes))
    return best


def _against_the_best(rounds):
    """{key: the best rate of any key, times the median over the rounds of the key's rate
    over the round's best}, for ``rounds`` {key: rates by round}."""
    bests = [max(rates) for rates in zip(*rounds.values())]
    top = max(bests)
    return {key: top * float(np.median([rate / best for rate, best in zip(rates, bests)]))
            for key, rates in rounds.items()}


def _tile_calls(spec):
    """Calls of ``spec``'s micro-kernel in a timed run: about TRIAL_FLOPS."""
    return max(100, int(TRIAL_FLOPS / (2 * probe.UKERNEL_K * spec.broadcasts * spec.width)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or llvm.get_host_cpu_name()


def read_bandwidth(machine, isa):
    """{level: GB/s} of one core reading a buffer of half of L1, L2 and L3 over and over, and
    one of twice L3 (at least 64 MiB): memory."""
    sizes = {"l1": machine.l1d // 2, "l2": machine.l2 // 2, "l3": machine.l3 // 2,
             "memory": max(64 << 20, 2 * machine.l3)}
    return {level: round(probe.read_bandwidth(size, isa), 1) for level, size in sizes.items()}


def awake_handoff():
    """Microseconds a call of two empty parts on two threads takes more than one of a single
    part on one, with the workers spinning (back-to-back calls); None on one CPU."""
    times = _handoff_times()
    return None if times is None else round(max(0.0, times[1] - times[0]), 2)


def handoff():
    """{"awake": ``awake_handoff``, "asleep": the same after the workers went to sleep
    (median)}; None on one CPU."""
    times = _handoff_times()
    if times is None:
        return None
    base, awake = times
    asleep = _median_call_us(2, 2, SLEEPS, get_spin() + SLEEP_AFTER_SPIN) - base
    return {"awake": round(max(0.0, awake - base), 2), "asleep": round(max(0.0, asleep), 1)}


def _handoff_times():
    """(microseconds of a call of one empty part on one thread, of two parts on two threads),
    the least of a few rounds' medians each: right after the worker's start, or in a slow
    spell, whole rounds measured the hand-off at 2.5 us where the others took 0-0.4; None on
    one CPU."""
    if available_cpus() < 2:
        return None
    calls = HANDOFF_CALLS // HANDOFF_ROUNDS
    return tuple(min(_median_call_us(count, count, calls) for _ in range(HANDOFF_ROUNDS))
                 for count in (1, 2))


def _median_call_us(parts, threads, calls, pause=0.0):
    """The median microseconds of ``calls`` calls of ``parts`` empty parts on ``threads``
    threads, each after ``pause`` seconds."""
    noop, args = _noop_part(), np.zeros(1, np.int64)
    times = []
    for _ in range(calls):
        if pause:
            time.sleep(pause)
        times.append(probe.seconds(lambda: run_parts(noop, args.ctypes.data, parts, threads)))
    return 1e6 * float(np.median(times))


@compiled_once
def _noop_part():
    return JitModule(NOOP_PART).address("noop")


def describe(record, facts):
    """The calibration record and the host's ``facts`` as lines of text."""
    tiles = "; ".join(f"{variant}: " + ", ".join(f"{b} {100 * speed:.0f}%"
                                                 for b, speed in counts.items())
                      for variant, counts in record["kernels"].items())
    handoff_us = facts["handoff_us"]
    return [
        f"{record['cpu']}, {record['isa']}: measured {record['date']} in {record['seconds']} s",
        f"FMA peak {record['fma_gflops']} GFLOP/s on one core; {record['fma_in_flight']} "
        "independent FMAs reach it (latency x pipes)",
        f"micro-tiles of {TILE_VECTORS} vectors by b broadcasts, % of that peak: {tiles}",
        "read bandwidth GB/s: " + ", ".join(f"{k} {v}" for k, v in facts["read_gbs"].items()),
        "hand-off of a second part: " + ("one CPU" if handoff_us is None else
                                         f"{handoff_us['awake']} us to awake workers, "
                                         f"{handoff_us['asleep']} us to sleeping ones"),
    ]
