"""Where figures go: one JSON file per run, each benchmark's entry keyed by a stable rendering of its
configuration, with the machine it ran on, the time and peak memory; and the inputs every script shares (a
dataset's judged queries, comma-separated levels)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.harness.stats import children_peak_rss_mib, peak_rss_mib


def machine() -> dict[str, Any]:
    """The CPU, core count, Python and platform the figures were measured on."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def write_result(path: str | Path, name: str, config: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Merge one result into a JSON file keyed by benchmark name and a stable rendering of its config; the entry
    also records the machine, the time, and the peak memory of this process and of its largest waited-for child
    (a spawned server, once stopped). Returns the entry written."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    key = json.dumps(config, sort_keys=True, default=str)
    entry = {"config": config, "machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "peak_rss_mib": {"self": peak_rss_mib(), "children": children_peak_rss_mib()}, **result}
    data.setdefault(name, {})[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return entry


def read_result(path: str | Path, name: str) -> dict[str, Any]:
    """The one entry of benchmark ``name`` in a JSON file that holds one (a run's own output)."""
    (entry,) = json.loads(Path(path).read_text())[name].values()
    return entry


def query_list(dataset: str | Path, split: str = "test", limit: int = 0) -> tuple[list[tuple[str, str]], dict]:
    """A BEIR folder's judged queries of ``split`` as ``[(qid, text)]`` (the first ``limit``; 0 = all), and their
    judgments."""
    from retrieval.evaluate import judged_queries

    queries, qrels = judged_queries(Path(dataset), split, limit)
    return list(queries.items()), qrels


def ints(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]`` (empty items skipped).

    >>> ints("1, 4,,16"), ints("")
    ([1, 4, 16], [])
    """
    return [int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    """``"5,10.5"`` -> ``[5.0, 10.5]``.

    >>> floats("5,10.5")
    [5.0, 10.5]
    """
    return [float(x) for x in text.split(",") if x.strip()]


def names(text: str) -> tuple[str, ...]:
    """``"bm25,dense"`` -> ``("bm25", "dense")``.

    >>> names("bm25,,dense"), names("")
    (('bm25', 'dense'), ())
    """
    return tuple(x.strip() for x in text.split(",") if x.strip())
