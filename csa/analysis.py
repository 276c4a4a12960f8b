"""CSA's entry point: a depthwise plan for one input channel per group, else a slicing plan."""
from .depthwise import DEPTHWISE_OVERRIDES, analyze_depthwise
from .plan import SLICING_OVERRIDES, analyze_slicing, check_overrides


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
