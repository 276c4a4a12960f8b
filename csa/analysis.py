"""CSA's entry point: a depthwise plan for one input channel per group, else a slicing plan."""
from .depthwise import DEPTHWISE_OVERRIDES, analyze_depthwise, is_depthwise
from .plan import SLICING_OVERRIDES, analyze_slicing, check_overrides


def analyze(spec, machine=None, *, threads=1, **overrides):
    """Plan ``spec`` for ``machine`` (default: ``Machine.host()``) and up to ``threads``
    threads: ``analyze_depthwise`` when C/groups = 1 (unless ``depthwise=False``), else
    ``analyze_slicing``. Keyword overrides (``csa.OVERRIDES``) force a value of either plan;
    one the chosen plan does not have raises ValueError."""
    given = check_overrides(**overrides)
    depthwise = given.pop("depthwise", is_depthwise(spec))
    if depthwise and not is_depthwise(spec):
        raise ValueError(f"depthwise override: {spec} has {spec.c_per_group} channels per group, "
                         "a depthwise plan needs 1")
    other = sorted(set(given) - set(DEPTHWISE_OVERRIDES if depthwise else SLICING_OVERRIDES))
    if other:
        kind = "a depthwise" if depthwise else "a slicing"
        raise ValueError(f"plan overrides {other} do not apply to {kind} plan"
                         + ("; depthwise=False plans it as a grouped convolution" if depthwise
                            else ""))
    run = analyze_depthwise if depthwise else analyze_slicing
    return run(spec, machine, threads=threads, **given)
