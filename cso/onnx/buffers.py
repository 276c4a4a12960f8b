"""Output arrays a model reuses from step to step and run to run.

A fresh ``np.empty`` of a few MiB is new memory to the OS: writing it costs a page fault per
4 KiB page, about as much as a 1x1 convolution of the same output (ResNet-50's 1x1 layers ran
1.5-2.5x slower in a model than alone on Zen 3 before this pool). An
array here is handed out again only when nothing else refers to it: no value of a run in
progress, no view of it, no other thread. Graph outputs never come from here (the caller keeps
them), so the arrays kept are at most the ones live at once in a run, per concurrent run.

Each array starts on a cache line (``cso.jobs.aligned_empty``: the next layer's kernels read it
with vector loads) and is a view of a byte array, which every view of it refers to. The array
is kept with its byte array and handed out as is (making the view again costs more than the
rest of a small convolution's call): it is free when neither it nor its byte array has a
reference besides the pool's.
"""
import sys
import threading
from collections import defaultdict

import numpy as np

from ..jobs import aligned_empty

# references to a free array and to its byte array while ``get`` looks at them: the pool's
# pair's, the loop variable's and getrefcount's argument, and for the byte array the array's
# ``base``
_FREE_ARRAY_REFS, _FREE_BYTES_REFS = 3, 4


class Buffers:
    def __init__(self):
        self._arrays = defaultdict(list)   # (shape, dtype) -> (array, its byte array) pairs
        self._lock = threading.Lock()

    def get(self, shape, dtype):
        """An array of ``shape`` and ``dtype`` that nothing else refers to."""
        key = (tuple(shape), np.dtype(dtype))
        with self._lock:
            pairs = self._arrays[key]
            for array, raw in pairs:
                if (sys.getrefcount(array) == _FREE_ARRAY_REFS
                        and sys.getrefcount(raw) == _FREE_BYTES_REFS):
                    return array
            array = aligned_empty(*key)
            pairs.append((array, array.base))
            return array

    def owns(self, array):
        """Whether ``array`` is one of the arrays here or a view of one."""
        while array.base is not None:
            array = array.base
        with self._lock:
            return any(raw is array for pairs in self._arrays.values() for _, raw in pairs)

    def clear(self):
        with self._lock:
            self._arrays.clear()

    @property
    def nbytes(self):
        with self._lock:
            return sum(raw.nbytes for pairs in self._arrays.values() for _, raw in pairs)
