"""What ``python -m bench`` prints: the machine, then one row per layer and a geomean row."""
import os
import platform
import sys
from math import exp, log

import llvmlite.binding as llvm
import numpy as np

import cso
from microkernels import host_isa


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_facts():
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    return [
        ("CPU", f"{cpu_name()} (LLVM: {llvm.get_host_cpu_name()}), {os.cpu_count()} logical CPUs"),
        ("ISA", host_isa().name),
        ("Caches", str(cso.host_machine())),
        ("NumPy", f"{np.__version__}, BLAS {blas}, OPENBLAS_NUM_THREADS={threads} "
                  "(cso runs on one core)"),
    ]


def print_facts(facts):
    width = max(len(label) for label, _ in facts)
    for label, text in facts:
        print(f"{label:<{width}}  {text}")


def progress(done, total, spec):
    """One self-erasing line on stderr, so long suites show where they are."""
    end = "\n" if done == total else ""
    print(f"\r  [{done}/{total}] {spec}".ljust(60), end=end, file=sys.stderr, flush=True)


def _line(cells, widths):
    return cells[0].ljust(widths[0]) + "".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))


def print_table(rows, engines, peak):
    """``rows``: (spec, {engine: GFLOP/s}). Columns: GFLOP/s per engine, cso's speedup over each
    other engine, cso's % of ``peak``; then geomeans and how many convolutions cso wins."""
    others = [e for e in engines if e != "cso"]
    name_width = max(28, max(len(str(spec)) for spec, _ in rows) + 2)
    widths = [name_width, 8] + [max(10, len(e) + 6) for e in engines] + [max(9, len(e) + 5) for e in others] + [8]
    header = (["convolution", "GFLOP"] + [f"{e} GF/s" for e in engines] + [f"vs {e}" for e in others]
              + ["% peak"])
    rule = "-" * sum(widths)
    print(_line(header, widths))
    print(rule)
    for spec, g in rows:
        print(_line([str(spec), f"{spec.flops / 1e9:.3f}"] + [f"{g[e]:.1f}" for e in engines]
                    + [f"{g['cso'] / g[e]:.2f}x" for e in others] + [f"{100 * g['cso'] / peak:.1f}%"],
                    widths))
    print(rule)
    mean = {e: _geomean(g[e] for _, g in rows) for e in engines}
    print(_line(["geomean", ""] + [f"{mean[e]:.1f}" for e in engines]
                + [f"{mean['cso'] / mean[e]:.2f}x" for e in others] + [f"{100 * mean['cso'] / peak:.1f}%"],
                widths))
    for e in others:
        wins = sum(g["cso"] > g[e] for _, g in rows)
        worst = min(rows, key=lambda row: row[1]["cso"] / row[1][e])
        print(f"cso faster than {e} on {wins} of {len(rows)}; lowest ratio "
              f"{worst[1]['cso'] / worst[1][e]:.2f}x on {worst[0]}")


def print_schedules(rows):
    """``rows``: (spec, CSA's schedule, {"IS": GFLOP/s, "WS": GFLOP/s})."""
    widths = [max(28, max(len(str(spec)) for spec, _, _ in rows) + 2), 8, 9, 9, 8, 8]
    print(_line(["convolution", "GFLOP", "IS GF/s", "WS GF/s", "CSA", "hit"], widths))
    print("-" * sum(widths))
    hits = close = 0
    for spec, chosen, g in rows:
        other = "WS" if chosen == "IS" else "IS"
        hit = g[chosen] >= g[other]
        near = g[chosen] >= 0.97 * g[other]
        hits += hit
        close += near
        print(_line([str(spec), f"{spec.flops / 1e9:.3f}", f"{g['IS']:.1f}", f"{g['WS']:.1f}", chosen,
                     "yes" if hit else ("~" if near else "no")], widths))
    print("-" * sum(widths))
    best = _geomean(max(g.values()) for _, _, g in rows)
    picked = _geomean(g[c] for _, c, g in rows)
    print(f"CSA picked the faster schedule on {hits} of {len(rows)} ({100 * hits / len(rows):.0f}%); "
          f"within 3% of it on {close} ({100 * close / len(rows):.0f}%). Geomean of CSA's picks "
          f"{picked:.1f} GFLOP/s vs {best:.1f} always picking the faster.")


def _geomean(values):
    values = list(values)
    return exp(sum(map(log, values)) / len(values))
