"""A recorded program's values at offsets planned in one arena, as onnxruntime's memory pattern
planner and TFLite's arena planner place them.

A program's runs ask for the same arrays in the same order, run after run. So a first run of
its input shapes gives its values fresh arrays and logs them (``Sizing``): each one's shape,
and when it died (the count of arrays asked for by then; a program's own references keep the
values it resumes from alive to the end). ``Sizing.plan`` then places them in one arena, the
largest first, each at the lowest offset clear of the values whose lives overlap its own
(greedy by size). The program's recording run and its replays take their arrays at those
offsets (``Planned``), in the same order. A pool of blocks, each reused for values of about
its size (``cso.buffers``), kept one block per value live at once in the largest run, and
more where sizes did not fit: ShuffleNet's values took 42.9 MiB of blocks at batch 8, of which
15.7 MiB were live at once.

The plan is trusted no further than it holds: an array is handed out at its offset only if it
is the one planned there (shape and dtype) and nothing refers any more to the arrays planned
in the same bytes; else it comes from a pool of blocks of the program's own.
"""
import ctypes
import math
import mmap
import weakref

import numpy as np

from ..jobs import LINE, data_address
from ..buffers import Buffers, unreferenced


class Plan:
    """The arrays a program's runs ask for, in order (shape, dtype), and their offsets in an
    arena of ``nbytes``."""

    def __init__(self, requests, offsets, nbytes):
        self.requests, self.offsets, self.nbytes = requests, offsets, nbytes


class Sizing:
    """The pool of a program's first run: fresh arrays, each logged with when it died."""

    def __init__(self):
        self.count = 0        # arrays asked for so far
        self.requests = []    # (shape, dtype) of each
        self.deaths = []      # the count when each died; None while it lives

    def get(self, shape, dtype):
        shape, dtype = tuple(shape), np.dtype(dtype)
        # pages of its own, given back to the OS when the array and its views die (NumPy's
        # arrays freed stay in malloc's heap, and their holes grew ShuffleNet's first run at
        # batch 8 to 1.6x the peak of its values)
        memory = mmap.mmap(-1, max(1, math.prod(shape) * dtype.itemsize))
        weakref.finalize(memory, self._died, self.count)
        self.requests.append((shape, dtype))
        self.deaths.append(None)
        self.count += 1
        return np.ndarray(shape, dtype, memory)

    def _died(self, index):
        self.deaths[index] = self.count

    def owns(self, array):   # its arrays are the run's alone: nothing to copy out of them
        return False

    def plan(self):
        """The ``Plan`` of the arrays asked for, those still alive living to the end."""
        sizes = [-(-math.prod(shape) * dtype.itemsize // LINE) * LINE
                 for shape, dtype in self.requests]
        ends = [self.count + 1 if death is None else death for death in self.deaths]
        offsets, placed = [0] * len(sizes), []
        for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
            # the placed arrays alive while this one is (asked for before it died, and it
            # before they did), by offset; it goes in the first gap that holds it
            offset = 0
            alive = [other for other in placed if other < ends[index] and index < ends[other]]
            for lo, hi in sorted((offsets[other], offsets[other] + sizes[other])
                                 for other in alive):
                if lo - offset >= sizes[index]:
                    break
                offset = max(offset, hi)
            offsets[index] = offset
            placed.append(index)
        return Plan(list(self.requests), offsets,
                    max((o + s for o, s in zip(offsets, sizes)), default=0))


def new_arena(nbytes):
    """Bytes for a plan of ``nbytes`` (a line more: its offsets count from the first line), in
    pages of their own: given back to the OS when the arena goes (malloc kept a freed arena
    of a dropped model's in its heap, once the size of a block it had freed before).
    """
    return np.frombuffer(mmap.mmap(-1, nbytes + LINE), np.uint8)


class Planned:
    """A program's pool: its arrays at the ``plan``'s offsets in ``arena``, asked for in the
    plan's order from ``count`` (``rewind``)."""

    def __init__(self, arena, plan):
        self.count = 0
        self._plan = plan
        first = -data_address(arena) % LINE
        self._starts = np.array(plan.offsets, np.int64)
        self._stops = self._starts + [math.prod(shape) * dtype.itemsize
                                      for shape, dtype in plan.requests]
        # each planned array's bytes as an object of their own, which the arrays made on
        # them have as their base (so that references to them are counted:
        # ``unreferenced``); and the last array made there
        self._slots = [[(ctypes.c_uint8 * int(stop - start)).from_buffer(arena, first + start),
                        0, None] for start, stop in zip(self._starts, self._stops)]
        self._spill = Buffers()   # arrays the plan does not hold

    def rewind(self, count):
        self.count = count

    def get(self, shape, dtype):
        shape, dtype = tuple(shape), np.dtype(dtype)
        index, self.count = self.count, self.count + 1
        if (index >= len(self._slots) or self._plan.requests[index] != (shape, dtype)
                or not self._clear(index)):
            return self._spill.get(shape, dtype)
        slot = self._slots[index]
        if slot[2] is None:
            slot[2] = np.ndarray(shape, dtype, slot[0], 0)
        return slot[2]

    def _clear(self, index):
        """Whether nothing refers to the arrays planned in the bytes of array ``index``."""
        start, stop = self._starts[index], self._stops[index]
        sharing = np.flatnonzero((self._starts < stop) & (start < self._stops))
        return all(unreferenced(self._slots[other]) for other in sharing.tolist())

    def owns(self, array):
        root = array
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        return any(root is slot[0] for slot in self._slots) or self._spill.owns(array)

    @property
    def nbytes(self):
        """Bytes of its own (the arena is its model's)."""
        return self._spill.nbytes
