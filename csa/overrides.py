"""Plan overrides: values a caller forces instead of the rules' (tests, what-if analysis,
autotuning), checked here and nowhere else."""
import numbers

from .blocking import SCHEDULES

VECTORS_ALONG = ("windows", "filters")  # the dimension the micro-kernel's vectors run along
SLICING_OVERRIDES = ("vectors_along", "microtile_shape", "nc", "k2", "k3", "schedule", "slab",
                     "band", "split")
DEPTHWISE_OVERRIDES = ("block_vectors", "nc", "band", "split")
# every override; ``depthwise`` chooses the analysis (False plans a one-channel-per-group
# convolution as grouped)
OVERRIDES = tuple(dict.fromkeys(SLICING_OVERRIDES + DEPTHWISE_OVERRIDES + ("depthwise",)))


def check_overrides(c_per_group, **overrides):
    """(depthwise, overrides normalised: plain ints and tuples, None = unset dropped) for a
    convolution of ``c_per_group`` input channels per group, which
    gets a depthwise plan when it is 1, unless ``depthwise=False``. Raises TypeError for an
    unknown name or a value of the wrong type, ValueError for a bad value or one the plan does
    not have."""
    normal = {}
    for name, v in overrides.items():
        if name not in OVERRIDES:
            raise TypeError(f"unknown plan override {name!r}; known: {OVERRIDES}")
        if v is not None:
            normal[name] = _checked(name, v)
    depthwise = normal.get("depthwise", c_per_group == 1)
    if depthwise and c_per_group != 1:
        raise ValueError(f"depthwise override: {c_per_group} channels per group, a depthwise "
                         "plan needs 1")
    allowed = (DEPTHWISE_OVERRIDES if depthwise else SLICING_OVERRIDES) + ("depthwise",)
    other = sorted(set(normal) - set(allowed))
    if other:
        raise ValueError(f"plan overrides {other} do not apply to a "
                         + ("depthwise plan; depthwise=False plans it as a grouped convolution"
                            if depthwise else "slicing plan"))
    return depthwise, normal


def _checked(name, v):
    if name in ("slab", "depthwise"):
        if not isinstance(v, bool):
            raise TypeError(f"{name} override must be True or False, got {v!r}")
        return v
    if name in ("schedule", "vectors_along"):
        choices = SCHEDULES if name == "schedule" else VECTORS_ALONG
        if v not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {v!r}")
        return v
    if name in ("microtile_shape", "split"):
        if not isinstance(v, (tuple, list)) or len(v) != 2:
            shape = "(nwin, nf)" if name == "microtile_shape" else "(window parts, filter parts)"
            raise ValueError(f"{name} override must be {shape}, got {v!r}")
        return tuple(_positive_int(name, x) for x in v)
    return _positive_int(name, v)


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} override must be an int, got {v!r}")
    if v < 1:
        raise ValueError(f"{name} override must be >= 1, got {v!r}")
    return int(v)


def forced_note(plan, *names):
    """" [forced: ...]" naming those of ``names`` the plan took from an override."""
    hit = [n for n in names if n in plan.forced]
    return f" [forced: {', '.join(hit)}]" if hit else ""
