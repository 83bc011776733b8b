"""The live index's settings: ``[live]`` (background rebuilds and the write buffer's bound).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import the live index, its models or its index libraries. :mod:`retrieval.live.live_index` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from index_builder.settings import Section, bounded


@dataclass(frozen=True)
class LiveConfig(Section):
    """Background rebuilds of the live index: when this many writes are buffered, or the oldest buffered write
    is this old (0 = never by that rule); checked every ``check_interval_s``."""

    SECTION = "live"
    rebuild_after_writes: int = bounded(1000, 0, note="0 = never by count")
    rebuild_after_s: float = bounded(600.0, 0, note="0 = never by age")
    check_interval_s: float = bounded(1.0, 0, open_lo=True)
    # ONNX threads of the rebuild's own encoder: fewer than the cores leaves the rest to the queries served meanwhile
    # (bench/live.py measures it)
    rebuild_threads: int = bounded(1, 0, note="0 = the serving encoder's setting")
    # nice value of the rebuild thread (Linux: per thread): the rebuild gets the CPU the queries leave over, so
    # serving latency stays steady (bench/live.py measures it)
    rebuild_nice: int = bounded(19, 0, 19, note="0 = normal priority")
    # the write buffer's bound between rebuilds (live documents): an upsert past it is refused at once
    # (RESOURCE_EXHAUSTED, "write buffer full") and starts the rebuild; 20 x rebuild_after_writes, so it binds only
    # when rebuilds cannot keep up (a buffered document's memory: docs/results/hardening.md)
    max_buffered_docs: int = bounded(20_000, 1)
