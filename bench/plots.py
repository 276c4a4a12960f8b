"""The report's PNG plots (matplotlib, no display needed). Each function takes the results of
``measure.measure_conv`` and writes one figure; convolutions keep the suite's order, top to
bottom, wherever they are named."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .stats import geomean  # noqa: E402

COLORS = {"cso": "#1f77b4", "cso-blocked": "#aec7e8", "cso-nhwc": "#17becf", "im2col": "#7f7f7f",
          "onnxruntime": "#ff7f0e", "torch": "#d62728", "xnnpack": "#2ca02c"}
PHASE_COLORS = {"packing": "#ff7f0e", "micro-kernel": "#1f77b4", "post-conv": "#2ca02c",
                "other": "#c7c7c7"}
DPI = 110
SPEEDUP_TICKS = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 16]


def _height(rows, per_row):
    return max(3.0, 1.4 + per_row * len(rows))


def _save(fig, path):
    for ax in fig.axes:
        ax.margins(y=0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def gflops_bars(results, engines, peak, path):
    """GFLOP/s of every engine per convolution, with the measured FMA peak marked."""
    fig, ax = plt.subplots(figsize=(9, _height(results, 0.06 * len(engines) + 0.1)))
    bar = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        ys = [row + (i - (len(engines) - 1) / 2) * bar for row in range(len(results))]
        ax.barh(ys, [r["gflops"].get(engine, 0.0) for r in results], height=bar, label=engine,
                color=COLORS.get(engine))
    ax.axvline(peak, color="black", linestyle="--", linewidth=1,
               label=f"measured FMA peak ({peak:.0f})")
    ax.set_yticks(range(len(results)), [r["spec"] for r in results], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s (higher is better)")
    ax.set_title("Throughput per convolution", pad=24)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=5, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def speedup_sorted(results, engines, path):
    """Each engine's speedup over im2col + GEMM, convolutions sorted by it (log scale)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for engine in engines:
        if engine == "im2col":
            continue
        ratios = sorted(r["gflops"][engine] / r["gflops"]["im2col"] for r in results
                        if engine in r["gflops"])
        wins = sum(v > 1 for v in ratios)
        ax.plot(range(1, len(ratios) + 1), ratios, marker="o", markersize=3, color=COLORS.get(engine),
                label=f"{engine}: faster on {wins} of {len(ratios)}, geomean {geomean(ratios):.2f}x")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(SPEEDUP_TICKS))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("convolutions, sorted by speedup")
    ax.set_ylabel("speedup over im2col + GEMM")
    ax.set_title("Speedup over im2col + GEMM (above the line: faster)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def percent_of_peak(results, peak, path):
    """cso's GFLOP/s as a percentage of the measured FMA peak, per convolution."""
    fig, ax = plt.subplots(figsize=(9, _height(results, 0.2)))
    values = [100 * r["gflops"]["cso"] / peak for r in results]
    ax.barh(range(len(results)), values, color=COLORS["cso"])
    for row, v in enumerate(values):
        ax.text(v + 1, row, f"{v:.0f}%", va="center", fontsize=7)
    ax.set_yticks(range(len(results)), [r["spec"] for r in results], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 110)
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel(f"% of the measured FMA peak ({peak:.0f} GFLOP/s on the cores used)")
    ax.set_title("cso: fraction of peak")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def time_breakdown(results, path):
    """Left: the steady-state call split into ConvBench's phases. Right: the one-off costs
    (loading: planning and filter packing; the first call's compilation) against one call."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, _height(results, 0.2)), sharey=True,
                                      gridspec_kw={"width_ratios": [3, 2]})
    rows = range(len(results))
    start = [0.0] * len(results)
    for phase, color in PHASE_COLORS.items():
        shares = []
        for r in results:
            parts = r["cso"]["breakdown_s"]
            shares.append(100 * parts[phase] / sum(parts.values()))
        left.barh(rows, shares, left=start, color=color, label=phase)
        start = [a + b for a, b in zip(start, shares)]
    left.set_yticks(rows, [r["spec"] for r in results], fontsize=7)
    left.invert_yaxis()
    left.set_xlim(0, 100)
    left.set_xlabel("% of a steady-state call")
    left.set_title("Where a call's time goes", pad=22)
    left.legend(fontsize=7, ncol=4, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    one_off = [("steady call", lambda r: r["seconds"]["cso"], COLORS["cso"], "o"),
               ("load (plan + filter packing)", lambda r: r["cso"]["load_s"], "#9467bd", "s"),
               ("first call (compile + run)", lambda r: r["cso"]["first_call_s"], "#8c564b", "^")]
    for label, get, color, marker in one_off:
        right.scatter([1e3 * get(r) for r in results], rows, color=color, marker=marker, s=18, label=label)
    right.set_xscale("log")
    right.set_xlabel("milliseconds (log)")
    right.set_title("One-off costs vs one call")
    right.legend(fontsize=7)
    right.grid(axis="x", alpha=0.3, which="both")
    return _save(fig, path)
