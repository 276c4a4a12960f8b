"""Whole models: cso.onnx against onnxruntime, and OpenVINO when it is installed (an optional
engine: ``pip install openvino``), on the nine CNNs the onnx package ships
(``onnx/backend/test/data/light``), at batch 1 and 8, and on ONNX files as exported.

The shipped models build every weight with ConstantOfShape, all 0.02: every filter of a layer is
the same and the final softmax is 0.001 everywhere, whatever an engine computes. So both engines
run a copy with random weights (He-scaled filters, positive BatchNormalization scales and
variances: activations of order one, as in a trained network), which makes the output check
mean something; the graphs, shapes and operators are the shipped ones. The models also hard-code
batch 1 in their Reshape shapes, so that copy is made batch-generic (``batch_generic``), and
the engines load it once and run both batches.

Per model and batch: each engine's latency (median of the samples, timed in blocks after a
warm-up: ``measure.median_seconds``, on the same input; cso's and OpenVINO's outputs checked
against onnxruntime's first), cso's split between its convolution steps (with what is fused
into them) and the rest (``Model.time_by_operator``). Per model and engine, in a child process
that loads the model file and runs both batches (``python -m bench.models ENGINE PATH
SHAPES``), nothing of the model loaded yet but the imports done: its start (loading the model
and the first run; cso's on the persistent compilation cache the parent's runs filled) and its
peak memory; and cso's start in one more child on an empty cache (a temporary
``CSO_CACHE_DIR``: every kernel compiled).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# NumPy is imported in the functions that use it: ``python -m bench`` reads MODELS for its
# --help before it sets the BLAS threads, which has to happen before NumPy loads
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
          "shufflenet", "squeezenet", "vgg19", "zfnet512")
QUICK_MODELS = ("squeezenet", "shufflenet")
BATCHES = (1, 8)
RTOL = 1e-4   # max |cso - onnxruntime| / max |onnxruntime|, per output (OpenVINO's alike)
ENGINES = ("cso", "onnxruntime", "openvino")   # openvino: when installed
OPENVINO_MISSING = "not installed"   # result["openvino"]["skipped"] without the module
PAUSE_SECONDS = 0.05   # the rest before each "after a pause" sample


def model_path(name):
    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        f"light_{name}.onnx")


def _activations(graph):
    """The names whose value depends on a graph input (not on initializers alone)."""
    constant = {t.name for t in graph.initializer}
    live = {v.name for v in graph.input if v.name not in constant}
    for node in graph.node:
        if any(name in live for name in node.input):
            live.update(node.output)
    return live


def batch_generic(model):
    """A copy of ``model`` (an onnx.ModelProto) that runs any batch size: every Reshape of an
    activation whose shape is an initializer starting with 1 gets a shape starting with 0
    instead (ONNX: copy the input's dimension, the batch), and the graph's inputs and outputs
    get a symbolic first dimension "N" (value_info, shape hints only, is dropped). Reshapes of
    constants (a weight reshaped) are left alone; subgraphs are not visited."""
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    live = _activations(graph)
    renamed = {}
    for node in graph.node:
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        if (node.op_type != "Reshape" or allowzero or node.input[0] not in live
                or node.input[1] not in initializers):
            continue
        shape = numpy_helper.to_array(initializers[node.input[1]])
        if shape.ndim != 1 or not shape.size or shape[0] != 1:
            continue
        if node.input[1] not in renamed:
            generic = shape.copy()
            generic[0] = 0
            renamed[node.input[1]] = f"{node.input[1]}_batch_generic"
            graph.initializer.append(numpy_helper.from_array(generic, renamed[node.input[1]]))
        node.input[1] = renamed[node.input[1]]
    used = {name for node in graph.node for name in node.input}
    for name in renamed:   # the batch-1 shapes, if nothing reads them any more
        if name not in used:
            graph.initializer.remove(initializers[name])
            for value in [v for v in graph.input if v.name == name]:
                graph.input.remove(value)
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.name not in initializers and dims:
            dims[0].dim_param = "N"   # clears dim_value: they are a oneof
    del graph.value_info[:]
    return model


def _random_value(consumers, uses, shape, dtype, rng):
    import numpy as np
    node, index = uses[0]
    if node.op_type == "Unsqueeze":   # a Scale layer's operand: what reads the Unsqueeze decides
        return _random_value(consumers, consumers[node.output[0]], shape, dtype, rng)
    if (node.op_type, index) in (("Conv", 1), ("Gemm", 1)):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(dtype)
    if node.op_type == "Mul" or (node.op_type, index) in (("BatchNormalization", 1),
                                                            ("BatchNormalization", 4)):
        return rng.uniform(0.5, 1.5, shape).astype(dtype)
    return (0.1 * rng.standard_normal(shape)).astype(dtype)


def random_weights(model, seed=0):
    """A copy of ``model`` whose ConstantOfShape constants (the light models' weights) are
    random initializers: He-scaled Conv and Gemm weights, BatchNormalization scales, variances
    and Mul operands in [0.5, 1.5], everything else 0.1 x normal."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    kept = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            fill = numpy_helper.to_array(node.attribute[0].t)
            value = _random_value(consumers, consumers[node.output[0]],
                                  tuple(shapes[node.input[0]]), fill.dtype, rng)
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return model


def bench_model(name):
    """The model both engines run: the shipped graph, random weights, any batch."""
    import onnx
    return batch_generic(random_weights(onnx.load(model_path(name))))


def onnxruntime_session(model, threads):
    """An onnxruntime session as a deployment would make one: ``threads`` intra-op threads,
    sequential execution, every graph optimisation, the CPU provider."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if not isinstance(model, str):
        model = model.SerializeToString()
    return onnxruntime.InferenceSession(model, options,
                                        providers=["CPUExecutionProvider"])


def openvino_module():
    """The openvino module, or None where it is not installed (it is optional)."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino


def openvino_config(threads):
    """OpenVINO's CPU settings for a run on ``threads`` threads: float32 inference (no bf16 or
    f16 on CPUs that have them), ``threads`` inference threads, the latency hint (one stream,
    one request at a time)."""
    import openvino as ov
    from openvino import properties
    from openvino.properties import hint
    return {hint.inference_precision: ov.Type.f32, properties.inference_num_threads: threads,
            hint.performance_mode: hint.PerformanceMode.LATENCY}


def openvino_engine(path, threads):
    """OpenVINO's compiled model of the ONNX file ``path`` (read by OpenVINO itself, compiled for
    the CPU with ``openvino_config``) and its ``run(feeds) -> {output name: array}`` on one
    infer request (the inputs' buffers shared, not copied)."""
    import openvino as ov
    compiled = ov.Core().compile_model(path, "CPU", openvino_config(threads))
    request = compiled.create_infer_request()
    return compiled, lambda feeds: request.infer(feeds, share_inputs=True)


def load_engine(engine, model, threads):
    """``engine``'s ``run(feeds) -> outputs`` for ``model`` (a ModelProto or a path; a path for
    OpenVINO) on ``threads`` threads (cso's: set by each run, the count being the process's)."""
    if engine == "openvino":
        return openvino_engine(model, threads)[1]
    if engine == "cso":
        import cso
        import cso.onnx
        cso.set_num_threads(threads)
        loaded = cso.onnx.load(model)

        def run(feeds):
            cso.set_num_threads(threads)
            return loaded.run(None, feeds)
        run.model = loaded   # (its ``memory()`` after the runs: ``engine_child``)
        return run
    session = onnxruntime_session(model, threads)
    return lambda feeds: session.run(None, feeds)


def relative_error(actual, expected):
    """max |actual - expected| / max |expected| (inf if the shapes differ)."""
    import numpy as np
    if actual.shape != expected.shape:
        return np.inf
    return float(np.max(np.abs(actual.astype(np.float64) - expected)) / np.max(np.abs(expected)))


def input_shapes(model):
    """{input name: its shape after the batch dimension}."""
    initializers = {t.name for t in model.graph.initializer}
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim[1:]]
            for v in model.graph.input if v.name not in initializers}


