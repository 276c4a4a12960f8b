"""Arrays whose data start on a cache line.

A kernel's vector loads from an array that starts 16 bytes into a line (where glibc puts large
blocks) cross a line boundary every other time: a 1x1 convolution reading 256 planes of 56 x 56
in place ran 15% slower from such an input than from one on a line (Zen 3). NumPy aligns to 16
bytes only; these arrays are views of a byte array one line longer, which owns the memory (their
``base``)."""
import ctypes
import math

import numpy as np

LINE = 64
PAGE = 4096


def aligned_empty(shape, dtype, align=LINE):
    """An uninitialised C-contiguous array of ``shape`` (a tuple or an int) and ``dtype``
    starting on an ``align``-byte boundary (a cache line, or a ``PAGE``)."""
    shape = shape if type(shape) is tuple else tuple(shape) if np.iterable(shape) else (shape,)
    dtype = np.dtype(dtype)
    raw = np.empty(dtype.itemsize * math.prod(shape) + align, np.uint8)
    return np.ndarray(shape, dtype, raw, -data_address(raw) % align)


def part_stride(nbytes):
    """Bytes from one part's share of a scratch buffer to the next, for a share of ``nbytes``
    (the buffer starting on a ``PAGE``): whole pages, so that no two parts' shares meet in a
    page. A core's prefetchers fetch lines ahead of its accesses within their page: two parts
    on two cores whose shares met in one, a line apart, took turns at the lines there (a
    grouped 3x3 whose packing filled 4.6 KiB shares ran one part 1.8x slower beside the other
    than alone)."""
    return -(-nbytes // PAGE) * PAGE


_HEADER = object.__basicsize__          # PyArrayObject: the object header, then char *data
_read_address = ctypes.c_size_t.from_address


def data_address(array):
    """The address of ``array``'s data, read from the array object itself (NumPy's C ABI),
    0.2 us against 1.4 us for ``array.ctypes.data``: a convolution's call reads five to seven
    (its arguments, a new output's alignment)."""
    return _read_address(id(array) + _HEADER).value


# where an array object holds its data's address, for compiled code handed the object itself
# (``id``); None where the layout is not CPython's (then ``data_address`` reads it the slow way)
DATA_OFFSET = _HEADER
_probe = np.empty(3)
if data_address(_probe) != _probe.ctypes.data:
    DATA_OFFSET = None

    def data_address(array):   # noqa: F811
        return array.ctypes.data
del _probe
