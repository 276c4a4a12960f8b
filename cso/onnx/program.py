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
"""
import threading

import numpy as np

from ..jobs import Recording, data_address
from .buffers import Buffers
from .concat import ConcatStep


class Program:
    """The recording, then the replay, of a model's run on one set of input shapes and one
    thread count; ``lock`` is held by the run using it (one at a time: its arrays are
    shared)."""

    def __init__(self, feeds):
        self.lock = threading.Lock()
        self.buffers = Buffers()
        self.inputs = {name: np.empty_like(value) for name, value in feeds.items()}
        self.recording = Recording()   # the jobs of the steps replayed
        self.resume = None    # the first step not replayed (None: all of them so far)
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
        it only ran jobs on C-contiguous inputs into an array the model gave it, or it made a
        view of its first input (Reshape, Dropout), or it is a Concat whose inputs were all made
        in its array. (An output the caller keeps is then an array of the program's, or a view
        of one, which the model copies: ``owns``.)"""
        arrays = [x for x in inputs if x is not None]
        if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
            return False
        if len(self.recording) > jobs_before:   # (into C-contiguous arrays: no temporary either)
            return (step.buffered and getattr(step.run, "jobs_only", False)
                    and all(r is None or r.flags.c_contiguous for r in results))
        if isinstance(step.run, ConcatStep):
            return step.run.made_in_place(arrays, results[0])
        return bool(arrays) and all(
            r is None or (isinstance(r, np.ndarray) and data_address(r) == data_address(arrays[0])
                          and r.nbytes == arrays[0].nbytes) for r in results)

    def stop(self, index, values, jobs):
        """The replay stops before step ``index``, which finds ``values``, after the first
        ``jobs`` jobs."""
        self.recording.stop()
        self.resume, self.values = index, dict(values)
        self.recording.truncate(jobs)

    def finish(self, steps, values):
        """After the recording run: ``values`` are those after its last step."""
        self.recording.stop()
        if self.resume is None:
            self.resume, self.values = len(steps), dict(values)

    def owns(self, array):
        """Whether ``array`` is one of the program's arrays, or a view of one."""
        root = array
        while root.base is not None:
            root = root.base
        return any(root is value for value in self.inputs.values()) or self.buffers.owns(root)

    # --- replay

    def replay(self, feeds, threads):
        """Run the recorded jobs on ``feeds``; return the values the remaining steps start
        from (the caller's feeds for the inputs, which those steps may return)."""
        self.feeds(feeds)
        self.recording.replay(threads)
        values = dict(self.values)
        values.update((name, value) for name, value in feeds.items() if name in values)
        return values
