"""The live index's settings: ``[live]`` (background rebuilds and the write buffer's bound).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import the live index, its models or its index libraries. :mod:`retrieval.live.live_index` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LiveConfig:
    """Background rebuilds of the live index: when this many writes are buffered, or the oldest buffered write
    is this old (0 = never by that rule); checked every ``check_interval_s``."""

    rebuild_after_writes: int = 1000
    rebuild_after_s: float = 600.0
    check_interval_s: float = 1.0
    # ONNX threads of the rebuild's own encoder: fewer than the cores leaves the rest to the queries being served
    # while a rebuild runs (0 = the serving encoder's setting). bench/live.py measures the effect.
    rebuild_threads: int = 1
    # Nice value of the rebuild thread (Linux: per thread): the scheduler gives the rebuild the CPU the queries
    # leave over, so serving latency stays steady (bench/live.py measures it). 0 = normal priority.
    rebuild_nice: int = 19
    # The write buffer's bound between rebuilds (live documents): an upsert that would pass it is refused at once
    # (RESOURCE_EXHAUSTED, "write buffer full") and starts the rebuild. 20 x rebuild_after_writes, so it binds only
    # when rebuilds cannot keep up. A buffered document holds ~46 KB (sample corpus, mostly int8 token vectors;
    # bench/live.py --parts buffer,memory), ~0.9 GB at the bound, more for long documents (~90 KB per full 224-token chunk).
    max_buffered_docs: int = 20_000

    def __post_init__(self) -> None:
        if self.rebuild_after_writes < 0 or self.rebuild_after_s < 0 or self.check_interval_s <= 0 \
                or self.rebuild_threads < 0 or not 0 <= self.rebuild_nice <= 19 or self.max_buffered_docs < 1:
            raise ValueError("live needs rebuild_after_writes >= 0, rebuild_after_s >= 0, check_interval_s > 0, "
                             "rebuild_threads >= 0, 0 <= rebuild_nice <= 19, max_buffered_docs >= 1")
