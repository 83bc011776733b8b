"""Deadline bookkeeping: a request's deadline (absolute, or a configured budget), each stage's recent latency, and
the policy that skips the costliest remaining stages when the time left is below what they recently took (the
cross-encoder first, then late interaction). The pipeline applies it between stages; the result names each skip
and is marked degraded."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from retrieval.errors import DeadlineExceeded


class StageLatency:
    """Recent latencies per stage (a bounded window), for deadline decisions."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._ms: dict[str, deque[float]] = {}

    def record(self, stage: str, ms: float) -> None:
        self._ms.setdefault(stage, deque(maxlen=self.window)).append(ms)

    def p95(self, stage: str) -> float:
        """The stage's recent p95 in ms; 0.0 before it has run (an unknown stage is given the chance to run)."""
        values = self._ms.get(stage)  # list(): one C call under the GIL, safe while a solo search appends
        return float(np.percentile(np.array(list(values), dtype=np.float64), 95)) if values else 0.0


@dataclass(frozen=True)
class Deadline:
    """A request's deadline: ``at`` in ``time.monotonic()`` seconds, None = none.

    >>> Deadline(None).left_ms()
    inf
    >>> Deadline.of(None, budget_ms=0.0).at is None
    True
    """

    at: float | None

    @classmethod
    def of(cls, deadline: float | None, budget_ms: float) -> Deadline:
        """The request's own deadline, else ``budget_ms`` from now (``rerank.budget_ms``; 0 = none)."""
        if deadline is None and budget_ms > 0:
            deadline = time.monotonic() + budget_ms / 1000.0
        return cls(deadline)

    def left_ms(self) -> float:
        return float("inf") if self.at is None else (self.at - time.monotonic()) * 1000.0

    def check_started(self) -> None:
        """Refuse a request whose deadline passed before it started."""
        if self.at is not None and time.monotonic() >= self.at:
            raise DeadlineExceeded("the request's deadline passed before it started")


def before_late_interaction(left_ms: float, need_li: float, need_ce: float, want_ce: bool
                            ) -> tuple[str | None, str | None]:
    """(why the cross-encoder is skipped, why late interaction is skipped), None = it runs: before late interaction,
    both must fit in the time left (by their recent p95), else the cross-encoder goes first, then late interaction.

    >>> before_late_interaction(100.0, 5.0, 20.0, True)
    (None, None)
    >>> before_late_interaction(10.0, 5.0, 20.0, True)[0]
    'deadline: 10 ms left, below the late_interaction + cross_encoder p95 (5 + 20 ms)'
    """
    skip_ce = skip_li = None
    if want_ce and left_ms < need_li + need_ce:
        skip_ce = (f"deadline: {left_ms:.0f} ms left, below the late_interaction + cross_encoder p95 "
                   f"({need_li:.0f} + {need_ce:.0f} ms)")
    if left_ms < need_li:
        skip_li = f"deadline: {left_ms:.0f} ms left, below the late_interaction p95 ({need_li:.0f} ms)"
    return skip_ce, skip_li


def before_cross_encoder(left_ms: float, need_ce: float) -> str | None:
    """Why the cross-encoder is skipped (the time left is below its recent p95), None = it runs."""
    if left_ms < need_ce:
        return f"deadline: {left_ms:.0f} ms left, below the cross_encoder p95 ({need_ce:.0f} ms)"
    return None
