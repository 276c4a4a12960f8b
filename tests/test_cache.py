"""The persistent compilation cache: a new process loads what an earlier one compiled, corrupted
or truncated entries are rebuilt (never loaded), concurrent fillers leave whole entries."""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from microkernels import cache

from .children import CHILD_CWD
from .reference import conv2d_reference

# A slicing convolution split over two threads (its loop nest, the pool) and a depthwise one
# (its own loop nest), each checked against the reference; prints the cache's events as JSON,
# and whether numba's compiler was set up (its target context imports numba.np.linalg when it
# first compiles or loads anything): every function is generated and compiled by llvmlite.
CHILD = r"""
import json, sys
import numpy as np
import cso
from microkernels import cache

rng = np.random.default_rng(0)
x = rng.standard_normal((2, 8, 9, 11)).astype(np.float32)
w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
xd = rng.standard_normal((1, 6, 13, 10)).astype(np.float32)
wd = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
cso.set_num_threads(2)
cso.warmup(["n1c6h13w10k6r3s3p1u1g6"])
y = cso.Conv2d(w, padding=1, plan_overrides={"split": (2, 1)})(x)
yd = cso.conv2d(xd, wd, padding=1, groups=6)
np.savez(sys.argv[1], y=y, yd=yd)
print(json.dumps(dict(cache.stats(), numba_compiler="numba.np.linalg" in sys.modules)))
"""


def run_child(cache_dir, out, wait=True):
    # no calibration: its kernels are compiled by the first process only (the second loads
    # its record instead), and its record has tests of its own (test_calibration)
    env = dict(os.environ, CSO_CACHE_DIR=str(cache_dir), CSO_CALIBRATE="0")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], cwd=CHILD_CWD, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return finish(proc, out) if wait else proc


def finish(proc, out):
    """The child's cache events, its stderr; numba's compiler was never set up."""
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    check_results(out)
    events = json.loads(stdout.strip().splitlines()[-1])
    assert events.pop("numba_compiler") is False
    return events, stderr


