"""``load`` an ONNX model and run it: its steps in order, each value dropped after its last use,
on ``cso.get_num_threads()`` threads (the convolutions', Gemm's, and NumPy's BLAS for what
still uses it)."""
import os
import threading
import time
from collections import defaultdict

import numpy as np

from .. import get_num_threads
from ..jobs import LINE
from .arena import Planned, Sizing, new_arena
from ..buffers import Buffers
from . import layouts, wire
from .graph import build_steps, read
from .node import UnsupportedModel
from .program import Program

PROGRAMS = 4   # input shapes (and thread counts) a model keeps its recorded program for


_blas = None   # NumPy's BLAS libraries as threadpoolctl found them on the first run


def _blas_threads(threads):
    """A context that runs NumPy's BLAS on ``threads`` threads (threadpoolctl; looking the
    libraries up costs 0.3 ms, so it is done once)."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController().select(user_api="blas")
    return _blas.limit(limits=threads)


class Model:
    """A loaded ONNX model: ``model.run(None, {name: array})`` returns its outputs as
    onnxruntime's ``InferenceSession.run`` does; ``model(x)`` for one input and one output.
    Inputs take any batch size (dimension 0); their other dimensions are the ones the model
    was loaded for."""

    def __init__(self, steps, inputs, outputs, constants, slots=None):
        self.steps = steps
        self.slots = slots or {}        # value -> its concat.Slot (made in a Concat's array)
        self.buffers = Buffers()        # the arrays of runs that do not use a Program
        self._programs = {}             # (input shapes, threads) -> its Program
        self._plans = {}                # (input shapes, threads) -> its values' arena.Plan
        # the programs' values, at their plans' offsets, one run at a time (a run that finds
        # the lock held runs plain)
        self._arena, self._program_lock = new_arena(0), threading.Lock()
        self.inputs = inputs            # name -> (shape loaded for, dtype)
        self.outputs = outputs
        used = {name for step in steps for name in step.inputs} | set(outputs)
        self.constants = {name: constants[name] for name in used if name in constants}

    _per_process = ("buffers", "_programs", "_plans", "_arena", "_program_lock")

    def __getstate__(self):   # pickled and copied without the arrays it reuses
        return {name: value for name, value in self.__dict__.items()
                if name not in self._per_process}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.buffers, self._programs, self._plans = Buffers(), {}, {}
        self._arena, self._program_lock = new_arena(0), threading.Lock()

    @property
    def input_names(self):
        return list(self.inputs)

    @property
    def output_names(self):
        return list(self.outputs)

    def __call__(self, x):
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            raise TypeError(f"model(x) is for models with one input and one output; this one "
                            f"has inputs {self.input_names} and outputs {self.output_names}: "
                            f"use model.run(None, {{name: array}})")
        return self.run(None, {self.input_names[0]: x})[0]

    def run(self, output_names, feeds):
        """The outputs named (all of them for None), in that order, for the ``feeds``."""
        return self._run(output_names, feeds, None)

    def memory(self):
        """Bytes this model holds, by kind: {"weights": its layers' packed filters (each
        packing their plans read) and biases, and the constants its other steps read;
        "values": the arrays its runs' values are made in (one arena for its programs' runs,
        what their plans did not hold, and a pool for the runs that find a program busy);
        "workspaces": its recorded programs' workspaces; "inputs": the programs' copies of
        the feeds; "programs": how many input shapes and thread counts it keeps a program
        for; "total": the bytes. Not counted: each thread's workspaces (``cso.jobs``, shared
        by every layer the thread runs) and compiled code."""
        layers = [step.run.conv for step in self.steps
                  if getattr(step.run, "conv", None) is not None]
        constants = sum(value.nbytes for value in self.constants.values()
                        if isinstance(value, np.ndarray))
        programs = list(self._programs.values())
        found = {"weights": sum(layer.nbytes for layer in layers) + constants,
                 "values": self._arena.nbytes + self.buffers.nbytes
                 + sum(program.buffers.nbytes for program in programs),
                 "workspaces": sum(program.recording.nbytes for program in programs),
                 "inputs": sum(value.nbytes for program in programs
                               for value in program.inputs.values())}
        found["total"] = sum(found.values())
        found["programs"] = len(programs)
        return found

    def time_by_operator(self, feeds):
        """Run once and return ``{label: seconds}`` per step label ("Conv+Relu", "MaxPool",
        ...), summed over the steps of that label: where the time goes."""
        seconds = defaultdict(float)
        self._run(None, feeds, seconds)
        return dict(seconds)

    def _run(self, output_names, feeds, seconds):
        names = self._check_outputs(output_names)
        feeds = self._check_feeds(feeds)
        threads = get_num_threads()
        if seconds is not None:   # step by step, timed
            with _blas_threads(threads):
                return self._outputs(names, self._steps(feeds, self.buffers, seconds))
        key = (tuple((name, value.shape) for name, value in feeds.items()), threads)
        program = self._programs.get(key)
        if program is None:
            if not self._program_lock.acquire(blocking=False):   # another run holds the pool
                return self._plain_run(names, feeds, threads)
            try:
                plan = self._plans.get(key)
                if plan is None:   # a first run of these shapes: its values logged, planned
                    return self._sizing_run(key, names, feeds, threads)
                if len(self._programs) >= PROGRAMS:   # a stream of batch sizes cannot grow it
                    self._programs.clear()
                if plan.nbytes > self._arena.nbytes - LINE:
                    # the programs recorded on the old arena go with it (their plans stay)
                    self._programs.clear()
                    self._arena = None
                    self._arena = new_arena(plan.nbytes)
                program = Program(feeds, self.constants, Planned(self._arena, plan),
                                  self._program_lock)
                with _blas_threads(threads):
                    values = self._steps(feeds, program.buffers, None, program)
                    outputs = self._outputs(names, values, program)
                self._programs[key] = program
                return outputs
            finally:
                self._program_lock.release()
        if not program.lock.acquire(blocking=False):   # another thread runs it: run plain
            return self._plain_run(names, feeds, threads)
        try:
            if self._programs.get(key) is not program:   # dropped meanwhile, its memory too
                return self._plain_run(names, feeds, threads)
            values = program.replay(feeds, threads)
            # the steps after the replay, if any, may use NumPy's BLAS; a replay alone does
            # not (setting and restoring the BLAS threads costs some 60 us a run)
            if program.resume < len(self.steps):
                with _blas_threads(threads):
                    values = self._steps(values, program.buffers, None, first=program.resume)
            return self._outputs(names, values, program)
        finally:
            program.lock.release()

    def _sizing_run(self, key, names, feeds, threads):
        """The outputs ``names`` of a first run of ``key``'s shapes, which plans its values'
        offsets (``cso.onnx.arena``): a recording into fresh arrays, as the program's will run,
        its recording then dropped."""
        if len(self._plans) >= PROGRAMS:
            self._plans.clear()
        sizing = Sizing()
        program = Program(feeds, self.constants, sizing, self._program_lock)
        with _blas_threads(threads):
            outputs = self._outputs(names, self._steps(feeds, sizing, None, program), program)
        self._plans[key] = sizing.plan()
        return outputs

    def _plain_run(self, names, feeds, threads):
        """The outputs ``names`` of a run step by step, without a program."""
        with _blas_threads(threads):
            return self._outputs(names, self._steps(feeds, self.buffers, None))

    def _steps(self, values, buffers, seconds, program=None, first=0):
        """Run the steps from ``first`` on ``values`` (the feeds, or the values a replay left),
        their arrays from ``buffers``; return the values after the last. A ``program`` given
        records the run's leading steps that it can replay."""
        feeds, values = values, dict(values)
        if first == 0:
            values.update(self.constants)
        if program is not None:   # its jobs read its own copies of the feeds
            values.update(program.feeds(feeds))
            program.start()
        buffered, plain = {"buffers": buffers}, {}   # run's options, not changed below
        # the caller keeps the outputs: a plain run makes them in arrays of their own, a
        # recording in the program's (which ``_outputs`` copies)
        fresh = set(self.outputs) if program is None else set()
        try:
            for index in range(first, len(self.steps)):
                step = self.steps[index]
                start = time.perf_counter() if seconds is not None else 0.0
                if program is not None and program.resume is None:
                    jobs, gets = len(program.recording), buffers.count
                inputs = [values[name] if name else None for name in step.inputs]
                options = (buffered if step.buffered and fresh.isdisjoint(step.outputs)
                           else plain)
                if step.takes_out:
                    out = self._placed(step.outputs[0], values, inputs[0], buffers)
                    if out is not None:
                        options = dict(options, out=out)
                results = step.run(*inputs, **options)
                if len(results) == 1:
                    if step.outputs[0]:
                        values[step.outputs[0]] = results[0]
                else:
                    values.update((name, value) for name, value in zip(step.outputs, results)
                                  if name)
                if (program is not None and program.resume is None
                        and not program.takes(step, inputs, results, jobs)):
                    # the values before the step: those now but its outputs (none freed yet)
                    program.stop(index, {name: value for name, value in values.items()
                                         if name not in step.outputs}, jobs, gets)
                    # the steps after the replayed ones read the caller's feeds (which they may
                    # return), as in a replay
                    values.update((name, feeds[name]) for name in feeds if name in values)
                for name in step.frees:
                    del values[name]
                if seconds is not None:
                    seconds[step.label] += time.perf_counter() - start
        finally:   # (a run that raised leaves its program unused)
            if program is not None:
                program.finish(self.steps, values)
        return values

    def _outputs(self, names, values, program=None):
        """The outputs ``names``; a copy of one that is an array of ``program``'s, or a view of
        one, which the next replay would overwrite."""
        found = [values[name] for name in names]
        if program is not None:
            found = [value.copy() if isinstance(value, np.ndarray) and program.owns(value)
                     else value for value in found]
        return found

    def _placed(self, name, values, like, buffers):
        """The array value ``name`` is to be made in, or None: its channels of its Concat's
        array (``concat``) at batch 1, that array made here (from ``buffers``) for the first of
        them; or the Concat's own array, once made."""
        found = values.get(name)
        slot = self.slots.get(name)
        if found is not None or slot is None or like.shape[0] != 1:
            return found
        block = values.get(slot.concat)
        if block is None:
            block = self._placed(slot.concat, values, like, buffers)
            if block is None:
                block = buffers.get((1,) + slot.shape, like.dtype)
            values[slot.concat] = block
        return block[:, slot.first:slot.stop]

    def _check_outputs(self, output_names):
        if output_names is None:
            return self.outputs
        unknown = [name for name in output_names if name not in self.outputs]
        if unknown:
            raise ValueError(f"output_names {unknown} are not outputs of the model "
                             f"{self.output_names}")
        return list(output_names)

    def _check_feeds(self, feeds):
        if not isinstance(feeds, dict):
            raise TypeError(f"feeds must be a dict {{input name: array}}, got "
                            f"{type(feeds).__name__}")
        missing = [name for name in self.inputs if name not in feeds]
        unknown = [name for name in feeds if name not in self.inputs]
        if missing or unknown:
            raise ValueError(f"feeds must name exactly the model's inputs {self.input_names}; "
                             f"missing {missing}, unknown {unknown}")
        values = {}
        for name, value in feeds.items():
            shape, dtype = self.inputs[name]
            if not isinstance(value, np.ndarray):
                raise TypeError(f"input {name!r} must be a numpy.ndarray, got "
                                f"{type(value).__name__}")
            if value.dtype != dtype:
                raise TypeError(f"input {name!r} must have dtype {dtype}, got {value.dtype} "
                                f"(shape {value.shape})")
            if not shape:   # a scalar input has no batch
                if value.shape:
                    raise ValueError(f"input {name!r} must be a scalar (shape ()), got "
                                     f"{value.shape}")
            elif value.shape[1:] != shape[1:] or value.ndim != len(shape) or not value.shape[0]:
                raise ValueError(f"input {name!r} must have shape (batch, "
                                 f"{', '.join(map(str, shape[1:]))}) with batch >= 1 (the model "
                                 f"was loaded for {shape}), got {value.shape}")
            values[name] = value
        return values

    def __repr__(self):
        convs = sum(step.ops.count("Conv") for step in self.steps)
        return (f"cso.onnx.Model(inputs {dict((n, s) for n, (s, _) in self.inputs.items())}, "
                f"outputs {self.output_names}, {len(self.steps)} steps, {convs} convolutions)")


