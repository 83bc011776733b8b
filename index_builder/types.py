"""Result and document types shared by every stage.

One result type, :class:`Hits`, flows between stages: parallel arrays of document indices (positions in the
snapshot's document table), scores and the chunk that produced each score. No loose dicts between stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Document:
    """One corpus document as read from JSONL (BEIR or plain)."""

    id: str
    text: str
    title: str = ""
    tenant: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hits:
    """A ranked list: ``doc[i]`` scored ``scores[i]`` through chunk ``chunk[i]``; best first.

    Shapes: ``doc`` int64 [n], ``scores`` float32 [n], ``chunk`` int64 [n] (global chunk index, -1 if unknown).
    """

    doc: np.ndarray
    scores: np.ndarray
    chunk: np.ndarray

    def __post_init__(self) -> None:
        if not (len(self.doc) == len(self.scores) == len(self.chunk)):
            raise ValueError(
                f"Hits arrays differ in length: doc {len(self.doc)}, scores {len(self.scores)}, chunk {len(self.chunk)}"
            )

    @classmethod
    def empty(cls) -> Hits:
        return cls(np.empty(0, np.int64), np.empty(0, np.float32), np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.doc)

    def top(self, k: int) -> Hits:
        return Hits(self.doc[:k], self.scores[:k], self.chunk[:k])
