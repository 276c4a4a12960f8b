"""cso: fast CPU 2-D convolutions for NumPy arrays, by convolution slicing (SConv)."""
from .api import Conv2d, conv2d, host_machine

__all__ = ["Conv2d", "conv2d", "host_machine"]
__version__ = "0.1.0"
