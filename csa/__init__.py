"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays.

``analyze`` is the one decision point: a convolution (``ConvSpec``) and a machine (``Machine``,
with its ISA's tuning record) in, a plan out (``SlicingPlan`` or ``DepthwisePlan``), which
carries every choice and the geometry they imply; the lowering (``cso``) only executes it.
"""
from . import tuning
from .analysis import TUNE_CANDIDATES, analyze, tuning_candidates, uses_depthwise
from .blocking import SCHEDULES, channel_tile, direct_channel_tile
from .depthwise import DepthwisePlan, analyze_depthwise, is_depthwise, moved_bytes
from .layout import window_units
from .machine import Machine, parse_size, read_sysfs_caches
from .register_blocking import filter_vector_tile, microtile
from .overrides import OVERRIDES, VECTORS, check_overrides
from .slicing import SlicingPlan, analyze_slicing
from .spec import ConvSpec
from .thread_split import thread_split
from .tuning import Tuning
from .variants import choose_vector, padded_work, use_direct

__all__ = ["TUNE_CANDIDATES", "analyze", "tuning_candidates", "uses_depthwise", "SCHEDULES",
           "channel_tile", "direct_channel_tile", "DepthwisePlan", "analyze_depthwise",
           "is_depthwise", "moved_bytes", "window_units", "Machine", "parse_size",
           "read_sysfs_caches", "filter_vector_tile", "microtile", "OVERRIDES", "VECTORS",
           "check_overrides", "SlicingPlan", "analyze_slicing", "ConvSpec", "thread_split",
           "Tuning", "tuning", "choose_vector", "padded_work", "use_direct"]
