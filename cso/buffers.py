"""The memory a model's values live in, reused from step to step and run to run.

A fresh ``np.empty`` of a few MiB is new memory to the OS: writing it costs a page fault per
4 KiB page, about as much as a 1x1 convolution of the same output (ResNet-50's 1x1 layers ran
1.5-2.5x slower in a model than alone on Zen 3 before this pool). So values are arrays made on
byte blocks kept here, and a block is handed out again only when nothing else refers to it: no
value of a run in progress, no view of it, no other thread (every array made on a block has the
block as its ``base``). Graph outputs never come from here (the caller keeps them).

A value takes the smallest free block that holds it, if that block is at most ``SLACK`` times
its bytes, else a new block of its own: values of any shape whose lives do not overlap share
memory (DenseNet's Concat outputs, each of a shape of its own: 689 MiB of arrays by shape at
batch 8; 181 MiB of blocks so shared). A recorded program does better with a plan of its
values' offsets (``cso.onnx.arena``: 55 MiB); this pool serves the runs without one (a model's
runs that find its program busy, timed runs), and what a plan did not foresee.

Each array starts on a cache line (the next layer's kernels read it with vector loads). The
last array made on a block is kept with it and handed out as is when asked for again (making
one costs about a microsecond, more than the rest of a small convolution's call).

``cso.Conv2d`` takes its outputs of ``LARGE_OUTPUT_BYTES`` and more from a pool of a few
blocks (``large_outputs``): glibc maps such a block anew at each call (past its mmap
threshold, 32 MiB at most) and the OS zeroes each page as the convolution first writes it.
72 -> 432 1x1 at 238 x 238 (a 98 MB output) took 40.5 ms a call at 1 thread, 32.5 ms into
an ``out`` array and 30.7 ms from the pool (Xeon); a layer called again and again (a
benchmark, batches) has dropped its last output by its next call.
"""
import math
import sys
import threading

import numpy as np

from microkernels.once import fork_safe_lock

from .jobs import LINE, data_address

# outputs from this size up come from ``large_outputs``: smaller ones glibc serves from its heap
# once it has freed one (its mmap threshold follows the blocks it unmaps)
LARGE_OUTPUT_BYTES = 32 << 20
# a block serves a value of at least 1/SLACK of its bytes: a smaller value would keep the room
# a larger one needs later from it
SLACK = 2
# references to a block and to its last array while ``unreferenced`` looks at them: the pool's
# entry's, ``unreferenced``'s variable and getrefcount's argument, and for the block its
# array's ``base``
_BLOCK_REFS, _ARRAY_REFS = 3, 3


class Buffers:
    def __init__(self, most=None, lock=None):
        # [block (bytes, a line more than it holds), offset of its first line, last array],
        # most recently handed out last; at most ``most`` blocks (None: any number), the
        # least recently handed out let go first (its arrays still in use keep it)
        self._blocks = []
        self._most = most
        self._lock = lock or threading.Lock()

    def get(self, shape, dtype):
        """An array of ``shape`` and ``dtype`` that nothing else refers to."""
        shape, dtype = tuple(shape), np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            for entry in self._blocks:   # the array asked for again (the usual case)
                # (no variable of this frame holds the array while ``unreferenced`` counts
                # its references)
                if (entry[2] is not None and entry[2].shape == shape
                        and entry[2].dtype == dtype and unreferenced(entry)):
                    self._recent(entry)
                    return entry[2]
            fit = None
            for entry in self._blocks:
                room = entry[0].nbytes - LINE
                if (nbytes <= room <= SLACK * nbytes
                        and (fit is None or room < fit[0].nbytes - LINE) and unreferenced(entry)):
                    fit = entry
            if fit is None:
                block = np.empty(nbytes + LINE, np.uint8)
                fit = [block, -data_address(block) % LINE, None]
                self._blocks.append(fit)
                if self._most is not None:
                    del self._blocks[:-self._most]
            self._recent(fit)
            fit[2] = None   # (its old array's reference to the block goes before the new one)
            fit[2] = np.ndarray(shape, dtype, fit[0], fit[1])
            return fit[2]

    def _recent(self, entry):
        """Move ``entry`` to the end of the blocks: the most recently handed out."""
        if self._most is not None:   # (by identity: an entry holds arrays)
            at = next(i for i, other in enumerate(self._blocks) if other is entry)
            self._blocks.append(self._blocks.pop(at))

    def owns(self, array):
        """Whether ``array`` is one of the arrays here or a view of one."""
        while array.base is not None:
            array = array.base
        with self._lock:
            return any(block is array for block, _, _ in self._blocks)

    def clear(self):
        with self._lock:
            self._blocks.clear()

    @property
    def nbytes(self):
        with self._lock:
            return sum(block.nbytes for block, _, _ in self._blocks)


def unreferenced(entry):
    """Whether nothing refers to the ``entry``'s block and its last array but the pool."""
    block, _, last = entry
    return (sys.getrefcount(block) == _BLOCK_REFS + (last is not None)
            and (last is None or sys.getrefcount(last) == _ARRAY_REFS))


# the last outputs of ``LARGE_OUTPUT_BYTES`` and more, in use or dropped: at most two blocks
# kept (a process's own pool: its lock one that ``os.fork`` leaves free in the child)
large_outputs = Buffers(most=2, lock=fork_safe_lock())
