"""What ``python -m bench`` prints: the machine, then one row per layer and a geomean row."""
import os
import platform
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


HEADER = ("layer", "GFLOP", "cso GF/s", "im2col GF/s", "cso/im2col", "cso % peak")
WIDTHS = (28, 8, 10, 13, 12, 12)


def _line(cells):
    return cells[0].ljust(WIDTHS[0]) + "".join(c.rjust(w) for c, w in zip(cells[1:], WIDTHS[1:]))


def print_table(rows, peak):
    """``rows``: (layer name, GFLOP, cso GFLOP/s, im2col GFLOP/s); ``peak``: GFLOP/s that
    "% peak" is relative to."""
    print(_line(HEADER))
    print("-" * sum(WIDTHS))
    for name, gflop, fast, base in rows:
        print(_line((name, f"{gflop:.3f}", f"{fast:.1f}", f"{base:.1f}", f"{fast / base:.2f}x",
                     f"{100 * fast / peak:.1f}%")))
    print("-" * sum(WIDTHS))
    fast, base = (_geomean(row[i] for row in rows) for i in (2, 3))
    print(_line(("geomean", "", f"{fast:.1f}", f"{base:.1f}", f"{fast / base:.2f}x",
                 f"{100 * fast / peak:.1f}%")))


def _geomean(values):
    values = list(values)
    return exp(sum(map(log, values)) / len(values))