def inputs(shapes, batch, seed=0):
    """{input name: a standard normal float32 array} of ``batch`` images, for ``shapes`` from
    ``input_shapes``."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal([batch] + shape, np.float32) for name, shape in shapes.items()}


def _check(engine, name, batch, outputs, expected, output_names):
    """Raise AssertionError unless every output is within RTOL of onnxruntime's."""
    for out, ref, output in zip(outputs, expected, output_names):
        err = relative_error(out, ref)
        if not err <= RTOL:
            raise AssertionError(
                f"{engine} is wrong on {name} at batch {batch}, output {output!r}: shape "
                f"{out.shape} vs onnxruntime's {ref.shape}, max error {err:.3g} of its "
                f"largest magnitude (allowed {RTOL})")


def _load_openvino(path, threads, feeds):
    """(None, run) once OpenVINO has loaded ``path`` and run it on ``feeds``, or
    ({"skipped": why}, None): OpenVINO not installed, no file, or a model it cannot load."""
    if openvino_module() is None:
        return {"skipped": OPENVINO_MISSING}, None
    if path is None:
        return {"skipped": "no model file (OpenVINO reads the ONNX file)"}, None
    try:
        _, run = openvino_engine(path, threads)
        run(feeds)
    except RuntimeError as err:   # what OpenVINO raises for a model it cannot read or compile
        return {"skipped": "could not load it: " + _openvino_reason(err)}, None
    return None, run


