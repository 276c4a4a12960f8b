"""Benchmark cso against im2col + NumPy GEMM (and onnxruntime, PyTorch, XNNPACK when installed)
and write a report: report.md, a self-contained report.html, PNG plots and results.json.

    python -m bench                          # the quick mixed suite (about two minutes)
    python -m bench --suite layers           # the 17-layer ResNet/VGG/MobileNet/YOLO list
    python -m bench --suite convbench:100    # a stratified sample of timm's convolutions
    python -m bench --suite depthwise        # 40 of timm's depthwise convolutions (or grouped)
    python -m bench --schedules              # IS vs WS forced, and how often CSA's pick wins
    python -m bench --threads 2 --scaling    # 1 vs 2 threads, each engine in its own process
    python -m bench --models                 # whole ONNX CNNs: cso.onnx vs onnxruntime
    python -m bench --models resnet50,vgg19  # some of them
    python -m bench --models zoo/            # ONNX files as exported (a folder, or files)
    python -m bench --dask                   # images/s: one process vs a 2-worker LocalCluster

``--threads`` sets every engine's threads: cso's, NumPy's BLAS (which has to happen before NumPy
is first imported, hence the early parse below), onnxruntime's and PyTorch's.
"""
import argparse
import os

from .models import MODELS, QUICK_MODELS

QUICK_CONVS = 4  # --quick: this many convolutions of the suite, one sample each


def parse_args():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="quick",
                        help="quick, resnet50, vgg16, mobilenet, layers, convbench[:N], "
                             "depthwise[:N], grouped[:N] or a CSV path[:N] (default: quick)")
    parser.add_argument("--engines", default=None,
                        help="comma-separated, from cso, im2col, onnxruntime, torch, xnnpack "
                             "(default: every installed one), and cso-blocked, cso-nhwc (cso "
                             "on channel-blocked or channels-last values)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of every engine, cso included (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="timed samples per engine (median)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK_CONVS} convolutions of the suite, one sample each")
    parser.add_argument("--out", default="bench-report", help="report directory (default: %(default)s)")
    parser.add_argument("--layers", default="", help="only convolutions whose name contains this")
    parser.add_argument("--schedules", action="store_true",
                        help="time cso with IS and WS forced; report CSA's hit rate")
    parser.add_argument("--scaling", action="store_true",
                        help="time each engine (im2col excepted) on 1 and --threads threads, "
                             "each engine in a process of its own")
    parser.add_argument("--models", nargs="?", const=",".join(MODELS), default=None,
                        metavar="NAMES",
                        help="a mode of its own (no convolution table): whole ONNX CNNs, "
                             "cso.onnx against onnxruntime at batch 1 and 8, latency, conv/rest "
                             "split, load time and peak memory; NAMES comma-separated from "
                             f"{', '.join(MODELS)} (default all; with --quick: "
                             f"{', '.join(QUICK_MODELS)}, batch 1, one sample), or ONNX files "
                             "and folders of them as exported (models cso.onnx refuses are "
                             "listed with the reason)")
    parser.add_argument("--dask", nargs="?", type=int, const=2, default=None, metavar="WORKERS",
                        help="a mode of its own: images/s of a layer and a model (SqueezeNet, "
                             "with onnx) over a batch, cso in one process on WORKERS threads "
                             "against cso.dask on a LocalCluster of WORKERS processes x 1 thread "
                             "(default 2; needs pip install '.[dask]')")
    parser.add_argument("--isa", default="",
                        help="cso's kernel ISA (avx512, avx2, generic: one this CPU runs; default "
                             "the best), PyTorch's oneDNN capped to match")
    parser.add_argument("--tune", action="store_true",
                        help="run cso's tuned plans (cso.autotune: each convolution's best-ranked "
                             "plans timed once per machine, kept in the cache) instead of the "
                             "model's")
    opts = parser.parse_args()
    if opts.tune and (opts.schedules or opts.scaling or opts.models is not None):
        parser.error("--tune applies to the main table, not to --schedules, --scaling or --models")
    if opts.models is not None and (opts.schedules or opts.scaling):
        parser.error("--models is a mode of its own: not with --schedules or --scaling")
    if opts.dask is not None and (opts.models is not None or opts.schedules or opts.scaling
                                  or opts.tune):
        parser.error("--dask is a mode of its own: not with --models, --schedules, --scaling "
                     "or --tune")
    if opts.dask is not None and opts.dask < 1:
        parser.error(f"--dask: WORKERS must be at least 1, got {opts.dask}")
    if opts.threads < 1 or opts.repeat < 1:
        parser.error(f"--threads and --repeat must be at least 1, got {opts.threads} and {opts.repeat}")
    if opts.scaling and opts.threads < 2:
        parser.error(f"--scaling compares 1 thread with --threads, which must be at least 2, "
                     f"got {opts.threads}")
    return parser, opts


