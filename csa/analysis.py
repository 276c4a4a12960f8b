"""CSA's entry point: a depthwise plan for one input channel per group, else a slicing plan;
and the plans autotuning times besides the model's."""
from dataclasses import replace
from typing import Optional, Union

from .blocking import SCHEDULES
from .depthwise import DepthwisePlan, analyze_depthwise
from .machine import Machine
from .spec import ConvSpec
from .register_blocking import (DIRECT_VARIANTS, FILTER_VARIANTS, TILE_VECTORS, WINDOW_VARIANTS,
                                microtile)
from .overrides import check_overrides
from .slicing import SlicingPlan, analyze_slicing

TUNE_CANDIDATES = 8   # plans autotuning times per convolution, the model's included


def analyze(spec: ConvSpec, machine: Optional[Machine] = None, *, threads: int = 1,
            layout: str = "nchw", **overrides) -> Union[SlicingPlan, DepthwisePlan]:
    """Plan ``spec`` for ``machine`` (default: ``Machine.host()``) and up to ``threads``
    threads: a ``DepthwisePlan`` when C/groups = 1 (unless ``depthwise=False``), else a
    ``SlicingPlan``. ``layout`` "blocked" plans it on channel-blocked activations (blocks of
    the vector lanes, ``csa.layout.blocked_fits``: ValueError for a convolution that cannot
    take them), "nhwc" as blocked on channels-last ones (``csa.layout.LAYOUTS``). Keyword overrides (``csa.OVERRIDES``) force a value of either plan;
    one the chosen plan does not have raises ValueError (see ``check_overrides``)."""
    depthwise, given = check_overrides(spec.c_per_group, **overrides)
    given.pop("depthwise", None)
    machine = machine or Machine.host()
    run = analyze_depthwise if depthwise else analyze_slicing
    return run(spec, machine, threads, given, layout)


def filters_per_tile(machine, itemsize, depthwise):
    """The filter tile of the plans most convolutions get (windows in vectors; a depthwise
    plan's one filter a row), to pack filters before the input's shape is known."""
    return DepthwisePlan.nf if depthwise else microtile(machine, itemsize)[1]


def tuning_candidates(spec, machine=None, threads=1, limit=TUNE_CANDIDATES):
    """[(overrides, plan)]: the plans autotuning times for ``spec``, the model's own first
    (overrides {}), then the choices the model is least sure of: the other orientations
    (windows in vectors, packed or from a slab; filters in vectors; direct), the other
    schedule, the model's other fastest micro-tiles in its orientation, the other thread
    splits. At most ``limit`` distinct plans (plans differing only in their costs count once)."""
    model = analyze(spec, machine, threads=threads)
    options = [{}]
    if isinstance(model, SlicingPlan):
        options += [{"vectors_along": along, "slab": slab}
                    for along in ("windows", "filters") for slab in (False, True)]
        options.append({"schedule": next(s for s in SCHEDULES if s != model.schedule)})
        filters = model.vectors_along == "filters"
        variants = (DIRECT_VARIANTS if model.direct else FILTER_VARIANTS if filters
                    else WINDOW_VARIANTS)
        lanes = TILE_VECTORS * model.machine.vector_bytes // spec.itemsize
        for b in sorted(model.machine.tuning.broadcast_counts(model.machine.vector_registers,
                                                              TILE_VECTORS, variants), reverse=True):
            options.append({"vectors_along": model.vectors_along, "slab": model.slab,
                            "microtile_shape": (b, lanes) if filters else (lanes, b)})
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