def _openvino_reason(err):
    """OpenVINO's error without the source locations it stacks up ("Exception from
    src/...cpp:132:", "Check 'false' failed at ..."), on one line."""
    lines = [line.strip() for line in str(err).splitlines()]
    return " ".join(line for line in lines
                    if line and not line.startswith(("Exception from ", "Check '")))


def measure_model(name, model, batches, repeat, threads, path=None):
    """One model (``model``, a ModelProto; ``path``, its ONNX file, which OpenVINO reads),
    loaded once by each engine: at every batch, cso's outputs (and OpenVINO's) checked against
    onnxruntime's (AssertionError beyond RTOL), then the engines timed and cso's conv/rest
    split summed over ``repeat`` runs; ``result["openvino"]`` says why OpenVINO did not run,
    where it did not (not installed, no ``path``, a model it cannot load)."""
    import cso
    import cso.onnx
    from .measure import median_seconds, settle_seconds
    cso.set_num_threads(threads)
    ours = cso.onnx.load(model)
    plain = cso.onnx.load(model, blocked=False)   # every value NCHW: what blocking buys
    theirs = onnxruntime_session(model, threads)
    shapes = input_shapes(model)
    result = {"model": name, "batches": {}}
    skipped, openvino = _load_openvino(path, threads, inputs(shapes, batches[0]))
    if skipped:
        result["openvino"] = skipped
    for batch in batches:
        feeds = inputs(shapes, batch)
        expected = theirs.run(None, feeds)
        _check("cso.onnx", name, batch, ours.run(None, feeds), expected, ours.output_names)
        _check("cso.onnx (NCHW)", name, batch, plain.run(None, feeds), expected,
               ours.output_names)
        runs = {"cso": lambda: ours.run(None, feeds),
                "cso_nchw": lambda: plain.run(None, feeds),
                "onnxruntime": lambda: theirs.run(None, feeds)}
        if openvino is not None:
            got = openvino(feeds)   # by name: OpenVINO's outputs may come in another order
            _check("OpenVINO", name, batch, [got[output] for output in ours.output_names],
                   expected, ours.output_names)
            runs["openvino"] = lambda: openvino(feeds)
        seconds = median_seconds(runs, repeat, settle_seconds(threads))
        conv = rest = 0.0
        for _ in range(repeat):
            steps = ours.time_by_operator(feeds)
            for label, s in steps.items():   # a step that runs a Conv (with what it fuses)
                if "Conv" in label.split("+"):
                    conv += s
                else:
                    rest += s
        result["batches"][str(batch)] = {"seconds": seconds,
                                         "speedup": seconds["onnxruntime"] / seconds["cso"],
                                         "blocked_gain": seconds["cso_nchw"] / seconds["cso"],
                                         "conv_share": conv / (conv + rest)}
        if openvino is not None:
            result["batches"][str(batch)]["speedup_openvino"] = (seconds["openvino"]
                                                                 / seconds["cso"])
    return result


