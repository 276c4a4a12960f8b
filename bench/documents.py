"""The report files: report.md, a self-contained report.html (plots inlined), the PNG plots and
results.json. Both documents render one list of blocks, so they always say the same thing."""
import base64
import html
import json
import os

from . import models, plots
from .report import BANDWIDTH_TEXT, bandwidth_rows, win_lines, wins
from .stats import cell, geomean, ran_by_all
from .memory import memory_lines
from .startup import startup_lines

PHASES = ("packing", "micro-kernel", "post-conv", "other")


def write(out_dir, facts, peak, results, engines, startup, memory):
    """Write the report into ``out_dir`` (created if needed); return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    figures = [
        ("Throughput per convolution", plots.gflops_bars(results, engines, peak, os.path.join(out_dir, "gflops.png"))),
        ("Speedup over im2col + GEMM, sorted", plots.speedup_sorted(results, engines, os.path.join(out_dir, "speedup.png"))),
        ("cso's fraction of the measured peak", plots.percent_of_peak(results, peak, os.path.join(out_dir, "peak.png"))),
        ("cso's time breakdown and one-off costs", plots.time_breakdown(results, os.path.join(out_dir, "breakdown.png"))),
    ]
    summary = _summary(results, engines)
    blocks = _blocks(facts, peak, results, engines, figures, summary["geomean_gflops"], startup,
                     memory)
    paths = _write_documents(out_dir, blocks, {
        "machine": dict(facts), "peak_gflops": peak, "engines": engines, "summary": summary,
        "startup": startup, "memory": memory, "results": results})
    return paths + [path for _, path in figures]


def _write_documents(out_dir, blocks, data):
    """report.md and report.html rendering ``blocks``, results.json holding ``data``; their
    paths."""
    paths = [os.path.join(out_dir, name) for name in ("report.md", "report.html", "results.json")]
    with open(paths[0], "w") as f:
        f.write(_markdown(blocks))
    with open(paths[1], "w") as f:
        f.write(_html(blocks))
    with open(paths[2], "w") as f:
        json.dump(data, f, indent=1)
    return paths


def write_models(out_dir, facts, results):
    """``python -m bench --models``: report.md, report.html and results.json with a Models
    section; return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    blocks = [
        ("h1", "cso benchmark report: models"),
        ("table", ["", ""], [[label, text] for label, text in facts]),
        ("h2", "Models"),
        ("p", models.TEXT.format(rtol=models.RTOL)),
        ("table", models.HEADER, models.rows(results)),
        ("list", models.summary_lines(results)),
        ("h2", "Each engine alone"),
        ("p", models.ALONE_TEXT.format(pause=1e3 * models.PAUSE_SECONDS)),
        ("table", models.ALONE_HEADER, models.alone_rows(results)),
        ("list", models.alone_summary(results)),
    ]
    return _write_documents(out_dir, blocks, {
        "machine": dict(facts), "summary": {"geomean_speedup": models.geomean_speedups(results)},
        "models": results})


def _summary(results, engines):
    """Geomeans and counts over the convolutions every engine ran."""
    results = ran_by_all(results, engines)
    mean = {e: geomean(r["gflops"][e] for r in results) for e in engines}
    return {"geomean_gflops": mean,
            "cso_speedup": {e: mean["cso"] / mean[e] for e in engines if e != "cso"},
            "cso_faster_on": {e: wins(results, e)[0] for e in engines if e != "cso"},
            "convolutions": len(results)}


