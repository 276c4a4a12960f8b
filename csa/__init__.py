"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays."""
from .machine import Machine, parse_size, read_sysfs_caches
from .plan import (OVERRIDES, SCHEDULES, VECTORS, SlicingPlan, analyze, channel_tile, check_overrides,
                   choose_vector, direct_channel_tile, filter_vector_tile, microtile,
                   padded_work, thread_split, use_direct, window_units)
from .spec import ConvSpec

__all__ = ["Machine", "parse_size", "read_sysfs_caches", "OVERRIDES", "SCHEDULES", "VECTORS", "SlicingPlan", "analyze", "check_overrides",
           "choose_vector", "direct_channel_tile", "filter_vector_tile", "padded_work",
           "thread_split", "use_direct", "window_units",
           "channel_tile", "microtile", "ConvSpec"]
