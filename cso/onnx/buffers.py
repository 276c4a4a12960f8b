"""Output arrays a model reuses from step to step and run to run.

A fresh ``np.empty`` of a few MiB is new memory to the OS: writing it costs a page fault per
4 KiB page, about as much as a 1x1 convolution of the same output (ResNet-50's 1x1 layers ran
1.5-2.5x slower in a model than alone on Zen 3 before this pool). An
array here is handed out again only when nothing else refers to it: no value of a run in
progress, no view of it, no other thread. Graph outputs never come from here (the caller keeps
them), so the arrays kept are at most the ones live at once in a run, per concurrent run.

Each array starts on a cache line (``packing.aligned_empty``: the next layer's kernels read it
with vector loads) and is a view of a byte array, which every view of it refers to: that byte
array's references say whether the array is free.
"""
import sys
import threading
from collections import defaultdict

import numpy as np

from packing import aligned_empty, aligned_view

# references to a free byte array while ``get`` looks at it: the list's, the loop variable's
# and getrefcount's argument
_FREE_REFS = 3


class Buffers:
    def __init__(self):
        self._arrays = defaultdict(list)   # (shape, dtype) -> byte arrays handed out before
        self._lock = threading.Lock()

    def get(self, shape, dtype):
        """An array of ``shape`` and ``dtype`` that nothing else refers to."""
        key = (tuple(shape), np.dtype(dtype))
        with self._lock:
            arrays = self._arrays[key]
            for raw in arrays:
                if sys.getrefcount(raw) == _FREE_REFS:
                    return aligned_view(raw, *key)
            array = aligned_empty(*key)
            arrays.append(array.base)
            return array

    def clear(self):
        with self._lock:
            self._arrays.clear()

    @property
    def nbytes(self):
        with self._lock:
            return sum(a.nbytes for arrays in self._arrays.values() for a in arrays)