def check_results(out):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 9, 11)).astype(np.float32)
    w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
    xd = rng.standard_normal((1, 6, 13, 10)).astype(np.float32)
    wd = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    found = np.load(out)
    np.testing.assert_allclose(found["y"], conv2d_reference(x, w, padding=(1, 1, 1, 1)),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(found["yd"], conv2d_reference(xd, wd, padding=(1, 1, 1, 1),
                                                             groups=6), rtol=1e-4, atol=1e-4)


def entries(cache_dir):
    return sorted(p for p in Path(cache_dir).rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache filled by one process: (its directory, that process's events)."""
    cache_dir = tmp_path_factory.mktemp("cso_cache")
    events, _ = run_child(cache_dir, cache_dir / "first.npz")
    return cache_dir, events


def test_a_new_process_loads_what_an_earlier_one_compiled(filled, tmp_path):
    cache_dir, first = filled
    assert first["misses"] >= 4 and first["saved"] == first["misses"] and first["hits"] == 0
    names = [p.name for p in entries(cache_dir) if p.suffix != ".npz"]
    assert len(names) == first["saved"] and all(n.endswith(".o") for n in names)
    again, _ = run_child(cache_dir, tmp_path / "again.npz")
    assert again == {"hits": first["misses"], "misses": 0, "corrupt": 0, "saved": 0}


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_entry_is_rebuilt_never_loaded(filled, tmp_path, damage):
    source, _ = filled
    cache_dir = tmp_path / "cache"
    for path in entries(source):
        target = cache_dir / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[:len(data) // 2]
        elif damage == "flip":
            data[len(data) // 2] ^= 0x40
        else:
            data = b""
        target.write_bytes(bytes(data))
    events, _ = run_child(cache_dir, tmp_path / "damaged.npz")
    assert events["hits"] == 0 and events["corrupt"] >= 1 and events["saved"] >= 1
    rebuilt, _ = run_child(cache_dir, tmp_path / "rebuilt.npz")
    assert rebuilt["misses"] == 0 and rebuilt["corrupt"] == 0 and rebuilt["hits"] >= 4


def test_two_processes_filling_the_same_entries_at_once(tmp_path):
    cache_dir = tmp_path / "cache"
    procs = [(run_child(cache_dir, tmp_path / f"p{i}.npz", wait=False), tmp_path / f"p{i}.npz")
             for i in range(2)]
    for proc, out in procs:
        finish(proc, out)
    assert not any(".tmp" in p.name for p in entries(cache_dir))
    after, _ = run_child(cache_dir, tmp_path / "after.npz")
    assert after["misses"] == 0 and after["corrupt"] == 0 and after["hits"] >= 4


def test_the_cache_can_be_turned_off(tmp_path):
    events, _ = run_child("", tmp_path / "off.npz")
    assert events == {"hits": 0, "misses": 0, "corrupt": 0, "saved": 0}


def test_an_unwritable_cache_directory_warns_and_still_computes(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    events, stderr = run_child(blocker / "cache", tmp_path / "unwritable.npz")
    assert events["saved"] == 0 and events["misses"] >= 4
    assert "cannot write the compilation cache" in stderr


def test_entries_are_checked_by_their_digest(tmp_path):
    path = tmp_path / "sub" / "entry"
    cache.write_entry(path, b"payload bytes")
    assert cache.read_entry(path) == b"payload bytes"
    path.write_bytes(path.read_bytes()[:-1])
    assert cache.read_entry(path) is None
    assert cache.read_entry(tmp_path / "missing") is None


def test_the_entry_directory_names_what_compiled_code_depends_on(monkeypatch, tmp_path):
    import llvmlite
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    name = cache.entry_dir().name
    assert cache.entry_dir().parent == tmp_path
    assert llvmlite.__version__ in name and f"py{sys.version_info[0]}{sys.version_info[1]}" in name
    assert cache.source_hash() in name
    monkeypatch.setenv("CSO_CACHE_DIR", "")
    assert cache.entry_dir() is None
    monkeypatch.delenv("CSO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert cache.cache_root() == tmp_path / "xdg" / "cso"


def test_warmup_takes_specs_or_their_names_and_rejects_others():
    import csa
    import cso
    assert cso.warmup([csa.ConvSpec.parse("n1c4h6w6k4r3s3p1u1"), "n1c4h6w6k4r3s3p1u1g4"]) >= 0
    with pytest.raises(TypeError, match="warmup"):
        cso.warmup([(1, 4, 6, 6)])
    with pytest.raises(ValueError, match="canonical"):
        cso.warmup(["not a spec"])


# Imports the packages named on its command line one by one, the source hash naming the entry
# directory after each (the first with microkernels alone), then compiles a kernel: prints the
# hashes, the entry directory and the cache's events. Importing caches nothing (no entry is
# looked up before its packages registered).
SOURCES_CHILD = r"""
import importlib, json, sys
import microkernels as mk
from microkernels import cache
hashes = [cache.source_hash()]
for name in sys.argv[1:]:
    importlib.import_module(name)
    hashes.append(cache.source_hash())
assert cache.stats() == {"hits": 0, "misses": 0, "corrupt": 0, "saved": 0}, cache.stats()
mk.compile(mk.KernelSpec("f32", 4, 4, "generic"))
print(json.dumps({"hashes": hashes, "directory": cache.entry_dir().name, **cache.stats()}))
"""


def run_sources_child(workdir, *packages):
    """The child above, run in ``workdir`` (it imports packages found there), caching in
    ``workdir``/cache."""
    env = dict(os.environ, CSO_CACHE_DIR=str(workdir / "cache"))
    done = subprocess.run([sys.executable, "-c", SOURCES_CHILD, *packages], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_registered_package_s_sources_name_the_entry_directory(tmp_path):
    """Registering a package, editing one of its sources, adding one: each changes the hash."""
    package = tmp_path / "generator"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from microkernels import cache\ncache.include_sources(__name__)\n")
    (package / "emit.py").write_text("WIDTH = 8\n")
    alone, registered = run_sources_child(tmp_path, "generator")["hashes"]
    (package / "emit.py").write_text("WIDTH = 16\n")
    edited = run_sources_child(tmp_path, "generator")["hashes"][-1]
    (package / "more.py").write_text("")
    added = run_sources_child(tmp_path, "generator")["hashes"][-1]
    assert len({alone, registered, edited, added}) == 4


def test_the_entry_directory_follows_the_packages_imported_in_any_order(tmp_path):
    """microkernels alone, with packing, with cso (which imports everything): three
    directories, the last the same whichever was imported first."""
    alone, with_packing, full = run_sources_child(tmp_path, "packing", "cso")["hashes"]
    assert run_sources_child(tmp_path, "cso", "packing")["hashes"][1:] == [full, full]
    assert run_sources_child(tmp_path, "csa", "cso")["hashes"] == [alone, alone, full]
    assert len({alone, with_packing, full}) == 3


def test_entries_cached_without_cso_are_not_loaded_with_it(tmp_path):
    """A process that imported only microkernels and packing caches its kernel apart: a
    process with cso compiles the kernel again (its entries' hash covers cso's and csa's
    sources too), and each loads its own entry afterwards."""
    partial = run_sources_child(tmp_path, "packing")
    full = run_sources_child(tmp_path, "cso")
    assert partial["directory"] != full["directory"]
    assert partial["saved"] == full["saved"] == 1 and full["hits"] == 0
    assert run_sources_child(tmp_path, "packing")["hits"] == 1
    assert run_sources_child(tmp_path, "cso")["hits"] == 1


@pytest.mark.parametrize("define", ["windows_packed", "windows_slab", "filters_packed",
                                    "filters_direct", "depthwise_loop_nest"])
def test_loop_nests_need_no_runtime(define):
    """A loop nest's code calls only what its arguments point at and LLVM intrinsics: a
    process loads it from the cache with nothing else set up."""
    from llvmlite import ir

    from cso import depthwise, loop_nests
    module = ir.Module()
    getattr(depthwise if define.startswith("depthwise") else loop_nests, f"define_{define}")(
        module, "f32")
    declared = [f.name for f in module.functions if f.is_declaration]
    assert all(name.startswith("llvm.") for name in declared), declared


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF object files")
def test_object_code_whose_symbols_do_not_resolve_is_not_loaded():
    """``undefined_symbols`` lists what an object takes from outside it (not what it defines);
    a ``JitModule`` checking its symbols loads an object only if each resolves in this process
    (the Python C API does; a made-up name does not), and refuses code it cannot read."""
    from microkernels.jit import JitModule, UnresolvedSymbols, undefined_symbols
    calls = """
        declare i32 @Py_IsInitialized()
        declare double @llvm.exp.f64(double)
        define double @f(double %x) {
          %one = call i32 @Py_IsInitialized()
          %scale = sitofp i32 %one to double
          %y = call double @llvm.exp.f64(double %x)
          %z = fmul double %y, %scale
          ret double %z
        }"""
    resolved = JitModule(calls).object_code
    assert undefined_symbols(resolved) == ["Py_IsInitialized", "exp"]
    loaded = JitModule(object_code=resolved, check_symbols=True)
    assert loaded.function("f", ctypes.c_double, ctypes.c_double)(1.0) == np.exp(1.0)
    missing = JitModule(calls.replace("Py_IsInitialized", "cso_test_no_such_symbol")).object_code
    assert undefined_symbols(missing) == ["cso_test_no_such_symbol", "exp"]
    with pytest.raises(UnresolvedSymbols, match="cso_test_no_such_symbol"):
        JitModule(object_code=missing, check_symbols=True)
    assert undefined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None   # Mach-O
    with pytest.raises(UnresolvedSymbols):
        JitModule(object_code=b"\xcf\xfa\xed\xfe" + bytes(60), check_symbols=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF object files")
def test_a_foreign_function_s_object_code_is_cached_under_its_key(tmp_path, monkeypatch):
    """``ForeignFunction``: the first lookup of a key compiles (told its object code will be
    kept) and saves that code; the next loads it without compiling, as a ``JitModule``; with
    the cache off the compiler is told its code is not kept."""
    from microkernels.jit import ForeignFunction, JitModule
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    calls = []

    def compile(keep):
        calls.append(keep)
        module = JitModule("define i64 @twice(i64 %x) {\n %y = mul i64 %x, 2\n ret i64 %y\n}")
        return "twice", module.address("twice"), module, module.object_code

    key = ("test_cache", "twice", str(tmp_path))
    made, loaded = ForeignFunction(key, compile), ForeignFunction(key, compile)
    assert calls == [True] and loaded.code is not made.code
    twice = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(loaded.address)
    assert twice(21) == 42
    monkeypatch.setenv("CSO_CACHE_DIR", "")
    ForeignFunction(key, compile)
    assert calls == [True, False]
