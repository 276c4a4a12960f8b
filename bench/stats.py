"""Summary statistics the report, its plots and documents and the models mode share. A leaf
module (no NumPy, nothing of ``bench``), so anything in ``bench`` may import it."""
from math import exp, log


def geomean(values):
    values = list(values)
    return exp(sum(map(log, values)) / len(values))
