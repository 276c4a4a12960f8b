"""The thread split: which parts of the output run in parallel."""
from math import ceil


FILTER_SPLIT_COST = 0.05  # filter parts inside a group each pack (or fill) its input again
# ... and a grouped plan's with windows in vectors pack the group's windows again, a large
# share of its work: on a Xeon (AVX-512) at 2 threads, filter parts that each took part of
# every group ran 1.07-1.56x slower than window parts on 10 such layers of timm's
GROUPED_FILTER_SPLIT_COST = 0.4
# a window part of a grouped blocked plan fills its rows' slab with the filter's halo rows
# again, and on NCHW planes writes rows whose cache lines the next part's share: 432 in 9
# groups at 14 x 14 and at stride 2 from 28 x 28 (Xeon, 2 threads, NCHW calls) ran 0.86x and
# 0.85x the time as two parts of 5 and 4 groups, against parts of rows (csa/TUNING.md)
GROUPED_WINDOW_SPLIT_COST = 0.15
# window parts a thread may get at most: with more parts than threads (each thread's own first,
# then the others' last ones: ``cso.pool``), a thread that is late (its core waking up, or
# taken by another process) holds up the others by one small part, not by its whole share
PARTS_PER_THREAD = 4


def filter_part(groups, tiles, b, j):
    """Filter part ``j`` of ``b`` of ``groups`` groups of ``tiles`` filter tiles each: the
    (first, end) of its tiles, numbered over all groups in order: near-equal runs of whole
    groups where there are at least ``b`` of them, else near-equal runs of the tiles."""
    if groups >= b:
        return groups * j // b * tiles, groups * (j + 1) // b * tiles
    return groups * tiles * j // b, groups * tiles * (j + 1) // b


def filter_part_shares(groups, tiles, b):
    """(filter tiles, input) the busiest of ``b`` filter parts (``filter_part``) takes, as
    shares of all of them: with fewer groups than parts, a part reads one group's input."""
    if groups >= b:
        share = ceil(groups / b) / groups
        return share, share
    return ceil(groups * tiles / b) / (groups * tiles), 1 / groups


