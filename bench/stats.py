"""Summary statistics the report, its plots and documents and the models mode share. A leaf
module (no NumPy, nothing of ``bench``), so anything in ``bench`` may import it."""
from math import exp, log


def geomean(values):
    values = list(values)
    return exp(sum(map(log, values)) / len(values))


def ran_by_all(results, engines):
    """The results of the convolutions every engine of ``engines`` ran: only they enter
    geomeans and counts (an engine may refuse one, such as XNNPACK a stride and a dilation
    both above 1)."""
    return [r for r in results if all(e in r["gflops"] for e in engines)]


def cell(gflops, engine, over=None):
    """``gflops[engine]`` as a table cell (or cso's ratio to it when ``over`` is cso's figure),
    "n/a" where the engine did not run."""
    if engine not in gflops:
        return "n/a"
    return f"{gflops[engine]:.1f}" if over is None else f"{over / gflops[engine]:.2f}x"
