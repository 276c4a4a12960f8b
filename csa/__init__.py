"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays."""
from .machine import Machine, parse_size, read_sysfs_caches
from .plan import SCHEDULES, SlicingPlan, analyze, channel_tile, microtile
from .spec import ConvSpec

__all__ = ["Machine", "parse_size", "read_sysfs_caches", "SCHEDULES", "SlicingPlan", "analyze",
           "channel_tile", "microtile", "ConvSpec"]