def load(model, input_shapes=None, *, blocked=True):
    """Load an ONNX model (a path or an ``onnx.ModelProto``) to run with cso: constants folded,
    every Conv's filters packed (and BatchNormalization, per-channel Mul/Add and Relu after it
    fused into it) and its kernels compiled for the input shapes, which are the model's
    (``input_shapes`` {name: shape} gives those it leaves open; an open batch dimension is 1).
    ``blocked``: hold the activations between convolutions channel-blocked where the steps
    allow (``cso.onnx.layouts``); False keeps every value NCHW.
    Raises ``UnsupportedModel`` (a ValueError) naming the first node it cannot run."""
    if not isinstance(blocked, bool):
        raise TypeError(f"blocked must be True or False, got {blocked!r}")
    try:
        import onnx
    except ImportError:
        raise ImportError("cso.onnx needs the onnx package: pip install 'cso[onnx]'") from None
    path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    if path is not None:
        model = _read(path)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    graph = read(model, _input_shapes(model, input_shapes or {}), path)
    # the proto, if read from a path here, and the graph's constants are dropped before the
    # first run packs the filters: each constant then lives on only until its step has packed
    # it (VGG-19 peaked at the proto, the constants and the packed filters at once)
    del model
    inputs = graph.inputs
    steps, slots = build_steps(graph, layouts.place if blocked else None)
    loaded = Model(steps, inputs, graph.outputs, graph.constants, slots)
    del graph
    # a first run on zeros builds every convolution for its input shape: packs its filters and
    # compiles (or loads) its kernels now, not on the user's first call; it plans the values'
    # memory, and a second run records the program the user's calls replay
    zeros = {name: np.zeros(shape, dtype) for name, (shape, dtype) in inputs.items()}
    loaded.run(None, zeros)
    loaded.run(None, zeros)
    return loaded