def _status_kib(field):
    """A memory figure of this process from /proc/self/status, in KiB: "VmRSS" now, "VmHWM"
    its peak. (Not getrusage's ru_maxrss: Linux carries the parent's peak over into its
    children's across exec, so a child of a large bench process would report the parent's.)"""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def engine_child(engine, path, shapes, threads, batches, samples=0):
    """In this (new) process: ``engine`` loads the model file ``path`` and runs it on every
    batch, in order; return {"start_s": the seconds of loading and the first run, "peak_mib":
    the peak RSS beyond the RSS just before loading (imports done, inputs made), in MiB}, and
    for cso "compiled": the kernels it compiled (persistent cache misses). With ``samples``,
    also "alone_s": the engine alone in its process at the first batch (``alone_seconds``; on
    several threads beside the engine loaded again on one thread, after the peak's reading)."""
    import importlib
    engine_modules = {"cso": ("cso.onnx", "threadpoolctl"), "onnxruntime": ("onnxruntime",),
                      "openvino": ("openvino",)}
    for module in ("numpy", "onnx") + engine_modules[engine]:
        importlib.import_module(module)   # before the baseline and the clock
    feeds = [inputs(shapes, batch) for batch in batches]
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    run = load_engine(engine, path, threads)
    run(feeds[0])
    started = time.perf_counter() - start
    for feed in feeds[1:]:
        run(feed)
    result = {"start_s": started, "peak_mib": (_status_kib("VmHWM") - before) / 1024}
    if engine == "cso":   # what the model holds after its runs, by kind
        result["memory"] = run.model.memory()
    if samples:
        one = None if threads == 1 else load_engine(engine, path, 1)
        result["alone_s"] = alone_seconds(lambda: run(feeds[0]), samples,
                                          one and (lambda: one(feeds[0])), threads)
    if engine == "cso":
        from microkernels import cache
        result["compiled"] = cache.stats()["misses"]
    return result


def alone_seconds(run, samples, run_one_thread=None, threads=1):
    """{"back_to_back": median seconds of ``samples`` calls of ``run`` (on ``threads``
    threads), "after_pause": of ``samples`` more, each after PAUSE_SECONDS of rest}; with
    ``run_one_thread``, the same engine on one thread, also "one_thread": its back-to-back
    median, both timed in alternate blocks (``median_seconds``: a rest before each, for the
    pool of the other to stop spinning), so that the speedup's two figures share the
    process's and the host's drifts."""
    from .measure import median_seconds, settle_seconds
    if run_one_thread is None:
        run()
        seconds = {"back_to_back": median_call_seconds(run, samples)}
    else:
        blocks = median_seconds({"back_to_back": run, "one_thread": run_one_thread},
                                samples, settle_seconds(threads))
        seconds = {"back_to_back": blocks["back_to_back"], "one_thread": blocks["one_thread"]}
    seconds["after_pause"] = median_call_seconds(run, samples, PAUSE_SECONDS)
    return seconds


def median_call_seconds(run, samples, rest=0.0):
    """The median seconds of ``samples`` calls of ``run``, each after ``rest`` seconds."""
    times = []
    for _ in range(samples):
        time.sleep(rest)
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_child(engine, path, shapes, threads, batches, cache_dir=None, samples=0):
    """``engine_child`` in a child process (``python -m bench.models``); with ``cache_dir``,
    cso's compilation cache there (``CSO_CACHE_DIR``) rather than this process's."""
    command = [sys.executable, "-m", "bench.models", engine, path, json.dumps(shapes),
               "--threads", str(threads), "--batches", ",".join(map(str, batches)),
               "--samples", str(samples)]
    env = None if cache_dir is None else dict(os.environ, CSO_CACHE_DIR=cache_dir)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, env=env)
    return json.loads(done.stdout.splitlines()[-1])


