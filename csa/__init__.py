"""CSA: Convolution Slicing Analysis. Pure Python: no numba, no llvmlite, no arrays."""
from .machine import Machine, parse_size, read_sysfs_caches
from .plan import OVERRIDES, SCHEDULES, SlicingPlan, analyze, channel_tile, check_overrides, microtile
from .spec import ConvSpec

__all__ = ["Machine", "parse_size", "read_sysfs_caches", "OVERRIDES", "SCHEDULES", "SlicingPlan", "analyze", "check_overrides",
           "channel_tile", "microtile", "ConvSpec"]