def _blocks(facts, peak, results, engines, figures, mean, startup, memory):
    others = [e for e in engines if e != "cso"]
    first = sum(r["cso"]["first_call_s"] for r in results)
    load = sum(r["cso"]["load_s"] for r in results)
    blocks = [
        ("h1", "cso benchmark report"),
        ("table", ["", ""], [[label, text] for label, text in facts]),
        ("h2", "Summary"),
        ("list", ["geomean GFLOP/s: " + ", ".join(f"{e} {mean[e]:.1f}" for e in engines),
                  f"cso geomean: {100 * mean['cso'] / peak:.1f}% of the measured peak; "
                  + ", ".join(f"{mean['cso'] / mean[e]:.2f}x {e}" for e in others)]
         + win_lines(ran_by_all(results, engines), others)
         + [f"one-off costs over the suite: loading (planning, filter packing) {1e3 * load:.0f} ms, "
            f"first calls (compiling, or loading from the compilation cache, where the loop "
            f"nest is new) {first:.1f} s; the figures above are steady-state"]),
        ("h2", "Start-up"),
        ("p", "A new Python process runs ResNet-50's eight layer shapes, first with an empty "
              "compilation cache, then with the cache it filled (a temporary directory; "
              "times from the start of import cso, on the report's thread count)."),
        ("list", startup_lines(startup)),
        ("h2", "Memory"),
        ("p", "The peak a call allocates beyond its output (tracemalloc, which sees NumPy's "
              "allocations): cso's workspace is bounded by the tiles its plan chose."),
        ("list", memory_lines(memory)),
        ("h2", "Per convolution"),
        ("p", "GFLOP/s, median of the timed samples; names are benchdnn-style (n batch, c "
              "channels, h x w input, k filters, r x s kernel, p padding, u stride, d dilation, g "
              "groups). Plan: CSA's schedule, vector dimension and input path."),
        ("table", ["convolution", "GFLOP"] + [f"{e} GF/s" for e in engines]
         + [f"cso vs {e}" for e in others] + ["cso % peak", "plan"],
         [[r["spec"], f"{r['gflop']:.3f}"] + [cell(r["gflops"], e) for e in engines]
          + [cell(r["gflops"], e, r["gflops"]["cso"]) for e in others]
          + [f"{100 * r['gflops']['cso'] / peak:.1f}%", _plan_text(r["cso"]["plan"])]
          for r in results]),
    ]
    depthwise = [r for r in results if "bandwidth" in r]
    if depthwise:
        blocks += [("h2", "Depthwise bandwidth (cso)"),
                   ("p", BANDWIDTH_TEXT[0].upper() + BANDWIDTH_TEXT[1:] + "."),
                   ("table", ["convolution", "MB moved", "cso GB/s", "copy GB/s", "of copy"],
                    bandwidth_rows(depthwise))]
    blocks += [
        ("h2", "Time breakdown (cso)"),
        ("p", "ConvBench's terms, steady state: input packing (packed tiles or the padded slab), "
              "micro-kernel, post-conv (turning a filters-in-vectors output back into NCHW) and "
              "the rest (argument checks, buffers, loop control), from runs of each loop-nest "
              "phase alone on the same tiles. Pre-conv filter packing happens once, when the "
              "model loads (with planning), and the first call compiles: both are shown apart."),
        ("table", ["convolution", "call ms"] + [f"{p} %" for p in PHASES]
         + ["load ms", "first call ms"],
         [[r["spec"], f"{1e3 * r['seconds']['cso']:.3f}"] + _shares(r["cso"]["breakdown_s"])
          + [f"{1e3 * r['cso']['load_s']:.2f}", f"{1e3 * r['cso']['first_call_s']:.1f}"]
          for r in results]),
        ("h2", "Plots"),
    ]
    blocks += [("img", title, path) for title, path in figures]
    return blocks


def _plan_text(plan):
    if plan["kind"] == "depthwise":
        return (f"depthwise, {plan['block_vectors']}-vector blocks, {plan['nc']} channel(s) per fill, "
                f"bands of {plan['band']} rows")
    return f"{plan['schedule']}, {plan['vectors_along']} in vectors, {plan['input']}"


def _shares(parts):
    total = sum(parts.values())
    return [f"{100 * parts[p] / total:.1f}" for p in PHASES]


def _markdown(blocks):
    out = []
    for kind, *body in blocks:
        if kind in ("h1", "h2"):
            out.append(f"{'#' * int(kind[1])} {body[0]}\n")
        elif kind == "p":
            out.append(body[0] + "\n")
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in body[0]) + "\n")
        elif kind == "table":
            header, rows = body
            out.append("\n".join("| " + " | ".join(cells) + " |"
                                 for cells in [header, ["---"] * len(header)] + rows) + "\n")
        elif kind == "img":
            out.append(f"![{body[0]}]({os.path.basename(body[1])})\n")
    return "\n".join(out)


STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
         "td:first-child,th:first-child{text-align:left;font-family:monospace}"
         "img{max-width:100%;margin:1em 0}")


def _html(blocks):
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>cso benchmark report</title>"
           f"<style>{STYLE}</style></head><body>"]
    for kind, *body in blocks:
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{html.escape(body[0])}</{kind}>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in body[0]) + "</ul>")
        elif kind == "table":
            header, rows = body
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
                                 for cells in rows) + "</table>")
        elif kind == "img":
            with open(body[1], "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            out.append(f"<h3>{html.escape(body[0])}</h3><img alt='{html.escape(body[0])}' "
                       f"src='data:image/png;base64,{data}'>")
    out.append("</body></html>")
    return "\n".join(out)
