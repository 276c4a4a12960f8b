"""The persistent compilation cache: the object code of every generated function (loop nests,
kernels, packers, the pool) saved on disk, so that a later process loads it with llvmlite
instead of compiling again.

Where: the directory ``CSO_CACHE_DIR`` names, else the per-user cache directory
($XDG_CACHE_HOME/cso or ~/.cache/cso; ~/Library/Caches/cso on macOS; %LOCALAPPDATA%\\cso on
Windows). ``CSO_CACHE_DIR=""`` turns the cache off. Entries live in a subdirectory named by
what compiled code depends on: the versions of llvmlite and Python and a hash of the library's
sources (stronger than its version number: an edited checkout never loads code compiled from
other sources); each entry's key adds the CPU name and features.

Whose sources: this module's code knows no package above it. Each package whose code
generates or decides cached content registers itself when imported,
``cache.include_sources(__name__)``: microkernels (here, after ``source_hash``), packing, and
cso for itself and for csa (whose plans decide what cso compiles and records, but which imports
nothing of ours). Importing them caches nothing, so every entry is looked up after its packages
registered. The hash covers every ``*.py`` of the packages registered so far, in name order:
the import order does not change it. Which packages a process has imported does, by design: a
process that has imported only microkernels and packing hashes just those two, since nothing
else of ours can have shaped its entries, so its directory is not the one a process with cso
uses, and a process with cso never loads code cached without cso's and csa's sources in its
hash. Importing cso later moves a process on to the fuller directory for the entries it makes
from then on. Registering records a name only: the files are read at the first lookup, so
import time is unchanged.

An entry is one file, a SHA-256 digest of its payload then the payload: a truncated or
corrupted file fails the check and counts as a miss (the code is compiled and the entry
rewritten), it is never loaded. Every file is written to a temporary name then renamed into
place, so processes filling the same entry at once each leave a whole file. A directory that
cannot be written turns saving off with one warning; compiling still works.
"""
import hashlib
import importlib.util
import json
import os
import pickle
import sys
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import llvmlite

from .isa import host_target
from .once import fork_safe_lock

DIGEST = 32   # bytes of SHA-256 before each payload

_stats = {"hits": 0, "misses": 0, "corrupt": 0, "saved": 0}
_lock = fork_safe_lock()


def _count(event):
    with _lock:
        _stats[event] += 1


def stats():
    """Cache events of this process: hits, misses (compiled), corrupt entries found (rebuilt),
    entries saved."""
    with _lock:
        return dict(_stats)


def default_dir():
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cso"


def cache_root():
    """The cache directory (``CSO_CACHE_DIR`` or the per-user default), or None when off."""
    configured = os.environ.get("CSO_CACHE_DIR")
    if configured is not None:
        return Path(configured) if configured else None
    return default_dir()


_source_packages = ()   # registered by include_sources, in name order


def include_sources(*packages):
    """Let the Python sources of ``packages`` (importable packages' names) name the entry
    directory: code that cached entries are generated from or decided by."""
    global _source_packages
    _source_packages = tuple(sorted({*_source_packages, *packages}))


def source_hash():
    """A hash of the registered packages' Python sources."""
    return _hash_sources(_source_packages)


@lru_cache(maxsize=None)
def _hash_sources(packages):
    digest = hashlib.sha256()
    for package in packages:
        directory = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        for path in sorted(directory.glob("*.py")):
            digest.update(f"{package}/{path.name}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


include_sources(__package__)   # its generators and JIT make every entry


def entry_dir():
    """Where this process's entries live, or None when the cache is off."""
    root = cache_root()
    if root is None:
        return None
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return root / f"llvmlite{llvmlite.__version__}-{python}-{source_hash()}"


def _key_name(*parts):
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def write_entry(path, payload):
    """Write digest + ``payload`` to ``path`` through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def read_entry(path):
    """The payload at ``path``, or None when it is missing or fails its digest."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    payload = data[DIGEST:]
    if len(data) < DIGEST or hashlib.sha256(payload).digest() != data[:DIGEST]:
        _count("corrupt")
        return None
    return payload


_save_failed = []


def _save(write, event="saved"):
    """Run ``write()`` unless saving failed before; the first failure turns saving off with
    one warning (compiled code still runs)."""
    if _save_failed:
        return
    try:
        write()
        if event:
            _count(event)
    except OSError as err:
        _save_failed.append(err)
        warnings.warn(f"cso: cannot write the compilation cache ({err}); set CSO_CACHE_DIR to "
                      "a writable directory, or to '' to turn the cache off", RuntimeWarning,
                      stacklevel=4)


def native_path(*key):
    """Where the host's object code of the compiled code ``key`` names (its generator and
    arguments: the directory is per source hash) is kept, or None when the cache is off."""
    directory = entry_dir()
    return None if directory is None else directory / f"{cpu_key(*key)}.o"


def load_native(path):
    """(symbol name, object code) saved at ``path``, or None (compile it)."""
    if path is None:
        return None
    payload, found = read_entry(path), None
    if payload is not None:
        try:
            found = pickle.loads(payload)
        except Exception:
            _count("corrupt")
        if not (isinstance(found, tuple) and len(found) == 2):
            found = None
    _count("misses" if found is None else "hits")
    return found


def save_native(path, entry):
    """Save ``entry`` (symbol name, object code) at ``path``."""
    if path is not None:
        _save(lambda: write_entry(path, pickle.dumps(entry, protocol=-1)))


def cpu_key(*parts):
    """A file name's key for ``parts`` on this CPU (its triple, name and features)."""
    return _key_name(*parts, host_target())


def record_path(kind, *key):
    """Where this CPU's measured record (a calibration, a tuning) of ``kind`` for ``key`` is
    kept, or None when the cache is off."""
    directory = entry_dir()
    return None if directory is None else directory / f"{kind}-{cpu_key(kind, *key)}.json"


def load_record(path, version):
    """The JSON record at ``path`` when it is whole and of layout ``version``, else None."""
    payload = read_entry(path) if path is not None else None
    try:
        found = json.loads(payload) if payload else None
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("version") == version else None


def save_record(path, record):
    """Save a measured record as JSON (not compiled code: not counted as an entry saved)."""
    if path is not None:
        _save(lambda: write_entry(path, json.dumps(record, indent=1).encode()), event=None)