def label(source):
    """How a model is named in the report: a light model's name, or an exported file's folder
    and name (``dy18/tv_resnet18``)."""
    if source in MODELS:
        return source
    path = os.path.splitext(os.path.abspath(source))[0]
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def fixed_batch(model):
    """The batch size an exported model fixes in its first input (0: it leaves it open)."""
    initializers = {t.name for t in model.graph.initializer}
    first = next(v for v in model.graph.input if v.name not in initializers)
    dims = first.type.tensor_type.shape.dim
    return dims[0].dim_value if dims else 0


def measure(source, batches, repeat, threads):
    """``measure_model`` of a light model by name (``bench_model``) or of an ONNX file as it
    was exported (at the batch it fixes, if it does), then ``measure_child`` of each engine
    that ran (OpenVINO if it did) on the same model, its start ("start_s", cso's on the cache
    the runs just filled), peak memory ("peak_mib") and latency alone in its process at the
    first batch ("alone": {engine: {"ms", "paused_ms"} (``engine_child``'s "alone_s"), and on
    several threads "one_thread_ms", the same child's engine on one thread}), and cso's start on an
    empty cache ("cold_start_s": at the first batch, in a child whose cache is a new
    directory, removed after); or {"model", "refused": why} for a model ``cso.onnx`` cannot
    load."""
    import onnx
    from cso.onnx import UnsupportedModel
    name = label(source)
    if source in MODELS:
        model, path = bench_model(source), None
    else:
        model, path = onnx.load(source), source
        batches = [fixed_batch(model)] if fixed_batch(model) else batches
    with tempfile.TemporaryDirectory(prefix="cso-bench-") as tmp:
        if path is None:   # OpenVINO and the children load a file
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(model, path)
        try:
            result = measure_model(name, model, batches, repeat, threads, path)
        except UnsupportedModel as err:
            return {"model": name, "refused": str(err)}
        shapes = input_shapes(model)
        ran = [e for e in ENGINES if e != "openvino" or "openvino" not in result]
        children = {e: measure_child(e, path, shapes, threads, batches, samples=repeat)
                    for e in ran}
        result["start_s"] = {e: child["start_s"] for e, child in children.items()}
        result["peak_mib"] = {e: child["peak_mib"] for e, child in children.items()}
        result["cso_memory"] = children["cso"]["memory"]
        result["alone"] = {e: {"ms": 1e3 * child["alone_s"]["back_to_back"],
                               "paused_ms": 1e3 * child["alone_s"]["after_pause"]}
                           for e, child in children.items()}
        for e, child in children.items():
            if "one_thread" in child["alone_s"]:
                result["alone"][e]["one_thread_ms"] = 1e3 * child["alone_s"]["one_thread"]
        empty = os.path.join(tmp, "empty-cache")
        os.mkdir(empty)
        result["cold_start_s"] = measure_child("cso", path, shapes, threads, batches[:1],
                                               empty)["start_s"]
    return result


HEADER = ["model", "batch", "cso ms", "onnxruntime ms", "speedup", "openvino ms", "speedup ov",
          "blocked x", "conv %", "rest %", "start s cso / ort / ov", "cold s cso",
          "peak MiB cso / ort / ov"]


def loaded(results):
    return [r for r in results if "refused" not in r]


def rows(results):
    """Table rows: one per model that loaded and batch (its start times and peak memory on the
    first). The OpenVINO cells are empty where it did not run (not installed, or a model it
    cannot load), and the start and peak cells then leave out its figure."""
    table = []
    for r in loaded(results):
        start = " / ".join(f"{r['start_s'][e]:.2f}" for e in ENGINES if e in r["start_s"])
        cold = f"{r['cold_start_s']:.2f}"
        peak = " / ".join(f"{r['peak_mib'][e]:.0f}" for e in ENGINES if e in r["peak_mib"])
        for index, (batch, b) in enumerate(r["batches"].items()):
            first = index == 0
            ov = "openvino" in b["seconds"]
            table.append([r["model"] if first else "", batch, f"{1e3 * b['seconds']['cso']:.2f}",
                          f"{1e3 * b['seconds']['onnxruntime']:.2f}", f"{b['speedup']:.2f}x",
                          f"{1e3 * b['seconds']['openvino']:.2f}" if ov else "",
                          f"{b['speedup_openvino']:.2f}x" if ov else "",
                          f"{b['blocked_gain']:.2f}x", f"{100 * b['conv_share']:.0f}", f"{100 * (1 - b['conv_share']):.0f}",
                          start if first else "", cold if first else "",
                          peak if first else ""])
    return table


