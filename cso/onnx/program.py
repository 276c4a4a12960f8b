"""A model's steps as one compiled call: the jobs (``cso.jobs``) its first run on an input
shape made, recorded, and run again with no Python between them.

Python between the steps costs a model more than its hot cost: the convolutions evict the
interpreter's code and data, and each step's few microseconds of Python grew to 10-30 (py-spy
put 10-20% of SqueezeNet's and ShuffleNet's runs in the interpreter, Zen 3). Yet once a run's
input shape and thread count are known, every convolution and compiled kernel of it calls the
same function on the same arguments at the same addresses, run after run, provided its arrays
are the same ones: a ``Program`` gives them their own ``Buffers``, copies the feeds into arrays
of its own, and records the jobs of the run's leading steps that are nothing else (``takes``).
A replay runs those jobs in one compiled call (``cso.jobs.Recording.replay``), then the
remaining steps (a Gemm, and what follows it) as a plain run does.

The steps a replay stands for without jobs: those that make views of their input's memory
(Reshape, a Split of channels), and shape arithmetic: a step computed from nothing but the
shapes of the program's values (Shape, Size) and from values so made or constant gives the
same result on every run of the program, whose shapes are fixed; it is computed once, as the
recording runs.
"""
import numpy as np

from ..jobs import Recording, data_address
from .concat import ConcatStep

SHAPE_ONLY = {("Shape",), ("Size",)}   # steps that read their input's shape alone


class Program:
    """The recording, then the replay, of a model's run on one set of input shapes and one
    thread count, its values from ``buffers`` (an ``arena.Planned`` on the model's arena,
    which its programs' runs share, one run at a time; or the ``arena.Sizing`` of a first
    run, which plans it); ``lock`` is held by the run using any of them."""

    def __init__(self, feeds, constants, buffers, lock):
        self.lock, self.buffers = lock, buffers
        self.inputs = {name: np.empty_like(value) for name, value in feeds.items()}
        # the values fixed for the program: the model's constants (names) and the shape
        # arithmetic the recording ran (name -> value, kept: a replay's steps read them)
        self.constants = frozenset(constants)
        self.fixed = {}
        self.recording = Recording()   # the jobs of the steps replayed
        self.resume = None    # the first step not replayed (None: all of them so far)
        self.resume_gets = 0  # the arrays the replayed steps asked ``buffers`` for
        self.values = None    # the values live after the replayed steps

    def feeds(self, feeds):
        """``feeds`` copied into the program's own input arrays, which its jobs read."""
        for name, value in feeds.items():
            np.copyto(self.inputs[name], value)
        return dict(self.inputs)

    # --- recording: the model's run calls ``start``, ``takes``, ``stop`` and ``finish``

    def start(self):
        self.recording.start()

    def takes(self, step, inputs, results, jobs_before):
        """Whether the replay can stand for ``step``, which made the jobs from ``jobs_before`` on:
        it only ran jobs on C-contiguous inputs into an array the model gave it, or it made
        C-contiguous views of its first input's memory (Reshape, Dropout, a Split or Slice of
        channels), or it is a Concat whose inputs were all made in its array, or it is shape
        arithmetic (see the module's docstring). (An output the caller keeps is then an array
        of the program's, a view of one, or a fixed value, which the model copies: ``owns``.)"""
        if len(self.recording) == jobs_before and self._fixed_by_shapes(step):
            self.fixed.update((name, value) for name, value in zip(step.outputs, results)
                              if name)
            return True
        arrays = [x for x in inputs if x is not None]
        if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
            return False
        if len(self.recording) > jobs_before:   # (into C-contiguous arrays: no temporary either)
            return (step.buffered and getattr(step.run, "jobs_only", False)
                    and all(r is None or r.flags.c_contiguous for r in results))
        if isinstance(step.run, ConcatStep):
            return step.run.made_in_place(arrays, results[0])
        return bool(arrays) and all(r is None or _inside(r, arrays[0]) for r in results)

    def _fixed_by_shapes(self, step):
        """Whether ``step`` reads the shape of its first input alone, or values fixed for the
        program only: its results are the same on every run."""
        data = [name for name in step.inputs if name and name not in self.constants]
        return step.ops in SHAPE_ONLY or (bool(step.inputs) and all(
            name in self.fixed for name in data))

    def stop(self, index, values, jobs, gets):
        """The replay stops before step ``index``, which finds ``values``, after the first
        ``jobs`` jobs and ``gets`` arrays from ``buffers``."""
        self.recording.stop()
        self.resume, self.values, self.resume_gets = index, dict(values), gets
        self.recording.truncate(jobs)

    def finish(self, steps, values):
        """After the recording run: ``values`` are those after its last step."""
        self.recording.stop()
        if self.resume is None:
            self.resume, self.values = len(steps), dict(values)

    def owns(self, array):
        """Whether ``array`` is one of the program's arrays (a fixed value too), or a view of
        one."""
        root = array
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        return (any(root is value for value in self.inputs.values())
                or any(root is value for value in self.fixed.values()) or self.buffers.owns(root))

    # --- replay

    def replay(self, feeds, threads):
        """Run the recorded jobs on ``feeds``; return the values the remaining steps start
        from (the caller's feeds for the inputs, which those steps may return)."""
        self.feeds(feeds)
        self.recording.replay(threads)
        self.buffers.rewind(self.resume_gets)   # the remaining steps' arrays, as planned
        values = dict(self.values)
        values.update((name, value) for name, value in feeds.items() if name in values)
        return values


def _inside(view, array):
    """Whether ``view`` is a C-contiguous array whose elements lie in ``array``'s memory (a
    C-contiguous array)."""
    if not isinstance(view, np.ndarray) or not view.flags.c_contiguous:
        return False
    start = data_address(view) - data_address(array)
    return 0 <= start and start + view.nbytes <= array.nbytes