def thread_split(spec, units, filter_tiles, threads, machine, repacking=FILTER_SPLIT_COST,
                 windowing=0.0):
    """(window parts, filter parts) of the output, one thread each: the split whose busiest
    thread takes the least time. Its FMAs: its share of the output, a filter part costing
    ``repacking`` more where it takes part of a group, since each then repacks that group's
    input (0 where there is no packing: a 1x1 read in place), a window part ``windowing``
    more where there are several (GROUPED_WINDOW_SPLIT_COST); a filter part of whole groups
    packs those groups' channels alone, as no other part does. Its bytes, streamed from
    memory at ``machine.stream_mem`` cycles a line against its FMAs at the peak: each window
    part reads the filters of its filter part, each filter part the input of its groups (all
    of it with one group) in its window part; so where the filters outweigh the work on them
    (a classifier, the last 7x7 layers of a CNN at batch 1) filter parts halve what each
    thread streams, where window parts would each read them all. ``filter_tiles`` are a
    group's; filter parts run over all groups' (``filter_part_shares``): a grouped
    convolution's threads take whole groups where they can. The output is split, never the
    reduction, so the result does not depend on it. A thread is only added for at least
    ``thread_min_flops`` of work (the record's: small convolutions stay on one), its FMAs and
    its filters read once from L2 at ``machine.stream_l2`` cycles a line (a one-pixel 1x1 is
    all filters: 746 -> 186, 2.5 MFLOP of such work, ran 1.13x faster at 2 threads, 1098 -> 91
    1.33x, 184 -> 360 0.69x), and only where it makes the busiest thread faster."""
    flops_a_cycle = 2 * machine.tuning.fma_pipes * machine.vector_bytes / spec.itemsize
    byte_share = machine.stream_mem / machine.line * flops_a_cycle / spec.flops
    filter_bytes = spec.k * spec.c_per_group * spec.r * spec.s * spec.itemsize
    work = spec.flops + filter_bytes * machine.stream_l2 / machine.line * flops_a_cycle
    worth = max(1, min(threads, int(work // machine.tuning.thread_min_flops)))
    input_bytes = spec.n * spec.c * spec.h * spec.w * spec.itemsize
    groups = spec.groups

    def cost(a, b):   # the busiest thread's time, in shares of the whole work's FMAs
        inputs = filter_part_shares(groups, filter_tiles, b)[1]
        share = split_share(groups, units, filter_tiles, (a, b), repacking, windowing)
        return share + (filter_bytes / b + input_bytes * inputs / a) * byte_share

    best, best_cost = (1, 1), cost(1, 1)
    for t in range(2, worth + 1):
        for a in range(1, t + 1):
            b = t // a
            if a * b != t or a > units or b > groups * filter_tiles:
                continue
            c = cost(a, b)
            if c < best_cost - 1e-9:
                best, best_cost = (a, b), c
    return best


def split_share(groups, units, filter_tiles, split, repacking, windowing):
    """The FMAs of the busiest thread of ``split`` (window parts, filter parts) as a share of
    all, a filter part inside a group costing ``repacking`` more, several window parts
    ``windowing`` more (see ``thread_split``)."""
    a, b = split
    filters = filter_part_shares(groups, filter_tiles, b)[0]
    return (ceil(units / a) / units * filters * (1 + repacking * (b > groups))
            * (1 + windowing * (a > 1)))


def group_runs(groups, units, threads):
    """Each of ``threads`` threads' near-equal run of the groups' ``units`` window units each,
    in group order, as (first unit, end, first group, end) rectangles: a share of the group it
    starts in, whole groups, a share of the group it ends in. Every thread gets as many (the
    pool's lanes are near-equal runs of the parts): a thread with fewer cuts its rectangle of
    the most groups at a group, else of the most units in halves."""
    runs = []
    for t in range(threads):
        lo, hi, run = groups * units * t // threads, groups * units * (t + 1) // threads, []
        while lo < hi:
            g, u = divmod(lo, units)
            if u == 0 and hi - lo >= units:   # whole groups
                n = (hi - lo) // units
                run.append((0, units, g, g + n))
                lo += n * units
            else:                             # a share of group g
                end = min(hi, (g + 1) * units)
                run.append((u, end - g * units, g, g + 1))
                lo = end
        runs.append(run)
    most = max(len(run) for run in runs)
    for run in runs:
        while len(run) < most:
            i = max(range(len(run)), key=lambda i: (run[i][3] - run[i][2], run[i][1] - run[i][0]))
            u0, u1, g0, g1 = run[i]
            cut = ([(u0, u1, g0, g0 + 1), (u0, u1, g0 + 1, g1)] if g1 - g0 > 1 else
                   [(u0, (u0 + u1) // 2, g0, g1), ((u0 + u1) // 2, u1, g0, g1)])
            run[i:i + 1] = cut
    return runs


def use_group_runs(groups, units, filter_tiles, split, repacking):
    """Whether the threads of ``split`` take runs of the groups' windows in group order
    (``group_runs``) instead: for a grouped plan whose groups do not split evenly over its
    threads, where the runs' busiest thread takes fewer FMAs than the split's, a share of a
    group, as a window part, counted GROUPED_WINDOW_SPLIT_COST more (it fills the filter's
    halo rows again). Each run reads the filters and input of its own groups alone, as
    whole-group filter parts do. On a Xeon at 2 threads, 432 in 9 groups on blocks ran 0.88x
    the time as runs of 4.5 groups against parts of 5 and 4 groups, and all 27 timm NCHW
    plans of odd group counts 0.89-1.0x against window parts or uneven groups
    (csa/TUNING.md, "Thread split")."""
    threads = split[0] * split[1]
    if groups == 1 or threads == 1 or groups % threads == 0 or groups * units < 3 * threads:
        return False
    windowing = GROUPED_WINDOW_SPLIT_COST
    busiest = max(sum((u1 - u0) * (g1 - g0) * (1 + windowing * (u1 - u0 < units))
                      for u0, u1, g0, g1 in run) for run in group_runs(groups, units, threads))
    return (busiest / (groups * units)
            < split_share(groups, units, filter_tiles, split, repacking, windowing) - 1e-9)


def parts_per_thread(spec, split, units, machine):
    """Window parts per thread for the thread split ``split`` (window parts, filter parts) of
    ``units`` window units: up to PARTS_PER_THREAD, each part with at least the record's
    ``part_min_flops`` (the work worth a hand-off), while a thread's filters stay in L2 from one
    of its window parts to the next (each reads its filter part again); 1 on one thread."""
    a, b = split
    if a * b == 1 or machine.tuning.part_min_flops <= 0:
        return 1
    filter_bytes = spec.k * spec.c_per_group * spec.r * spec.s * spec.itemsize
    if filter_bytes / b > machine.l2 / 2:
        return 1
    worth = int(spec.flops // (a * b * machine.tuning.part_min_flops))
    return max(1, min(PARTS_PER_THREAD, units // a, worth))
