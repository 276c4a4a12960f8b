"""CSA's entry point: a depthwise plan for one input channel per group, else a slicing plan;
and the plans autotuning times besides the model's."""
from dataclasses import replace

from .blocking import SCHEDULES
from .depthwise import DEPTHWISE_OVERRIDES, analyze_depthwise
from .register_blocking import DIRECT_SLABS, FILTER_SLABS, TILE_VECTORS, WINDOW_SLABS
from .overrides import SLICING_OVERRIDES, check_overrides
from .slicing import SlicingPlan, analyze_slicing

TUNE_CANDIDATES = 8   # plans autotuning times per convolution, the model's included


def uses_depthwise(c_per_group, overrides):
    """Whether convolutions with ``c_per_group`` input channels per group get a depthwise plan
    (C/groups = 1, unless the override ``depthwise`` is False), given normalised
    ``overrides``; ValueError when an override does not apply to that plan."""
    depthwise = overrides.get("depthwise", c_per_group == 1)
    if depthwise and c_per_group != 1:
        raise ValueError(f"depthwise override: {c_per_group} channels per group, a depthwise "
                         "plan needs 1")
    allowed = DEPTHWISE_OVERRIDES if depthwise else SLICING_OVERRIDES
    other = sorted(set(overrides) - set(allowed) - {"depthwise"})
    if other:
        raise ValueError(f"plan overrides {other} do not apply to a "
                         + ("depthwise plan; depthwise=False plans it as a grouped convolution"
                            if depthwise else "slicing plan"))
    return depthwise


def analyze(spec, machine=None, *, threads=1, **overrides):
    """Plan ``spec`` for ``machine`` (default: ``Machine.host()``) and up to ``threads``
    threads: ``analyze_depthwise`` when C/groups = 1 (unless ``depthwise=False``), else
    ``analyze_slicing``. Keyword overrides (``csa.OVERRIDES``) force a value of either plan;
    one the chosen plan does not have raises ValueError."""
    given = check_overrides(**overrides)
    run = analyze_depthwise if uses_depthwise(spec.c_per_group, given) else analyze_slicing
    given.pop("depthwise", None)
    return run(spec, machine, threads=threads, **given)


def tuning_candidates(spec, machine=None, threads=1, limit=TUNE_CANDIDATES):
    """[(overrides, plan)]: the plans autotuning times for ``spec``, the model's own first
    (overrides {}), then the choices the model is least sure of: the other orientations
    (windows in vectors, packed or from a slab; filters in vectors; direct), the other
    schedule, the model's other fastest micro-tiles in its orientation, the other thread
    splits. At most ``limit`` distinct plans (plans differing only in their costs count once)."""
    model = analyze(spec, machine, threads=threads)
    options = [{}]
    if isinstance(model, SlicingPlan):
        options += [{"vector": "windows", "slab": False}, {"vector": "windows", "slab": True},
                    {"vector": "filters", "slab": False}, {"vector": "filters", "slab": True}]
        options.append({"schedule": next(s for s in SCHEDULES if s != model.schedule)})
        slabs = (DIRECT_SLABS if model.direct else FILTER_SLABS if model.vector == "filters"
                 else WINDOW_SLABS)
        lanes = TILE_VECTORS * model.machine.vector_bytes // spec.itemsize
        for b in sorted(model.machine.tuning.broadcast_counts(model.machine.vector_registers,
                                                              TILE_VECTORS, slabs), reverse=True):
            shape = (b, lanes) if model.vector == "filters" else (lanes, b)
            options.append({"vector": model.vector, "slab": model.slab, "microtile_shape": shape})
    if threads > 1:
        options += [{"split": (1, 1)}, {"split": (threads, 1)}, {"split": (1, threads)}]
    found = []
    for overrides in options:
        try:
            plan = analyze(spec, machine, threads=threads, **overrides)
        except ValueError:   # an orientation or slab this convolution cannot take
            continue
        if all(replace(plan, forced=()) != replace(p, forced=()) for _, p in found):
            found.append((overrides, plan))
        if len(found) == limit:
            break
    return found