ALONE_HEADER = ["model", "engine", "ms", "after pause ms", "pause x", "1 thread ms",
                "thread speedup"]


def alone_rows(results):
    """Rows of the engines alone in their processes: one per model and engine, at the first
    batch: back to back, after a pause (and its ratio), on one thread (and the run's thread
    count's speedup over it) when the run has several."""
    table = []
    for r in loaded(results):
        for index, (engine, a) in enumerate(r["alone"].items()):
            one = a.get("one_thread_ms")
            table.append([r["model"] if index == 0 else "", engine, f"{a['ms']:.2f}",
                          f"{a['paused_ms']:.2f}", f"{a['paused_ms'] / a['ms']:.2f}x",
                          "" if one is None else f"{one:.2f}",
                          "" if one is None else f"{one / a['ms']:.2f}x"])
    return table


def alone_summary(results):
    """Per engine, over the models: the geomean of its time after a pause over back to back,
    and on several threads of its speedup over one thread (with the slowest model's)."""
    from .stats import geomean
    ran = [r for r in loaded(results) if "alone" in r]
    lines = []
    for engine in ENGINES:
        figures = [r["alone"][engine] for r in ran if engine in r["alone"]]
        if not figures:
            continue
        line = (f"{engine} alone: after a {1e3 * PAUSE_SECONDS:.0f} ms pause "
                f"{geomean(a['paused_ms'] / a['ms'] for a in figures):.2f}x its back-to-back "
                f"time (geomean over {len(figures)} models)")
        speedups = [a["one_thread_ms"] / a["ms"] for a in figures if "one_thread_ms" in a]
        if speedups:
            line += (f"; {geomean(speedups):.2f}x faster than on one thread (geomean; least "
                     f"{min(speedups):.2f}x)")
        lines.append(line)
    return lines


def _speedup_key(engine):
    return {"onnxruntime": "speedup", "cso_nchw": "blocked_gain"}.get(engine,
                                                                       f"speedup_{engine}")


def geomean_speedups(results, engine="onnxruntime"):
    """{batch: geomean of ``engine``'s time over cso's across the models it ran}."""
    from .stats import geomean
    key = _speedup_key(engine)
    results = loaded(results)
    batches = dict.fromkeys(b for r in results for b in r["batches"] if key in r["batches"][b])
    return {b: geomean(r["batches"][b][key] for r in results
                       if b in r["batches"] and key in r["batches"][b])
            for b in batches}


def summary_lines(results):
    ran = loaded(results)
    lines = []
    for engine, who in (("onnxruntime", "onnxruntime"), ("openvino", "OpenVINO")):
        key = _speedup_key(engine)
        lines += [f"batch {b}: geomean speedup {s:.2f}x over {who} ({who}'s time over cso's; "
                  f"above 1, cso is faster) over "
                  f"{sum(key in r['batches'].get(b, {}) for r in ran)} models"
                  for b, s in geomean_speedups(results, engine).items()]
    lines += [f"batch {b}: cso's channel-blocked values {s:.2f}x the speed of its NCHW ones "
              f"(geomean over {sum(b in r['batches'] for r in ran)} models)"
              for b, s in geomean_speedups(results, "cso_nchw").items()]
    lines += [memory_line(r) for r in ran if "cso_memory" in r]
    skipped = [r for r in ran if "skipped" in r.get("openvino", {})]
    if any(r["openvino"]["skipped"] == OPENVINO_MISSING for r in skipped):
        lines.append("OpenVINO was not installed (pip install openvino): no OpenVINO figures")
    elif skipped:
        lines.append(f"OpenVINO ran {len(ran) - len(skipped)} of {len(ran)} models; not:")
        lines += [f"  {r['model']}: {r['openvino']['skipped']}" for r in skipped]
    if len(ran) < len(results):
        lines.append(f"cso.onnx loaded {len(ran)} of {len(results)} models; refused:")
        lines += [f"  {r['model']}: {r['refused']}" for r in results if "refused" in r]
    return lines


