"""The thread split: which parts of the output run in parallel."""
from math import ceil


FILTER_SPLIT_COST = 0.05  # filter parts each pack (or fill) the whole input again


def thread_split(spec, units, filter_tiles, threads, filters_splittable, min_flops):
    """(window parts, filter parts) of the output, one thread each: the split whose busiest
    thread has the least work, a filter part costing FILTER_SPLIT_COST more, since each
    repacks the input. The output is split, never the reduction, so the result does not
    depend on it. A thread is only added for at least ``min_flops`` of work (the record's
    ``thread_min_flops``: small convolutions stay on one), and only where it makes the busiest
    thread's share smaller."""
    worth = max(1, min(threads, int(spec.flops // min_flops)))
    best, best_share = (1, 1), 1.0
    for t in range(2, worth + 1):
        for a in range(1, t + 1):
            b = t // a
            if a * b != t or a > units or b > filter_tiles or (b > 1 and not filters_splittable):
                continue
            share = (ceil(units / a) * ceil(filter_tiles / b) / (units * filter_tiles)
                     * (1 + FILTER_SPLIT_COST * (b > 1)))
            if share < best_share - 1e-9:
                best, best_share = (a, b), share
    return best
