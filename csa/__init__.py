"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays.

``analyze`` is the one decision point: a convolution (``ConvSpec``) and a machine (``Machine``,
with its ISA's tuning record) in, a plan out (``SlicingPlan`` or ``DepthwisePlan``) that
carries every choice and the geometry they imply; the lowering (``cso``) only executes it.
The rules live in one module per loop around the micro-kernel: ``register_blocking`` (the
micro-tile), ``variants`` (orientation, slab or packed), ``blocking`` (channel tile, K2/K3 and
the cost model), ``bands``, ``thread_split``; ``layout`` is the geometry they share.
"""
from . import tuning
from .analysis import TUNE_CANDIDATES, analyze, filters_per_tile, tuning_candidates
from .depthwise import DepthwisePlan, is_depthwise, moved_bytes
from .machine import Machine, parse_size, read_sysfs_caches
from .overrides import OVERRIDES, check_overrides
from .slicing import SlicingPlan
from .spec import ConvSpec
from .tuning import Tuning

__all__ = ["ConvSpec", "Machine", "Tuning", "tuning", "analyze", "SlicingPlan", "DepthwisePlan",
           "OVERRIDES", "check_overrides", "filters_per_tile", "tuning_candidates",
           "TUNE_CANDIDATES", "is_depthwise", "moved_bytes", "parse_size", "read_sysfs_caches"]
