"""Machine facts CSA plans with: cache sizes, line size, vector registers, access latencies."""
import os
from dataclasses import dataclass, replace
from typing import Any

from .tuning import GENERIC, Tuning

_SYSFS = "/sys/devices/system/cpu/cpu{cpu}/cache"
# Used where the OS does not tell (non-Linux, containers hiding sysfs): a typical x86 core.
FALLBACK = {"l1d": 32 * 1024, "l2": 1024 * 1024, "l3": 8 * 1024 * 1024, "line": 64,
            "l3_cpus": 1}


@dataclass(frozen=True)
class Machine:
    """Sizes in bytes; caches are per core except L3, shared by ``l3_cpus`` CPUs (threads
    running on them share it: see ``threads``). Vector facts are plain numbers
    (the micro-kernel ISA's register width and count); latencies (and ``stream_l2``,
    ``stream_mem``) are cycles per line, used only to weigh the cost model's terms against each
    other."""
    l1d: int = FALLBACK["l1d"]
    l2: int = FALLBACK["l2"]
    l3: int = FALLBACK["l3"]
    line: int = FALLBACK["line"]
    l3_cpus: int = FALLBACK["l3_cpus"]
    vector_bytes: int = 16
    vector_registers: int = 16
    latency_l1: float = 4.0
    latency_l2: float = 14.0
    latency_l3: float = 50.0
    latency_mem: float = 250.0
    # A tile read in sequence from L2 is prefetched: it costs bandwidth (about 16 B a cycle
    # sustained), not a latency per line (with latency weights the model picked the wrong
    # schedule: csa/TUNING.md)
    stream_l2: float = 4.0
    # Filters a thread streams from memory (cold, as in a model's run), weighed against its
    # FMAs where a convolution is split across threads (csa.thread_split). One Zen 3 core reads
    # memory at 13 GB/s, 15 cycles a line at 3 GHz; the models ran fastest with 9, which
    # allows for the core overlapping the stream with its FMAs, and for two threads that read
    # the same filters finding them in L3 for one of them (csa/TUNING.md, "Thread split")
    stream_mem: float = 9.0
    source: str = "defaults"
    tuning: Tuning = GENERIC   # the kernel ISA's tuning record (csa.tuning)

    @classmethod
    def host(cls, cpu: int | None = None, **overrides: Any) -> "Machine":
        """Caches of the core this process runs on, read from Linux sysfs (index*/level, type,
        size, coherency_line_size); ``FALLBACK`` values where unavailable. ``overrides`` set any
        field, e.g. the vector facts of the ISA the kernels are compiled for."""
        if cpu is None:
            cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        found = read_sysfs_caches(_SYSFS.format(cpu=cpu))
        facts: dict[str, Any] = dict(FALLBACK, **found,
                                     source="sysfs" if found else "fallback (no sysfs)")
        return cls(**facts).with_(**overrides)

    def with_(self, **changes: Any) -> "Machine":
        return replace(self, **changes)

    def per_thread(self, threads: int) -> "Machine":
        """The caches one of ``threads`` threads may count on: its own core's L1 and L2, and its
        share of the L3 it runs under (``threads`` spread over L3s of ``l3_cpus`` CPUs each)."""
        sharing = max(1, min(threads, self.l3_cpus))
        return self.with_(l3=self.l3 // sharing) if sharing > 1 else self

    def __str__(self) -> str:
        return (f"L1d {self.l1d // 1024} KiB, L2 {self.l2 // 1024} KiB, L3 {self.l3 // 1024} KiB "
                f"(shared by {self.l3_cpus} CPUs), line {self.line} B, {self.vector_registers} x {self.vector_bytes * 8}-bit vector "
                f"registers ({self.source}), {self.tuning.isa} tuning record"
                + (f" calibrated on this host ({self.tuning.calibration})"
                   if self.tuning.calibration else ""))


def read_sysfs_caches(path: str) -> dict[str, int]:
    """{'l1d', 'l2', 'l3', 'line', 'l3_cpus'} as found under ``path`` (a sysfs cache directory);
    {} if absent."""
    found: dict[str, int] = {}
    try:
        entries = sorted(e for e in os.listdir(path) if e.startswith("index"))
    except OSError:
        return found
    for entry in entries:
        try:
            level, kind, size, line = (_read(path, entry, name) for name in
                                       ("level", "type", "size", "coherency_line_size"))
        except OSError:
            continue
        if kind == "Instruction":
            continue
        key = {"1": "l1d", "2": "l2", "3": "l3"}.get(level)
        if key:
            found[key] = parse_size(size)
            found["line"] = int(line)
        if key == "l3":
            try:
                found["l3_cpus"] = count_cpus(_read(path, entry, "shared_cpu_list"))
            except (OSError, ValueError):
                pass
    return found


def count_cpus(cpu_list: str) -> int:
    """CPUs in a Linux CPU list: '0-1' -> 2, '0,2,4-7' -> 6."""
    count = 0
    for part in cpu_list.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def _read(path: str, entry: str, name: str) -> str:
    with open(os.path.join(path, entry, name)) as f:
        return f.read().strip()


def parse_size(text: str) -> int:
    """'48K' -> 49152, '1024K', '32M', '512' (bytes)."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)
