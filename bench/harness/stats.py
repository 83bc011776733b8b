"""Figures from timings: percentiles, ratios, timed passes in process, modes alternated per round, memory.

Every benchmark reports latencies through :func:`percentiles` (one shape everywhere: ``n``, ``p50_ms``,
``p95_ms``, ``p99_ms``, ``mean_ms``, ``max_ms``; None when nothing was measured), so no script computes its own.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np


def percentiles(values_ms: Iterable[float], digits: int = 2) -> dict[str, Any]:
    """The latency summary of a list of milliseconds.

    >>> percentiles([1.0, 2.0, 3.0, 4.0])
    {'n': 4, 'p50_ms': 2.5, 'p95_ms': 3.85, 'p99_ms': 3.97, 'mean_ms': 2.5, 'max_ms': 4.0}
    >>> percentiles([])["p50_ms"] is None
    True
    """
    a = np.asarray(list(values_ms), dtype=np.float64)
    if not len(a):
        return {"n": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"n": len(a), "p50_ms": round(float(p50), digits), "p95_ms": round(float(p95), digits),
            "p99_ms": round(float(p99), digits), "mean_ms": round(float(a.mean()), digits),
            "max_ms": round(float(a.max()), digits)}


def median(values: Iterable[float], digits: int = 3) -> float | None:
    """The median of ``values`` (None when empty).

    >>> median([3.0, 1.0, 2.0])
    2.0
    """
    a = np.asarray(list(values), dtype=np.float64)
    return round(float(np.median(a)), digits) if len(a) else None


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """``numerator / denominator`` rounded, None when either is missing or the denominator is 0.

    >>> ratio(3.0, 2.0), ratio(1.0, 0.0), ratio(None, 2.0)
    (1.5, None, None)
    """
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def timed_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and its wall time in ms."""
    t = time.perf_counter()
    out = fn()
    return out, ms_since(t)


def measure(fn: Callable[[Any], Any], items: Sequence[Any], *, warmup: int = 10, repeats: int = 3) -> dict[str, Any]:
    """Call ``fn`` on every item, ``repeats`` passes after ``warmup`` calls: latency percentiles over all calls
    (ms), QPS from the best pass (the least disturbed by other load on a shared machine), peak memory."""
    for item in list(items)[:warmup]:
        fn(item)
    latencies: list[float] = []
    pass_seconds = []
    for _ in range(repeats):
        t_pass = time.perf_counter()
        for item in items:
            t = time.perf_counter()
            fn(item)
            latencies.append(ms_since(t))
        pass_seconds.append(time.perf_counter() - t_pass)
    out = percentiles(latencies, digits=3)
    return {"qps": round(len(items) / min(pass_seconds), 2), **out, "calls": out["n"],
            "peak_rss_mib": peak_rss_mib()}


def alternate(modes: dict[str, Callable[[], dict[str, Any]]], rounds: int,
              better: Callable[[dict[str, Any], dict[str, Any]], bool]) -> tuple[dict[str, dict], dict[str, list]]:
    """Run every mode once per round, in order (off, on, off, on, ...), so that a shift in the machine's load hits
    them alike; keep each mode's best round (``better(new, best)``). Returns (best per mode, every round per mode).

    >>> it = iter([3, 1, 5, 2])
    >>> best, rounds = alternate({"a": lambda: {"x": next(it)}, "b": lambda: {"x": next(it)}}, 2,
    ...                          lambda new, old: new["x"] > old["x"])
    >>> best, rounds["a"]
    ({'a': {'x': 5}, 'b': {'x': 2}}, [{'x': 3}, {'x': 5}])
    """
    every: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    best: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        for mode, run in modes.items():
            r = run()
            every[mode].append(r)
            if mode not in best or better(r, best[mode]):
                best[mode] = r
    return best, every


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def children_peak_rss_mib() -> float:
    """The largest peak resident memory (MiB) of this process's waited-for children (a stopped server)."""
    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0, 1)


def vm_rss_mib(field: str = "VmRSS", pid: int | str = "self") -> float:
    """A memory line of ``/proc/PID/status`` in MiB (NaN when absent)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def proc_memory_mib(pid: int | str = "self") -> dict[str, float]:
    """A process's memory from ``/proc/PID/status`` in MiB: ``rss`` (VmRSS), its parts ``anon`` (heap, arrays read
    into memory), ``file`` (pages of mapped files: memory-mapped index parts, libraries; the kernel may drop them)
    and ``shmem``, and ``hwm`` (the peak RSS so far). NaN where absent."""
    fields = {"rss": "VmRSS", "anon": "RssAnon", "file": "RssFile", "shmem": "RssShmem", "hwm": "VmHWM"}
    return {k: round(vm_rss_mib(f, pid), 1) for k, f in fields.items()}


def mapped_files_mib(pid: int | str = "self", under: str = "") -> dict[str, float]:
    """Resident MiB of each memory-mapped file of a process (``/proc/PID/smaps``), those under ``under`` only when
    given: which files a process holds in memory through maps (index parts read where they lie)."""
    out: dict[str, float] = {}
    path = ""
    try:
        with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if not head.endswith(":"):  # a mapping's header line: address range, perms, offset, dev, inode, path
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) == 6 else ""
                elif head == "Rss:" and path.startswith(under or "/"):
                    out[path] = out.get(path, 0.0) + int(line.split()[1]) / 1024.0
    except OSError:
        return {}
    return {k: round(v, 1) for k, v in sorted(out.items()) if round(v, 1) > 0}


class RssSampler:
    """The peak of ``VmRSS`` sampled every ``interval_s`` on a thread, between ``start()`` and ``stop()``."""

    def __init__(self, interval_s: float = 0.25, pid: int | str = "self") -> None:
        self.interval_s, self.pid = interval_s, pid
        self.peak_mib = vm_rss_mib(pid=pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_mib = max(self.peak_mib, vm_rss_mib(pid=self.pid))

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_mib, 1)
