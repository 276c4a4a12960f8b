"""cso: fast CPU 2-D convolutions for NumPy arrays, by convolution slicing (SConv)."""
from microkernels import cache

from .activations import Activation, activate
from .api import Conv2d, conv2d, warmup
from .arguments import same_padding
from .layouts import Blocked
from .autotune import tune
from .host import host_machine
from .threads import get_num_threads, get_spin, set_num_threads, set_spin, workers_asleep

__all__ = ["Activation", "Blocked", "Conv2d", "activate", "conv2d", "host_machine", "get_num_threads",
           "get_spin", "same_padding", "set_num_threads", "set_spin", "tune", "warmup",
           "workers_asleep"]
__version__ = "0.1.0"

# cso's loop nests, pool and records are made by its code from csa's plans
cache.include_sources(__name__, "csa")