def _read(path):
    """The ``onnx.ModelProto`` in file ``path``, without the weights it holds (``cso.onnx.wire``:
    those inline, if it is a protobuf file; or those an exporter wrote beside it: the dynamo
    exporter's ``model.onnx.data``), which ``read`` reads into arrays."""
    import onnx
    from google.protobuf.message import DecodeError
    try:
        if _protobuf_file(path):
            try:
                return onnx.ModelProto.FromString(wire.model_bytes(path, os.path.basename(path)))
            except wire.WireError:
                pass   # onnx.load reads it, or says why not
        return onnx.load(path, load_external_data=False)
    except DecodeError as err:
        raise UnsupportedModel(f"{path}: not an ONNX model, or a truncated one ({err})") from None


def _protobuf_file(path):
    """Whether ``onnx.load`` reads ``path`` as protobuf (not one of its text formats)."""
    from onnx import serialization
    extension = os.path.splitext(path)[1]
    return serialization.registry.get_format_from_file_extension(extension) in (None,
                                                                                "protobuf")


def _input_shapes(model, input_shapes):
    """{input name: shape}: the model's, with ``input_shapes`` for the dimensions it leaves
    open (an open batch dimension is 1)."""
    initializers = {t.name for t in model.graph.initializer}
    declared = {v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
                for v in model.graph.input if v.name not in initializers}
    unknown = sorted(set(input_shapes) - set(declared))
    if unknown:
        raise ValueError(f"input_shapes names {unknown}, not inputs of the model "
                         f"{list(declared)}")
    shapes = {}
    for name, dims in declared.items():
        shape = list(input_shapes.get(name, dims))
        if len(shape) != len(dims):
            raise ValueError(f"input_shapes[{name!r}] = {tuple(shape)} has {len(shape)} "
                             f"dimensions; the model's input has {len(dims)}")
        if shape and shape[0] is None:
            shape[0] = 1   # an open batch dimension
        if None in shape or min(shape, default=1) < 1:
            raise ValueError(f"input {name!r} has open dimensions {dims}: give them in "
                             f"input_shapes")
        shapes[name] = tuple(int(size) for size in shape)
    return shapes
