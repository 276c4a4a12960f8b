"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays."""
from .analysis import TUNE_CANDIDATES, analyze, tuning_candidates, uses_depthwise
from .depthwise import DepthwisePlan, analyze_depthwise, is_depthwise, moved_bytes
from .machine import Machine, parse_size, read_sysfs_caches
from .plan import (OVERRIDES, SCHEDULES, VECTORS, SlicingPlan, analyze_slicing, channel_tile,
                   check_overrides, choose_vector, direct_channel_tile, filter_vector_tile,
                   microtile, padded_work, thread_split, use_direct, window_units)
from .spec import ConvSpec
from .tuning import Tuning
from . import tuning

__all__ = ["TUNE_CANDIDATES", "analyze", "tuning_candidates", "uses_depthwise", "DepthwisePlan", "analyze_depthwise", "is_depthwise",
           "moved_bytes",
           "Machine", "parse_size", "read_sysfs_caches", "OVERRIDES", "SCHEDULES", "VECTORS",
           "SlicingPlan", "analyze_slicing", "channel_tile", "check_overrides", "choose_vector",
           "direct_channel_tile", "filter_vector_tile", "microtile", "padded_work",
           "thread_split", "use_direct", "window_units", "ConvSpec", "Tuning", "tuning"]
