"""Plan overrides: values a caller forces instead of the rules' (tests, what-if analysis,
autotuning), checked in one place."""
import numbers

from .blocking import SCHEDULES

VECTORS = ("windows", "filters")  # the dimension the micro-kernel's vectors run along


SLICING_OVERRIDES = ("vector", "microtile_shape", "nc", "k2", "k3", "schedule", "slab", "band",
                     "split")
# every override: the slicing plan's, the depthwise plan's vectors per kernel block, and the
# choice of analysis (depthwise=False plans a one-channel-per-group convolution as grouped)
OVERRIDES = SLICING_OVERRIDES + ("vectors", "depthwise")


def check_overrides(**overrides):
    """The overrides normalised (plain ints, tuples; None = unset, dropped). Raises TypeError
    for an unknown name or a non-integer, ValueError for a bad value."""
    normal = {}
    for name, v in overrides.items():
        if name not in OVERRIDES:
            raise TypeError(f"unknown plan override {name!r}; known: {OVERRIDES}")
        if v is None:
            continue
        if name in ("slab", "depthwise"):
            if not isinstance(v, bool):
                raise TypeError(f"{name} override must be True or False, got {v!r}")
            normal[name] = v
        elif name in ("schedule", "vector"):
            choices = SCHEDULES if name == "schedule" else VECTORS
            if v not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {v!r}")
            normal[name] = v
        elif name in ("microtile_shape", "split"):
            if not isinstance(v, (tuple, list)) or len(v) != 2:
                shape = "(nwin, nf)" if name == "microtile_shape" else "(window parts, filter parts)"
                raise ValueError(f"{name} override must be {shape}, got {v!r}")
            normal[name] = tuple(_positive_int(name, x) for x in v)
        else:
            normal[name] = _positive_int(name, v)
    return normal


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} override must be an int, got {v!r}")
    if v < 1:
        raise ValueError(f"{name} override must be >= 1, got {v!r}")
    return int(v)


def forced_note(plan, *names):
    hit = [n for n in names if n in plan.forced]
    return f" [forced: {', '.join(hit)}]" if hit else ""
