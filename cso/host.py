"""The host as the planner sees it, shared by the API, autotuning and the command line: the
machine CSA plans for, the plan cache, the kernel ISA check and convolution names."""
from functools import lru_cache
from typing import Optional

import csa
from microkernels import default_isa, get_isa, supported_isas

from .calibration import calibrated_machine


@lru_cache(maxsize=None)
def host_machine(isa_name: Optional[str] = None) -> csa.Machine:
    """The machine CSA plans for: the host's caches, the vector facts of the kernel ISA and its
    tuning record as this host's calibration corrects it (``cso.calibration``)."""
    return calibrated_machine(isa_name or default_isa().name)


@lru_cache(maxsize=1024)
def plan(spec, isa_name, overrides, threads, layout="nchw"):
    """CSA's plan of ``spec`` for kernels of ``isa_name`` on up to ``threads`` threads, with
    ``overrides`` (a sorted tuple of checked ``csa.check_overrides`` items), on activations of
    ``layout``; cached."""
    return csa.analyze(spec, host_machine(isa_name), threads=threads, layout=layout,
                       **dict(overrides))


def check_isa(name):
    """The name of kernel ISA ``name`` (None: the default, ``CSO_ISA`` or the host's best);
    ValueError when this CPU cannot run it."""
    if name is None:
        return default_isa().name
    isa = get_isa(name)
    if isa not in supported_isas():
        raise ValueError(f"isa {name!r} is not supported by this CPU; supported: "
                         f"{[i.name for i in supported_isas()]}")
    return isa.name


def as_spec(spec, caller):
    """A ``csa.ConvSpec`` given as one or as its name (``"n1c64h56w56k64r3s3p1u1"``), to
    ``caller`` (named in the TypeError for anything else)."""
    if isinstance(spec, str):
        spec = csa.ConvSpec.parse(spec)
    if not isinstance(spec, csa.ConvSpec):
        raise TypeError(f"{caller}: convolutions must be csa.ConvSpec or their names, got "
                        f"{type(spec).__name__}")
    return spec