def memory_line(result):
    """What cso's model holds after the runs of the peak-memory child (``Model.memory``)."""
    m, mib = result["cso_memory"], 1 / 2 ** 20
    return (f"{result['model']}: cso holds {m['total'] * mib:.0f} MiB after its runs: weights "
            f"{m['weights'] * mib:.0f}, values {m['values'] * mib:.0f}, workspaces "
            f"{m['workspaces'] * mib:.1f}, input copies {m['inputs'] * mib:.1f} "
            f"({m['programs']} programs); peak beyond the imports "
            + " / ".join(f"{e} {result['peak_mib'][e]:.0f}" for e in ENGINES
                         if e in result["peak_mib"]) + " MiB")


TEXT = ("The onnx package's light CNNs (their graphs, with random weights: the shipped "
        "ones are all 0.02), batch-generic, and ONNX files as they were exported (at the batch "
        "they fix), each loaded once per engine and run at each batch. The engines: cso.onnx, "
        "onnxruntime (the CPU provider, every graph optimisation) and, when it is installed, "
        "OpenVINO (the CPU plugin reading the ONNX file, float32 inference precision, the "
        "run's thread count, the latency hint). "
        "Latency: median of the samples on the same input, each engine timed in blocks (a "
        "warm-up run, then half its samples back to back; the engines in turn, then in "
        "reverse order; with several threads a rest after each block, for its threads to "
        "stop spinning), "
        "after cso's and OpenVINO's outputs matched onnxruntime's (max error at most {rtol} of "
        "the largest magnitude). Speedup: onnxruntime's time over cso's; speedup ov: "
        "OpenVINO's time over cso's; blocked x: cso's time with every value NCHW "
        "(cso.onnx.load(blocked=False), timed in the same blocks) over its time with "
        "channel-blocked values (the default). conv % / rest %: cso's time in its "
        "convolution steps (what is fused into them included) and in the other operators "
        "(NumPy). A child process per engine, its imports done and its inputs made, then "
        "loads the model file and runs every batch. Start s: in that child, loading the model "
        "and the first run (at the first batch): cso.onnx.load (constant folding, filter "
        "packing, kernels read from the persistent compilation cache, which the runs above "
        "filled) and its first run; onnxruntime's session creation and first run; OpenVINO's "
        "reading the file, compiling and first run. Cold s: cso's start in one more child "
        "whose compilation cache is a new, empty directory (every kernel compiled). Peak MiB: "
        "the child's peak RSS (VmHWM, Linux) minus its RSS just before loading the model "
        "file: weights, packed filters, workspaces and activations.")
ALONE_TEXT = ("Each engine alone in its process (the children above, at the first batch: no "
              "other engine's pool beside it): ms, the median of the samples back to back "
              "after a warm-up run; after pause ms, of as many runs each after a "
              "{pause:.0f} ms rest (a pool whose spin is shorter asleep by then); with several "
              "threads, 1 thread ms from the engine loaded again in the same child on one "
              "thread, timed in blocks that alternate with the others' (a rest before each), "
              "and the speedup over it.")


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.models",
                                     description="The per-engine child of python -m bench "
                                                 "--models: prints {\"start_s\": ..., "
                                                 "\"peak_mib\": ...}.")
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("path", help="an ONNX model file")
    parser.add_argument("shapes", help='JSON {input name: shape after the batch dimension}')
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--samples", type=int, default=0,
                        help="also time the engine alone: back to back and after a pause")
    opts = parser.parse_args()
    if opts.samples < 0:
        parser.error(f"--samples must be at least 0, got {opts.samples}")
    batches = [int(b) for b in opts.batches.split(",")]
    print(json.dumps(engine_child(opts.engine, opts.path, json.loads(opts.shapes),
                                  opts.threads, batches, opts.samples)))


if __name__ == "__main__":
    main()