parser, opts = parse_args()
if opts.isa:   # cso's kernels, and PyTorch's oneDNN capped alike (set before either loads)
    os.environ["CSO_ISA"] = opts.isa
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", {"avx512": "AVX512_CORE", "avx2": "AVX2"}.get(
        opts.isa, "SSE41"))
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(opts.threads)

from . import documents, report  # noqa: E402  (imports NumPy)
from .engines import CSO_OPTIONS, ENGINES, LAYOUTS, available_engines, default_engines  # noqa: E402
from .measure import (REST_WARM_UP_SECONDS, measure_conv, measure_schedules,  # noqa: E402
                      settle_seconds)
from .scaling import SCALING_ENGINES, run_children  # noqa: E402
from .memory import measure_memory, memory_lines  # noqa: E402
from . import models  # noqa: E402
from .startup import measure_startup, startup_lines  # noqa: E402
from .suites import suite  # noqa: E402
from microkernels import default_isa  # noqa: E402

try:
    default_isa()
except ValueError as err:
    parser.error(f"--isa: {err}")


def selected_specs():
    try:
        specs = [spec for spec in suite(opts.suite) if opts.layers in str(spec)]
    except ValueError as err:
        parser.error(str(err))
    if not specs:
        parser.error(f"no convolution name contains {opts.layers!r}")
    if opts.quick and len(specs) > QUICK_CONVS:
        specs = [specs[(2 * i + 1) * len(specs) // (2 * QUICK_CONVS)] for i in range(QUICK_CONVS)]
    return specs


def selected_engines():
    if opts.scaling:
        default = [e for e in available_engines() if e in SCALING_ENGINES]
        engines = opts.engines.split(",") if opts.engines else default
        if "cso" not in engines or any(e not in SCALING_ENGINES for e in engines):
            parser.error(f"--engines with --scaling must include cso and come from "
                         f"{list(SCALING_ENGINES)}, got {engines}")
    else:
        engines = opts.engines.split(",") if opts.engines else default_engines()
        if any(e not in ENGINES for e in engines) or "cso" not in engines or "im2col" not in engines:
            parser.error(f"--engines must include cso and im2col and come from {list(ENGINES)}, "
                         f"got {engines}")
    missing = [e for e in engines if e not in available_engines()]
    if missing:
        parser.error(f"--engines: {missing} not installed (pip install '.[compare]', "
                     f"'.[xnnpack]' or torch)")
    return engines


def selected_models():
    import importlib.util
    missing = [m for m in ("onnx", "onnxruntime", "threadpoolctl") if importlib.util.find_spec(m) is None]
    if missing:
        parser.error(f"--models needs {', '.join(missing)}: pip install '.[onnx,compare]'")
    if opts.quick and opts.models == ",".join(MODELS):
        return list(QUICK_MODELS)
    names = []
    for name in (n for n in opts.models.split(",") if n):
        if os.path.isdir(name):   # every ONNX file in it, as exported
            names += sorted(os.path.join(folder, f) for folder, _, files in os.walk(name)
                            for f in files if f.endswith(".onnx"))
        elif name in MODELS or os.path.isfile(name):
            names.append(name)
        else:
            parser.error(f"--models: {name!r} is neither one of {', '.join(MODELS)} nor an "
                         f"ONNX file or a folder of them")
    if not names:
        parser.error(f"--models: no model in {opts.models!r}")
    return names


def main_models():
    names = selected_models()
    batches = models.BATCHES[:1] if opts.quick else models.BATCHES
    repeat = 1 if opts.quick else opts.repeat
    facts, _ = report.machine_facts(opts.threads)
    facts += [
        ("Models", f"{', '.join(map(models.label, names))}{' (--quick)' if opts.quick else ''}: "
                   f"the onnx package's light CNNs with random weights, at batch "
                   f"{' and '.join(map(str, batches))}, and ONNX files as exported, at the batch "
                   f"they fix; float32"),
        ("Timing", f"median of {repeat} sample{'s' * (repeat > 1)}, each engine (cso, "
                   f"onnxruntime, and OpenVINO when installed) timed in blocks: a warm-up run, "
                   f"then half its samples back to back, the engines in turn and then in "
                   f"reverse order"
                   + (f", {settle_seconds(opts.threads):.2f} s of rest before each block "
                      "(the engines' pools asleep by then) and its warm-up "
                      f"{REST_WARM_UP_SECONDS * 1e3:.0f} ms long" if opts.threads > 1 else "")
                   + "; cso's and OpenVINO's outputs checked against onnxruntime's first; start: "
                     "each engine's load and first run in a fresh process (cso's on the warm "
                     "cache, and on an empty one)"),
    ]
    report.print_facts(facts)
    print(flush=True)
    bar = report.Progress(len(names))
    results = [bar.step(models.label(name), models.measure(name, batches, repeat, opts.threads))
               for name in names]
    report.print_models(results)
    paths = documents.write_models(opts.out, facts, results)
    print(f"\nReport written: {', '.join(paths)}")


def main_dask():
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("dask", "distributed")):
        parser.error("--dask needs dask and distributed: pip install '.[dask]'")
    from . import dask
    workers, repeat = opts.dask, 1 if opts.quick else opts.repeat
    facts, _ = report.machine_facts(workers)
    facts += [
        ("Batch", f"{dask.BATCH} images in chunks of {dask.CHUNK}, float32, made on the workers "
                  f"and kept there"),
        ("Timing", f"median of {repeat} sample{'s' * (repeat > 1)}, timed in blocks: cso "
                   f"in this process on {workers} thread{'s' * (workers > 1)}, and a computation "
                   f"on a LocalCluster of {workers} worker process{'es' * (workers > 1)} x 1 "
                   f"thread, outputs gathered here (checked: the same bits)"),
    ]
    report.print_facts(facts)
    print(flush=True)
    report.print_dask(dask.measure(workers, repeat))


def main():
    if opts.models is not None:
        return main_models()
    if opts.dask is not None:
        return main_dask()
    specs, engines = selected_specs(), selected_engines()
    if opts.tune:
        CSO_OPTIONS["tune"] = True
    repeat = 1 if opts.quick else opts.repeat
    facts, peak = report.machine_facts(opts.threads)
    if opts.scaling:
        facts = [(label, f"1 and {opts.threads} per engine, each engine in a process of its own"
                  if label == "Threads" else text) for label, text in facts]
    facts += [
        ("Suite", f"{opts.suite}{' (--quick)' if opts.quick else ''}: {len(specs)} convolutions, float32"),
        ("Layouts", "each engine fed its own, converted outside the timed calls: "
                    + ", ".join(f"{e} {LAYOUTS.get(e, 'nchw').upper()}" for e in engines)),
        ("Timing", f"median of {repeat} sample{'s' * (repeat > 1)}, each engine timed in blocks "
                   "(a warm-up, then back-to-back samples; the engines in turn, then in reverse"
                   + (f"; {settle_seconds(opts.threads):.2f} s of rest before each block, "
                      f"its warm-up {REST_WARM_UP_SECONDS * 1e3:.0f} ms long"
                      if opts.threads > 1 else "")
                   + "); every output checked against a float64 reference first"),
        ("cso plans", "tuned on this host (--tune: the fastest of CSA's best-ranked plans, timed "
                      "once per machine and kept in the cache; its load time includes that)"
         if opts.tune else "from the model (CSA's rules and this host's calibration)"),
    ]
    report.print_facts(facts)
    print(flush=True)
    bar = report.Progress(len(specs))
    if opts.schedules:
        rows = [bar.step(spec, measure_schedules(spec, repeat)) for spec in specs]
        report.print_schedules(rows)
        return
    if opts.scaling:
        report.print_scaling(run_children(specs, engines, opts.threads, repeat), opts.threads, peak)
        return
    rows = [bar.step(spec, measure_conv(spec, engines, repeat, opts.threads)) for spec in specs]
    report.print_table(rows, engines, peak)
    startup = measure_startup(opts.threads)
    print("\nStart-up, a new process (compilation cache: a temporary one):")
    for line in startup_lines(startup):
        print(f"  {line}")
    memory = measure_memory(opts.threads)
    print("\nMemory, one call:")
    for line in memory_lines(memory):
        print(f"  {line}")
    paths = documents.write(opts.out, facts, peak, rows, engines, startup, memory)
    print(f"\nReport written: {', '.join(paths)}")


main()
