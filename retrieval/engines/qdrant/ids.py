"""Ids and the sparse encoding of the Qdrant backend: what every replica computes alike, with no shared state.

Point ids are 63 bits of BLAKE2b of ``id#part`` and document numbers 63 bits of BLAKE2b of the id: every replica
computes the same numbers for the same chunk, so writes from any replica need no coordination, and every stage
returns :class:`~index_builder.types.Hits` in them.

The ``bm25`` sparse vector holds a chunk's analysed terms (the same :class:`~index_builder.documents.analysis.Analyzer`
as the local BM25; term ids are the CRC-32 of the term, so no vocabulary is shared between replicas). Values are
Lucene's length-normalised term frequency ``tf / (tf + k1 * (1 - b + b * dl / avgdl))`` with ``avgdl`` from the
snapshot the collection was made from; Qdrant's ``IDF`` modifier multiplies in ``ln(1 + (N - df + 0.5) / (df + 0.5))``
at query time from its own live counts. That is exactly the local BM25 (bm25s, ``lucene`` method), so the two agree
to float precision until writes move ``avgdl``.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections import Counter
from collections.abc import Sequence


def _h63(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big") >> 1


def doc_number(doc_id: str) -> int:
    """The document number of ``doc_id`` on an engine backend (the same in every replica)."""
    return _h63(doc_id)


def point_id(doc_id: str, part: int) -> int:
    """The point id (chunk number) of chunk ``part`` of ``doc_id``."""
    return _h63(f"{doc_id}#{part}")


def term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8", "surrogatepass"))


def sparse_doc(terms: Sequence[str], avgdl: float, k1: float, b: float) -> tuple[list[int], list[float]]:
    """The ``bm25`` sparse vector of one passage's analysed terms (see the module doc).

    >>> sparse_doc(["bee", "bee", "hive"], avgdl=3.0, k1=1.5, b=0.75)[1]
    [0.5714285714285714, 0.4]
    """
    tf = Counter(terms)
    norm = k1 * (1 - b + b * len(terms) / avgdl) if avgdl > 0 else k1
    merged: dict[int, float] = {}
    for t, n in tf.items():  # two terms with one CRC (rare) add up, as one term would
        i = term_id(t)
        merged[i] = merged.get(i, 0.0) + n / (n + norm)
    return list(merged), list(merged.values())


def sparse_query(terms: Sequence[str]) -> tuple[list[int], list[float]]:
    """Query side: each term's count (a repeated query term counts each time, as bm25s scores it)."""
    tf = Counter(term_id(t) for t in terms)
    return list(tf), [float(v) for v in tf.values()]


def kv_pair(key: str, value: str) -> str:
    """One metadata pair as the payload's ``kv`` keeps it (a JSON ``[key, value]`` string: filters match it whole)."""
    return json.dumps([key, value], ensure_ascii=False)
