"""A model's recorded program (``cso.onnx.program``): its replay gives what a plain run gives,
bit for bit, stops before the steps it cannot stand for, and never hands the caller an array
that a later replay overwrites."""
import weakref

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import cso  # noqa: E402
import cso.onnx  # noqa: E402
from cso.jobs import LINE  # noqa: E402
from cso.onnx import model as model_module  # noqa: E402

from .onnx_models import make_model, tensor  # noqa: E402
from .test_onnx_models import assert_matches_onnxruntime, in_threads  # noqa: E402


def fire_model(rng, tail=("Flatten",), extra_outputs=()):
    """SqueezeNet's pattern: Conv, Relu, MaxPool, two Convs made in a Concat's channels, a
    Conv with its residual, a global pool, then ``tail`` (operators of one input)."""
    inits = {"w0": rng.standard_normal((6, 3, 3, 3)), "w1": rng.standard_normal((4, 6, 1, 1)),
             "w2": rng.standard_normal((4, 6, 3, 3)), "w3": rng.standard_normal((6, 8, 1, 1)),
             "w4": rng.standard_normal((6, 6, 1, 1))}
    inits = {name: (w / 4).astype(np.float32) for name, w in inits.items()}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w1"], ["b"]),
             helper.make_node("Conv", ["p", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["b", "c"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["d"]),
             helper.make_node("Conv", ["d", "w4"], ["e"]),
             helper.make_node("Add", ["e", "p"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["g"])]
    previous = "g"
    for i, op in enumerate(tail):
        nodes.append(helper.make_node(op, [previous], [f"t{i}"]))
        previous = f"t{i}"
    outputs = [tensor(previous, None)] + [tensor(name, None) for name in extra_outputs]
    return make_model(nodes, [tensor("x", ["N", 3, 10, 12])], outputs, inits)


def plain_run(loaded, feeds):
    """The model's outputs from a run without its program (``time_by_operator``'s path)."""
    checked = loaded._check_feeds(feeds)
    return loaded._outputs(loaded.outputs, loaded._steps(checked, loaded.buffers, None))


def test_replay_matches_a_plain_run_and_keeps_earlier_outputs(rng):
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    (program,) = loaded._programs.values()   # recorded by the load's second run
    labels = [step.label for step in loaded.steps]
    # replayed: every step, the Flatten that makes the output too (a view of the pool's
    # array, which the model copies for the caller)
    assert program.resume == len(labels) == labels.index("Flatten") + 1
    assert len(program.recording) == labels.index("Flatten") - labels.count("Concat")
    kept = []
    for batch in (1, 1, 2, 2, 1):
        x = rng.standard_normal((batch, 3, 10, 12)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)
        outputs = loaded.run(None, {"x": x})
        np.testing.assert_array_equal(outputs[0], plain_run(loaded, {"x": x})[0])
        kept.append((x, outputs[0], outputs[0].copy()))
    assert len(loaded._programs) == 2
    for program in loaded._programs.values():   # at batch 2 the Concat's copies are jobs too
        assert program.resume == len(labels)
    for x, output, copy in kept:   # later runs wrote nothing into an earlier one's output
        np.testing.assert_array_equal(output, copy)


def test_a_softmax_that_makes_the_output_is_replayed(rng):
    """SqueezeNet's end: a Softmax over the last axis runs its compiled kernel, so the replay
    covers the whole model; the output the caller gets is a copy, which the next run leaves
    alone."""
    model = fire_model(rng, tail=("Flatten", "Softmax"))
    loaded = cso.onnx.load(model)
    (program,) = loaded._programs.values()
    assert program.resume == len(loaded.steps) and loaded.steps[-1].label == "Softmax"
    x = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
    (y,) = loaded.run(None, {"x": x})
    assert not program.owns(y)
    np.testing.assert_array_equal(y, plain_run(loaded, {"x": x})[0])
    y_copy = y.copy()
    assert_matches_onnxruntime(model, {"x": -x}, loaded)
    np.testing.assert_array_equal(y, y_copy)


def test_outputs_that_are_inputs_or_views_are_the_callers(rng):
    """An output that is the input (Identity) or a view of a replayed step's array is the
    caller's to keep: the next run does not change it."""
    model = fire_model(rng, tail=("Flatten", "Identity"), extra_outputs=("x_again",))
    model.graph.node.append(helper.make_node("Identity", ["x"], ["x_again"]))
    loaded = cso.onnx.load(model)
    first = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
    y, x_again = loaded.run(None, {"x": first})
    assert x_again is first or np.array_equal(x_again, first)
    y_copy = y.copy()
    loaded.run(None, {"x": rng.standard_normal((1, 3, 10, 12)).astype(np.float32)})
    np.testing.assert_array_equal(y, y_copy)
    np.testing.assert_array_equal(x_again, first)


def test_replay_stops_before_a_step_it_cannot_stand_for(rng):
    """A Softmax over a channel axis (NumPy; the kernel takes the last) in the middle: the
    steps before it are replayed, it and the rest run as in a plain run, on inputs that change
    from run to run."""
    model = fire_model(rng, tail=("Softmax", "Relu", "Flatten"))
    (softmax,) = [node for node in model.graph.node if node.op_type == "Softmax"]
    softmax.attribute.append(helper.make_attribute("axis", 1))
    loaded = cso.onnx.load(model)
    (program,) = loaded._programs.values()
    assert loaded.steps[program.resume].label == "Softmax"
    for _ in range(3):
        x = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_classifier_gemm_and_its_softmax_are_replayed(rng, batch):
    """The models' usual end, Flatten, Gemm (+Relu) and Softmax: the Gemm's convolution, and
    at more than one row the transposes around it, are compiled jobs, so the replay covers the
    whole model, bit for bit as a plain run, at the loaded batch and at another."""
    model = fire_model(rng, tail=("Flatten",))
    b = helper.make_tensor("gemm_b", onnx.TensorProto.FLOAT, (6, 5),
                           (rng.standard_normal(30) / 4).astype(np.float32))
    c = helper.make_tensor("gemm_c", onnx.TensorProto.FLOAT, (5,), rng.standard_normal(5).astype(
        np.float32))
    model.graph.initializer.extend([b, c])
    flat = model.graph.output[0].name
    model.graph.node.extend([helper.make_node("Gemm", [flat, "gemm_b", "gemm_c"], ["gemm"]),
                             helper.make_node("Relu", ["gemm"], ["gemm_relu"]),
                             helper.make_node("Softmax", ["gemm_relu"], ["y"])])
    model.graph.output[0].name = "y"
    loaded = cso.onnx.load(model, input_shapes={"x": (batch, 3, 10, 12)})
    (program,) = loaded._programs.values()
    assert [s.label for s in loaded.steps[-2:]] == ["Gemm+Relu", "Softmax"]
    assert program.resume == len(loaded.steps)
    for run_batch in (batch, 2, batch):
        x = rng.standard_normal((run_batch, 3, 10, 12)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, loaded)
        np.testing.assert_array_equal(loaded.run(None, {"x": x})[0],
                                      plain_run(loaded, {"x": x})[0])
    assert all(p.resume == len(loaded.steps) for p in loaded._programs.values())


def test_programs_per_shape_and_thread_count_are_bounded(rng, monkeypatch):
    """A first run of an input shape and thread count plans its values' memory, the second
    records its program; past ``PROGRAMS`` of either, the older ones are dropped."""
    monkeypatch.setattr(model_module, "PROGRAMS", 2)
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    before = cso.get_num_threads()
    try:
        for threads, batch in ((1, 1), (2, 1), (1, 3), (2, 2), (1, 1)):
            cso.set_num_threads(threads)
            x = rng.standard_normal((batch, 3, 10, 12)).astype(np.float32)
            key = ((("x", x.shape),), threads)
            new = key not in loaded._plans
            assert_matches_onnxruntime(model, {"x": x}, loaded)
            assert key in loaded._plans and (key in loaded._programs) != new
            assert_matches_onnxruntime(model, {"x": x}, loaded)
            assert key in loaded._programs
            assert len(loaded._programs) <= 2 and len(loaded._plans) <= 2
    finally:
        cso.set_num_threads(before)


def test_runs_from_several_threads_share_a_program_or_run_plain(rng):
    """Threads running one model at once: one replays, the others find the program taken and
    run plainly; every result is right."""
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    xs = [rng.standard_normal((1, 3, 10, 12)).astype(np.float32) for _ in range(8)]
    expected = [plain_run(loaded, {"x": x})[0] for x in xs]

    def work(i):
        for _ in range(5):
            np.testing.assert_array_equal(loaded(xs[i]), expected[i])
    in_threads(8, work)


def test_timing_trials_are_not_recorded():
    """Autotuning's and calibration's timing runs, which a model's first call may start, are
    not jobs of the model's program."""
    import csa
    from cso import autotune, calibration
    from cso.jobs import Recording

    with Recording() as recording:
        autotune.measure(csa.ConvSpec.parse("n1c8h6w6k8r3s3p1u1"), "generic", 1, budget=0.01)
    assert len(recording) == 0
    assert calibration.measure.__wrapped__   # the same wrapper


def test_programs_of_several_batch_sizes_share_one_arena_of_values(rng):
    """The programs of one model (a batch size each) keep their values in one arena, run after
    run, at the offsets their plans give: it holds the largest plan, not the sum over batch
    sizes, and no more than the largest run's values live at once; alternating sizes grows
    nothing; runs of other sizes from other threads meanwhile run plain, every result
    right."""
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    xs = {batch: rng.standard_normal((batch, 3, 10, 12)).astype(np.float32)
          for batch in (1, 3, 5)}
    expected = {batch: plain_run(loaded, {"x": x})[0] for batch, x in xs.items()}
    for batch in (1, 3, 5, 1, 3, 5):   # planned, then recorded
        np.testing.assert_array_equal(loaded(xs[batch]), expected[batch])
    arena = loaded._arena
    largest = max(plan.nbytes for plan in loaded._plans.values())
    assert arena.nbytes == largest + LINE
    assert largest <= _live_bytes_of_a_run(loaded, xs[5]) + 16 * LINE   # (lines rounded up)
    # the arena grew to batch 5's plan: the programs recorded on the smaller one went with it,
    # and are recorded again on their next runs
    assert list(loaded._programs) == [((("x", (5, 3, 10, 12)),), cso.get_num_threads())]
    for batch in (5, 1, 3, 1, 5, 3):
        np.testing.assert_array_equal(loaded(xs[batch]), expected[batch])
    assert loaded._arena is arena and len(loaded._programs) == 3
    # every array the programs' runs asked for was the one planned (none from a pool of
    # blocks of their own)
    assert all(program.buffers.nbytes == 0 for program in loaded._programs.values())
    assert loaded.memory()["values"] == arena.nbytes + loaded.buffers.nbytes   # (plain runs)

    def work(i):
        batch = (1, 3, 5)[i % 3]
        for _ in range(4):
            np.testing.assert_array_equal(loaded(xs[batch]), expected[batch])
    in_threads(6, work)


def _live_bytes_of_a_run(loaded, x):
    """The most bytes of values alive at once in a plain run of ``loaded`` on ``x``."""
    live = {"now": 0, "most": 0}
    buffers = type(loaded.buffers)()

    def died(nbytes):
        live["now"] -= nbytes

    def fresh(shape, dtype):
        array = np.empty(shape, dtype)
        live["now"] += array.nbytes
        live["most"] = max(live["most"], live["now"])
        weakref.finalize(array, died, array.nbytes)   # (its views hold it)
        return array
    buffers.get = fresh
    loaded._outputs(loaded.outputs, loaded._steps(loaded._check_feeds({"x": x}), buffers, None))
    return live["most"]


def test_no_growth_over_a_thousand_runs_of_changing_batch_sizes(rng):
    """Batch sizes changing run after run, more of them than the programs a model keeps: the
    programs are recorded again and again, and the memory Python's allocators hold (NumPy's
    arrays included) stays where the first cycles left it."""
    import tracemalloc
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    xs = [rng.standard_normal((batch, 3, 10, 12)).astype(np.float32)
          for batch in range(1, model_module.PROGRAMS + 3)]
    expected = [plain_run(loaded, {"x": x})[0] for x in xs]
    tracemalloc.start()
    try:
        for run in range(1000):
            i = run % len(xs)
            output = loaded(xs[i])
            if run == 199:
                settled = tracemalloc.get_traced_memory()[0]
        np.testing.assert_array_equal(output, expected[i])
        grown = tracemalloc.get_traced_memory()[0] - settled
    finally:
        tracemalloc.stop()
    assert len(loaded._programs) <= model_module.PROGRAMS
    assert grown < 256 * 1024, f"{grown} bytes more after 800 more runs"


def test_a_program_dropped_while_a_run_held_it_is_not_replayed(rng, monkeypatch):
    """A run that took a program just before another run dropped it (past the programs a
    model keeps, whose memory the pool then gives back) runs plain: a replay would write
    into blocks no longer the model's."""
    monkeypatch.setattr(model_module, "PROGRAMS", 2)
    model = fire_model(rng)
    loaded = cso.onnx.load(model)
    x = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
    expected = plain_run(loaded, {"x": x})[0]
    ((key, stale),) = loaded._programs.items()
    for batch in (2, 2, 3, 3):   # planned, recorded: the load's program dropped
        loaded(rng.standard_normal((batch, 3, 10, 12)).astype(np.float32))
    assert key not in loaded._programs

    def replay(*args):
        raise AssertionError("a dropped program was replayed")
    monkeypatch.setattr(stale, "replay", replay)
    handed = []

    class Programs(dict):   # the run finds the stale program first, as if it had just gone
        def get(self, k, default=None):
            if k == key and not handed:
                handed.append(k)
                return stale
            return super().get(k, default)
    loaded._programs = Programs(loaded._programs)
    np.testing.assert_array_equal(loaded(x), expected)
    assert handed == [key]
