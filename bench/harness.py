"""The one benchmark harness: warm-up, repeated timed passes, percentiles, peak memory, JSON keyed by config.

Every speed claim in this project is a ratio against a baseline measured by the same harness in the same run.
"""

from __future__ import annotations

import json
import platform
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(fn: Callable[[Any], Any], items: Sequence[Any], *, warmup: int = 10, repeats: int = 3) -> dict[str, float]:
    """Call ``fn`` on every item, ``repeats`` passes after ``warmup`` calls; latency percentiles over all calls
    (ms), QPS from the best pass (the least disturbed by other load on a shared machine)."""
    for item in list(items)[:warmup]:
        fn(item)
    latencies: list[float] = []
    pass_seconds = []
    for _ in range(repeats):
        t_pass = time.perf_counter()
        for item in items:
            t = time.perf_counter()
            fn(item)
            latencies.append(time.perf_counter() - t)
        pass_seconds.append(time.perf_counter() - t_pass)
    lat = np.asarray(latencies) * 1000
    return {"qps": round(len(items) / min(pass_seconds), 2), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p95_ms": round(float(np.percentile(lat, 95)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "mean_ms": round(float(lat.mean()), 3), "calls": len(latencies), "peak_rss_mib": round(peak_rss_mib(), 1)}


def write_result(path: str | Path, name: str, config: dict[str, Any], result: dict[str, Any]) -> None:
    """Merge one result into a JSON file keyed by benchmark name and a stable rendering of its config."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    key = json.dumps(config, sort_keys=True)
    data.setdefault(name, {})[key] = {"config": config, "machine": machine(),
                                      "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
