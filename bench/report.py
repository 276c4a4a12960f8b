"""What ``python -m bench`` prints: the machine, a progress bar, then one row per convolution
and a geomean row."""
import os
import sys
import time

import llvmlite.binding as llvm
import numpy as np

import csa
import cso
from cso import calibration
from cso.calibration import cpu_name
from cso.cpus import available_cpus
from microkernels import default_isa, host_isa
from microkernels.probe import UKERNEL_K, fma_peak, kernel_throughput

from .stats import cell, geomean, ran_by_all


# a convolution planned in each micro-kernel orientation (the overrides make sure of it)
ORIENTATIONS = (
    ("windows in vectors", "n1c64h56w56k64r3s3p1u1", {"vectors_along": "windows", "slab": False}),
    ("windows in vectors, slab", "n1c64h56w56k64r3s3p1u1", {"vectors_along": "windows", "slab": True}),
    ("filters in vectors", "n1c512h7w7k512r3s3p1u1", {"vectors_along": "filters", "slab": False}),
    ("direct", "n1c256h56w56k256r3s3p1u1", {"vectors_along": "filters", "slab": True}),
)


def orientation_kernels():
    """[(orientation, KernelSpec)]: the micro-kernel this host's plans run in each
    orientation."""
    kernels = []
    for name, conv, overrides in ORIENTATIONS:
        spec = csa.ConvSpec.parse(conv)
        t, b, left, right = spec.padding
        layer = cso.Conv2d(np.zeros(spec.weight_shape, np.float32), padding=((t, b), (left, right)),
                           plan_overrides=overrides)
        kernels.append((name, layer.kernel_for(spec.input_shape)))
    return kernels


def machine_facts(threads):
    """([(label, text)], measured FMA peak GFLOP/s of the cores ``threads`` threads run on):
    what a reader needs to trust the numbers, "% of peak" against a peak measured here by a
    small llvmlite FMA probe on one core, times the cores."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    fma_gflops, fma_count = fma_peak()
    cores = min(threads, available_cpus())
    kernels = [(name, kernel, kernel_throughput(kernel)) for name, kernel in orientation_kernels()]
    isa, host = default_isa().name, host_isa().name
    forced = "" if isa == host else f" (forced: --isa or CSO_ISA; the host has {host})"
    facts = [
        ("CPU", f"{cpu_name()} (LLVM: {llvm.get_host_cpu_name()}), {os.cpu_count()} logical CPUs"),
        ("ISA", f"{isa}{forced}; its tuning record measured on "
                f"{cso.host_machine().tuning.measured_on}"),
        ("Calibration", calibration_text()),
        ("Caches", f"as CSA sees them: {cso.host_machine()}"),
        ("Threads", f"{threads} for every engine (cso, im2col's BLAS, onnxruntime, PyTorch, "
                    f"XNNPACK), on {cores} core(s)"),
        ("NumPy", f"{np.__version__}, BLAS {blas}"),
        ("FMA peak", f"{fma_gflops:.1f} GFLOP/s measured on one core ({fma_count} full-width vector FMAs "
                     f"in the probe's asm; x {cores} core(s) = {cores * fma_gflops:.1f})"),
        ("u-kernels", "; ".join(f"{name} {kernel.name} {gflops:.1f} GFLOP/s "
                                f"({100 * gflops / fma_gflops:.0f}%)"
                                for name, kernel, gflops in kernels)
         + f" of the FMA peak (k={UKERNEL_K}, L1-resident tiles)"),
    ]
    return facts, cores * fma_gflops


def calibration_text():
    """This host's calibration record (what plans read besides the tuning record), or why
    there is none."""
    if not calibration.enabled():
        return f"off ({calibration.ENV_VAR}=0): plans from the tuning record alone"
    isa = default_isa().name
    return "; ".join(calibration.describe(calibration.calibration(isa),
                                          calibration.host_facts(isa)))


def print_facts(facts):
    width = max(len(label) for label, _ in facts)
    for label, text in facts:
        print(f"{label:<{width}}  {text}")


class Progress:
    """A progress bar on stderr, redrawn in place: done/total, the convolution just measured,
    elapsed time and a rough estimate of what is left."""
    WIDTH = 24

    def __init__(self, total):
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def step(self, spec, result):
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        filled = self.WIDTH * self.done // self.total
        line = (f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                f"{elapsed:4.0f} s, ~{left:.0f} s left  {spec}")
        print(line.ljust(100), end="\n" if self.done == self.total else "", file=sys.stderr, flush=True)
        return result


def _line(cells, widths):
    return cells[0].ljust(widths[0]) + "".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))


def print_table(results, engines, peak):
    """``results`` from ``measure_conv``. Columns: GFLOP/s per engine, cso's speedup over each
    other engine, cso's % of ``peak``; then geomeans and how many convolutions cso wins."""
    rows = [(r["spec"], r["gflop"], r["gflops"]) for r in results]
    others = [e for e in engines if e != "cso"]
    name_width = max(28, max(len(spec) for spec, _, _ in rows) + 2)
    widths = [name_width, 8] + [max(10, len(e) + 6) for e in engines] + [max(9, len(e) + 5) for e in others] + [8]
    header = (["convolution", "GFLOP"] + [f"{e} GF/s" for e in engines] + [f"vs {e}" for e in others]
              + ["% peak"])
    rule = "-" * sum(widths)
    print(_line(header, widths))
    print(rule)
    for spec, gflop, g in rows:
        print(_line([spec, f"{gflop:.3f}"] + [cell(g, e) for e in engines]
                    + [cell(g, e, g["cso"]) for e in others] + [f"{100 * g['cso'] / peak:.1f}%"],
                    widths))
    print(rule)
    ran = ran_by_all(results, engines)
    if len(ran) < len(rows):
        print(f"(geomeans and counts below: the {len(ran)} convolutions every engine ran)")
    mean = {e: geomean(r["gflops"][e] for r in ran) for e in engines}
    print(_line(["geomean", ""] + [f"{mean[e]:.1f}" for e in engines]
                + [f"{mean['cso'] / mean[e]:.2f}x" for e in others] + [f"{100 * mean['cso'] / peak:.1f}%"],
                widths))
    for line in win_lines(ran, others):
        print(line)
    depthwise = [r for r in results if "bandwidth" in r]
    if depthwise:
        print("\nDepthwise: " + BANDWIDTH_TEXT)
        header = ["convolution", "MB moved", "cso GB/s", "copy GB/s", "of copy"]
        widths = [name_width, 10, 10, 11, 9]
        print(_line(header, widths))
        for row in bandwidth_rows(depthwise):
            print(_line(row, widths))


