"""The service's answers as proto messages, shared by both doors through the core: a search's passages (each with its
rank in every stage and its highlights) within the size every client can take, a listed document, a Generate's
stats. Stored names that somehow hold a lone surrogate are escaped, never a failed answer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from index_builder.documents.corpus import lone_surrogate, without_surrogates
from index_builder.types import Document
from retrieval.api import retriever_pb2 as pb
from retrieval.errors import InvalidRequest
from retrieval.generation.generator import Stats
from retrieval.search.results import SearchResult


def _stage_ranks(result: SearchResult, docs: list[int]) -> dict[int, list[pb.StageScore]]:
    """Each returned document's rank and score in every stage's list (one pass over each list)."""
    wanted = set(docs)
    out: dict[int, list[pb.StageScore]] = {d: [] for d in docs}
    for stage, hits in result.stages.items():
        seen: set[int] = set()
        for i, (d, score) in enumerate(zip(hits.doc.tolist(), hits.scores.tolist(), strict=True)):
            if d in wanted and d not in seen:  # the first (best) place of the document in this stage
                seen.add(d)
                out[d].append(pb.StageScore(stage=stage, rank=i + 1, score=float(score)))
    return out


def wire(s: str) -> str:
    r"""A stored name (an id, a tenant, a metadata key or value) as a protobuf string field takes it: one that
    somehow holds a lone surrogate (a snapshot or store row written before names were checked, or by another tool)
    has it escaped as ``\udce9``, visible and distinct, rather than failing the whole answer.

    >>> wire("caf\udce9"), wire("café")
    ('caf\\udce9', 'café')
    """
    return s if lone_surrogate(s) < 0 else s.encode("utf-8", "backslashreplace").decode("utf-8")


_ESCAPED_BYTE = re.compile(r"\\udc([89a-f][0-9a-f])")


def unwire(after: str) -> str:
    r"""A listing cursor as given back: an id listed with :func:`wire`'s escapes of bytes that are not UTF-8
    (``\udc80``-``\udcff``, what the store reads them as) is that id again, so paging moves past it instead of
    listing it again (an id that really holds the text ``\udce9`` would be read as the byte: at worst a few ids
    sharing its prefix are skipped).

    >>> unwire("store-caf\\udce9") == "store-caf\udce9", unwire("plain")
    (True, 'plain')
    """
    if "\\udc" not in after:
        return after
    return _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), after)


def _passage(doc: Document, c: int, score: float, text: str, stages: list[pb.StageScore],
             highlights: Sequence[Any]) -> pb.Passage:
    def build(doc_id: str, title: str, text: str, tenant: str, metadata: dict[str, str]) -> pb.Passage:
        return pb.Passage(doc_id=doc_id, chunk_id=c, title=title, text=text, score=score, stages=stages, tenant=tenant,
                          metadata=metadata,
                          highlights=[pb.Highlight(start=h.start, end=h.end, text=text[h.start:h.end], score=h.score)
                                      for h in highlights])
    metadata = {k: str(v) for k, v in doc.metadata.items()}
    try:
        return build(doc.id, doc.title, text, doc.tenant, metadata)
    except UnicodeEncodeError:  # a lone surrogate somewhere (see wire): escaped, U+FFFD in text (offsets hold)
        return build(wire(doc.id), without_surrogates(doc.title), without_surrogates(text), wire(doc.tenant),
                     {wire(k): wire(v) for k, v in metadata.items()})


MAX_MESSAGE_BYTES_DEFAULT = 16 * 2**20  # [server] max_message_mb's default
# The most an answer may be serialized: gRPC's default receive limit, the one every client has unless it raises it
# (Python, Go, Java, grpcurl: 4 MiB), and never over [server] max_message_mb. A larger answer is refused by the
# client itself with RESOURCE_EXHAUSTED; HTTP bodies get the same bound.
MAX_ANSWER_BYTES = 4 * 2**20
# What an answer leaves for the gRPC frame and a Generate event's wrapper, below the limit.
MESSAGE_HEADROOM = 64 * 2**10


def fit_response(response: pb.RetrieveResponse, limit: int) -> pb.RetrieveResponse:
    """``response`` within ``limit`` bytes serialized (:data:`MAX_ANSWER_BYTES`: past it gRPC fails the call with
    RESOURCE_EXHAUSTED, a code that means overload, and HTTP sent 18 MB bodies): when it is over, the passages'
    texts are cut, the longest first, to a common size in bytes that fits (water-filling: a short passage keeps its
    whole text), each cut one marked ``truncated`` with its full ``text_chars``, and its highlights past the cut
    dropped. InvalidRequest naming the limit when even the answer without its texts does not fit (many passages
    with large titles and metadata): fewer passages (``top_k``) would."""
    budget = limit - MESSAGE_HEADROOM
    size = response.ByteSize()
    if size <= budget:
        return response
    raw = [p.text.encode("utf-8") for p in response.passages]
    available = budget - (size - sum(len(b) for b in raw))
    n = len(raw)
    if available <= 64 * n:
        raise InvalidRequest(f"the answer would be {size} bytes, over the limit of {limit} bytes on an answer "
                             f"(gRPC clients' default receive limit) even with its passages' texts cut: ask for fewer "
                             f"passages than {n} (top_k)")
    cap, left = 0, available
    for i, b in enumerate(sorted(len(r) for r in raw)):
        if b * (n - i) > left:
            cap = left // (n - i)
            break
        left -= b
    for p, b in zip(response.passages, raw, strict=True):
        if len(b) <= cap:
            continue
        full = len(p.text)
        text = b[:cap].decode("utf-8", errors="ignore")  # at a character boundary
        kept = [h for h in p.highlights if h.end <= len(text)]
        p.text, p.truncated, p.text_chars = text, True, full
        del p.highlights[:]
        p.highlights.extend(kept)
    return response


def to_response(result: SearchResult, request_id: str, max_bytes: int = MAX_ANSWER_BYTES) -> pb.RetrieveResponse:
    """The answer's message, within ``max_bytes`` serialized (:func:`fit_response`)."""
    index = result.index  # the generation that served the request (a swap may have happened since)
    passages = []
    docs = result.hits.doc.tolist()
    ranks = _stage_ranks(result, docs)
    for d, s, c in zip(docs, result.hits.scores.tolist(), result.hits.chunk.tolist(), strict=True):
        passages.append(_passage(index.documents[d], int(c), float(s), index.passage(int(c)), ranks[d],
                                 result.highlights.get(c, ())))
    return fit_response(pb.RetrieveResponse(
        passages=passages, timings_ms={k: float(v) for k, v in result.timings_ms.items()},
        stages_run=[s for s in result.stages if s != "fused"],
        skipped=[pb.SkippedStage(stage=k, reason=v) for k, v in result.skipped.items()],
        degraded=result.degraded, index_generation=result.generation, request_id=request_id,
        cache_hit=result.cache_hit, cache_similarity=result.cache_similarity), max_bytes)


def document_info(doc_id: str, tenant: str, title: str, metadata: dict[str, str], seq: int) -> pb.DocumentInfo:
    """A listed document as its message (a stored name that somehow holds a lone surrogate escaped: :func:`wire`)."""
    try:
        return pb.DocumentInfo(id=doc_id, tenant=tenant, title=title, metadata=metadata, sequence=seq)
    except UnicodeEncodeError:
        return pb.DocumentInfo(id=wire(doc_id), tenant=wire(tenant), title=without_surrogates(title),
                               metadata={wire(k): wire(v) for k, v in metadata.items()}, sequence=seq)


def stats_message(event: Stats) -> pb.GenerateStats:
    return pb.GenerateStats(
        retrieval_ms=event.retrieval_ms, time_to_first_token_ms=event.time_to_first_token_ms,
        generation_ms=event.generation_ms, tokens_in=event.tokens_in, tokens_out=event.tokens_out,
        model=event.model, cache_hit=event.cache_hit, route=event.route,
        passages_in_prompt=event.passages_in_prompt, context_truncated=event.context_truncated,
        finish_reason=event.finish_reason)