BANDWIDTH_TEXT = ("the bytes a convolution must move (input, output, weights, once) over its "
                  "time, against a copy of as many bytes (half read, half written) timed beside "
                  "it: the speed of memory, or of the cache the data fits in, for that size")


def bandwidth_rows(results):
    """Per depthwise result: name, MB moved, cso's GB/s, the copy probe's, their ratio."""
    rows = []
    for r in results:
        b = r["bandwidth"]
        rows.append([r["spec"], f"{b['bytes'] / 1e6:.2f}", f"{b['cso_gbs']:.1f}",
                     f"{b['copy_gbs']:.1f}", f"{100 * b['cso_gbs'] / b['copy_gbs']:.0f}%"])
    return rows


def wins(results, engine):
    """(on how many convolutions cso is faster than ``engine``, the result with cso's lowest
    ratio to it)."""
    count = sum(r["gflops"]["cso"] > r["gflops"][engine] for r in results)
    return count, min(results, key=lambda r: r["gflops"]["cso"] / r["gflops"][engine])


def win_lines(results, others):
    """For each other engine: on how many convolutions cso is faster, and its lowest ratio."""
    lines = []
    for e in others:
        count, worst = wins(results, e)
        lines.append(f"cso faster than {e} on {count} of {len(results)}; lowest ratio "
                     f"{worst['gflops']['cso'] / worst['gflops'][e]:.2f}x on {worst['spec']}")
    return lines


def print_schedules(results):
    """``results`` from ``measure_schedules``: CSA's pick and GFLOP/s with IS and WS forced."""
    rows = [(r["spec"], r["gflop"], r["chosen"], r["gflops"]) for r in results]
    widths = [max(28, max(len(spec) for spec, _, _, _ in rows) + 2), 8, 9, 9, 8, 8]
    print(_line(["convolution", "GFLOP", "IS GF/s", "WS GF/s", "CSA", "hit"], widths))
    print("-" * sum(widths))
    hits = close = 0
    for spec, gflop, chosen, g in rows:
        other = "WS" if chosen == "IS" else "IS"
        hit = g[chosen] >= g[other]
        near = g[chosen] >= 0.97 * g[other]
        hits += hit
        close += near
        print(_line([spec, f"{gflop:.3f}", f"{g['IS']:.1f}", f"{g['WS']:.1f}", chosen,
                     "yes" if hit else ("~" if near else "no")], widths))
    print("-" * sum(widths))
    best = geomean(max(g.values()) for _, _, _, g in rows)
    picked = geomean(g[c] for _, _, c, g in rows)
    print(f"CSA picked the faster schedule on {hits} of {len(rows)} ({100 * hits / len(rows):.0f}%); "
          f"within 3% of it on {close} ({100 * close / len(rows):.0f}%). Geomean of CSA's picks "
          f"{picked:.1f} GFLOP/s vs {best:.1f} always picking the faster.")


def print_scaling(results, threads, peak):
    """``results`` from ``bench.scaling.run_children``: per convolution, each engine's GFLOP/s on
    1 and ``threads`` threads and its scaling factor, cso's ratio to each other engine on
    ``threads`` threads and its % of ``peak``; then geomeans and how many convolutions scale."""
    engines, n = list(results), str(threads)
    others = [e for e in engines if e != "cso"]
    rows = list(zip(*results.values()))   # per convolution, one result per engine
    width = max(28, max(len(r[0]["spec"]) for r in rows) + 2)
    widths = ([width, 8] + [len(e) + 6 for e in engines for _ in "12"]
              + [max(7, len(e) + 4) for e in engines] + [len(e) + 8 for e in others] + [8])
    header = (["convolution", "GFLOP"] + [f"{e} {t}t" for e in engines for t in ("1", n)]
              + [f"{e} x" for e in engines] + [f"vs {e} {n}t" for e in others] + ["% peak"])

    def cells(g):   # g: {engine: {"1": GFLOP/s, n: GFLOP/s}}, an engine that refused absent
        def at(e, text):
            return text() if e in g else "n/a"
        return ([at(e, lambda: f"{g[e][t]:.1f}") for e in engines for t in ("1", n)]
                + [at(e, lambda: f"{g[e][n] / g[e]['1']:.2f}") for e in engines]
                + [at(e, lambda: f"{g['cso'][n] / g[e][n]:.2f}x") for e in others]
                + [f"{100 * g['cso'][n] / peak:.1f}%"])

    print(_line(header, widths))
    print("-" * sum(widths))
    for row in rows:
        g = {e: r["gflops"] for e, r in zip(engines, row) if "gflops" in r}
        print(_line([row[0]["spec"], f"{row[0]['gflop']:.3f}"] + cells(g), widths))
    print("-" * sum(widths))
    ran = [i for i, row in enumerate(rows) if all("gflops" in r for r in row)]
    if len(ran) < len(rows):
        print(f"(geomeans and counts below: the {len(ran)} convolutions every engine ran)")
    results = {e: [results[e][i] for i in ran] for e in engines}
    mean = {e: {t: geomean(r["gflops"][t] for r in results[e]) for t in ("1", n)}
            for e in engines}
    print(_line(["geomean", ""] + cells(mean), widths))
    scaling = sorted((r["gflops"][n] / r["gflops"]["1"], r["spec"]) for r in results["cso"])
    print(f"cso on {threads} threads: {sum(x >= 0.9 * threads for x, _ in scaling)} of "
          f"{len(scaling)} convolutions at least {0.9 * threads:.2f}x faster than on 1; lowest "
          f"{scaling[0][0]:.2f}x on {scaling[0][1]} (CSA keeps convolutions too small for "
          f"several threads on one)")
    from .models import PAUSE_SECONDS
    for e in engines:
        paused = {t: geomean(r["paused_x"][t] for r in results[e]) for t in ("1", n)}
        print(f"{e} after a {1e3 * PAUSE_SECONDS:.0f} ms pause: {paused['1']:.2f}x its "
              f"back-to-back time on 1 thread, {paused[n]:.2f}x on {threads} (geomean)")


def print_dask(results):
    """``results`` from ``bench.dask.measure``: a row per workload."""
    from .dask import HEADER, rows
    table = rows(results)
    widths = [max(len(r[0]) for r in table) + 2] + [len(h) + 2 for h in HEADER[1:]]
    for row in [HEADER] + table:
        print(_line(row, widths))


def print_models(results):
    """``results`` from ``bench.models.measure``: a row per model and batch, then the geomean
    speedup per batch; then a row per model and engine alone in its process, with their
    summary."""
    from .models import ALONE_HEADER, HEADER, alone_rows, alone_summary, rows, summary_lines
    for header, table, lines in ((HEADER, rows(results), summary_lines(results)),
                                 (ALONE_HEADER, alone_rows(results), alone_summary(results))):
        widths = ([max(14, max((len(r[0]) for r in table), default=0) + 2)]
                  + [max(9, len(h) + 2) for h in header[1:]])
        print(_line(header, widths))
        print("-" * sum(widths))
        for row in table:
            print(_line(row, widths))
        print("-" * sum(widths))
        for line in lines:
            print(line)
        print()
