"""The first stage on Qdrant, behind the same index contract as the local snapshot (:mod:`retrieval.search.view`).

One Qdrant point per chunk, with three named vectors and the chunk's payload:

- ``dense``: the embedder's vector (dot product; the vectors are unit length), HNSW on a server;
- ``bm25``: a sparse vector of the chunk's analysed terms (the same :class:`~index_builder.documents.analysis.Analyzer` as
  the local BM25; term ids are the CRC-32 of the term, so no vocabulary is shared between replicas). Values are
  Lucene's length-normalised term frequency ``tf / (tf + k1 * (1 - b + b * dl / avgdl))`` with ``avgdl`` from
  the snapshot the collection was made from; Qdrant's ``IDF`` modifier multiplies in
  ``ln(1 + (N - df + 0.5) / (df + 0.5))`` at query time from its own live counts. That is exactly the local
  BM25 (bm25s, ``lucene`` method), so the two agree to float precision until writes move ``avgdl``;
- ``tokens``: the late-interaction token vectors as a multivector with ``MAX_SIM`` (no HNSW on it: it only
  rescores candidates), so MaxSim over the top 20 runs in the engine and no token vectors cross the network.

Payload: ``doc`` (the document number: 63 bits of BLAKE2b of its id), ``id``, ``part`` / ``parts`` (the chunk's
position in its document), ``title``, ``text`` (the chunk's text), ``tenant``, ``kv`` (each metadata pair as a
JSON ``[key, value]`` string: tenancy by construction, no metadata can name a tenant) and ``meta``. Point ids are
63 bits of BLAKE2b of ``id#part``: every replica computes the same id for the same chunk, so writes from any
replica need no coordination.

Document numbers and chunk numbers are these hashes (not positions): every stage returns
:class:`~index_builder.types.Hits` in them, and the view resolves them from the payloads its searches returned
(a bounded cache), else with one engine call.

First stage: BM25 and dense are two grouped queries (``group_by = "doc"``, one chunk per document) that the
pipeline runs in parallel and fuses with its own weighted RRF, as for the local snapshot, so quality is
comparable query for query. (Qdrant can fuse in one request with ``prefetch`` + RRF, but over points, unweighted,
with its own k: the document-level weighted fusion is what the served figures are measured with.)

Writes go straight to the engine (:class:`EngineWriter`): a write is acknowledged when Qdrant answers
``wait=true``, i.e. the operation is in the write-ahead log of the shard's replicas (``write_consistency_factor``
of them on a cluster) and applied to the segments, so the next query anywhere sees it. No local buffer, no
rebuild: the engine indexes online.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import logging
import threading
import time
import warnings
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import Chunker, chunk_passage, chunk_passages
from index_builder.errors import ConfigError
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import AnalyzerConfig, ChunkConfig
from index_builder.snapshot.format import LoadedSnapshot
from index_builder.snapshot.manifest import check_settings
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document, Hits
from rerank.late_interaction import LateInteractionReranker, Reordering, rerank_head
from retrieval.engines.settings import EngineConfig
from retrieval.errors import BackendUnavailable, InvalidRequest, PermissionDenied
from retrieval.live.store import MAX_BATCH, WriteResult, check_deadline, validate_batch
from retrieval.search.filters import Filter

log = logging.getLogger(__name__)

FORMAT = 1
PAYLOAD_CACHE = 50_000  # chunks whose payload a view keeps from its searches (documents and passages of results)


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


def stored_form(tokens: Sequence[np.ndarray], dim: int, storage: str) -> list[np.ndarray]:
    """Passages' token vectors as a snapshot of ``storage`` keeps them, decoded to floats (a pooled store: one
    vector per cluster of tokens): what a write puts in the engine, so that a written passage is scored as a
    migrated one. ``float32`` (a collection not made from a snapshot's store) keeps them as they are."""
    if storage == "float32" or not len(tokens):
        return [np.asarray(t, dtype=np.float32) for t in tokens]
    store = TokenStore.from_lists(tokens, dim, storage)
    late = LateInteractionReranker(store.vectors, store.offsets, store.scales, store.storage)
    return [late.decoded(i) for i in range(len(tokens))]


def _kv(key: str, value: str) -> str:
    return json.dumps([key, value], ensure_ascii=False)


@dataclass(frozen=True)
class EngineSnapshot:
    """What status reads of "the snapshot" on an engine backend: the collection's recorded settings."""

    manifest: dict[str, Any]
    path: str
    documents: Sequence[Any] = ()

    @property
    def generation(self) -> int:
        return int(self.manifest.get("generation", 0))


class _Serialised:
    """Every call of the wrapped client under one lock: Qdrant's local engine is not thread-safe (its collections
    are plain Python and numpy structures), and the pipeline calls it from its worker threads."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return locked


def connect(config: EngineConfig):
    """A qdrant-client for ``config.location`` (imported here: the local backend never needs it)."""
    from qdrant_client import QdrantClient

    if config.remote:
        return QdrantClient(url=config.location, api_key=config.api_key or None, prefer_grpc=config.prefer_grpc,
                            timeout=int(config.timeout_s), check_compatibility=False)
    if config.location == ":memory:":
        return _Serialised(QdrantClient(location=":memory:"))
    Path(config.location).mkdir(parents=True, exist_ok=True)
    return _Serialised(QdrantClient(path=config.location))


class QdrantEngine:
    """One collection of chunks on one Qdrant (local engine or server): schema, migration, reads and writes."""

    def __init__(self, config: EngineConfig, client: Any = None) -> None:
        from qdrant_client import models

        self.m = models
        self.config = config
        self.name = config.collection
        try:
            self.client = client or connect(config)
        except Exception as e:  # noqa: BLE001 -- a folder held by another process, a server that does not answer
            raise BackendUnavailable(f"cannot open the Qdrant backend at {config.location}: {e}") from None

    # ------------------------------------------------------------------ collection

    def exists(self) -> bool:
        return bool(self.client.collection_exists(self.name))

    def metadata(self) -> dict[str, Any]:
        info = self.client.get_collection(self.name)
        return dict(info.config.metadata or {})

    def points(self) -> int:
        return int(self.client.count(self.name, exact=True).count)

    def documents(self) -> int:
        m = self.m
        return int(self.client.count(self.name, count_filter=m.Filter(must=[
            m.FieldCondition(key="part", match=m.MatchValue(value=0))]), exact=True).count)

    def create(self, dim: int, token_dim: int | None, metadata: dict[str, Any]) -> None:
        m = self.m
        vectors = {"dense": m.VectorParams(size=dim, distance=m.Distance.DOT)}
        if token_dim:
            vectors["tokens"] = self.token_params(token_dim)
        self.client.create_collection(
            self.name, vectors_config=vectors,
            sparse_vectors_config={"bm25": m.SparseVectorParams(modifier=m.Modifier.IDF)},
            shard_number=self.config.shards if self.config.remote else None,
            replication_factor=self.config.replicas if self.config.remote else None,
            metadata=metadata)
        with warnings.catch_warnings():  # local mode: "payload indexes have no effect" (it scans)
            warnings.simplefilter("ignore")
            self.client.create_payload_index(self.name, "tenant", m.KeywordIndexParams(
                type=m.KeywordIndexType.KEYWORD, is_tenant=True))
            for key, schema in (("doc", m.PayloadSchemaType.INTEGER), ("id", m.PayloadSchemaType.KEYWORD),
                                ("part", m.PayloadSchemaType.INTEGER), ("kv", m.PayloadSchemaType.KEYWORD)):
                self.client.create_payload_index(self.name, key, schema)

    def token_params(self, token_dim: int) -> Any:
        """The late-interaction multivector: MaxSim, no HNSW (it only rescores candidates), ``token_datatype``,
        on disk or in RAM (``token_memory``), with a quantized copy in RAM when ``token_quantization`` says so."""
        m, c = self.m, self.config
        quant = None
        if c.token_quantization == "binary":  # asymmetric: documents 1 bit a dimension, the query at 8 bits
            quant = m.BinaryQuantization(binary=m.BinaryQuantizationConfig(
                always_ram=True, query_encoding=m.BinaryQuantizationQueryEncoding.SCALAR8BITS))
        elif c.token_quantization == "int8":
            quant = m.ScalarQuantization(scalar=m.ScalarQuantizationConfig(type=m.ScalarType.INT8, always_ram=True))
        return m.VectorParams(
            size=token_dim, distance=m.Distance.DOT, hnsw_config=m.HnswConfigDiff(m=0),
            datatype=m.Datatype.FLOAT16 if c.token_datatype == "float16" else m.Datatype.FLOAT32,
            on_disk=c.token_memory == "disk", quantization_config=quant,
            multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM))

    def drop(self) -> None:
        if self.exists():
            self.client.delete_collection(self.name)

    # ------------------------------------------------------------------ points

    def make_points(self, docs: Sequence[Document], chunks: np.ndarray, vectors: np.ndarray,
                    tokens: Sequence[np.ndarray] | None, analyzer: Analyzer, avgdl: float, k1: float,
                    b: float, positions: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        """One point per chunk (``chunks``: structured rows doc/start/end over ``docs``, in document order;
        ``positions``: each chunk's (part, parts) when ``chunks`` is not every chunk of its documents)."""
        m = self.m
        passages = chunk_passages(docs, chunks)
        terms = analyzer.batch(passages)
        if positions is None:
            counts = Counter(int(c["doc"]) for c in chunks)
            seen: Counter[int] = Counter()
            positions = []
            for c in chunks:
                positions.append((seen[int(c["doc"])], counts[int(c["doc"])]))
                seen[int(c["doc"])] += 1
        points = []
        for i, c in enumerate(chunks):
            doc = docs[int(c["doc"])]
            part, parts = positions[i]
            idx, val = sparse_doc(terms[i], avgdl, k1, b)
            vec: dict[str, Any] = {"dense": np.asarray(vectors[i], dtype=np.float32),
                                   "bm25": m.SparseVector(indices=idx, values=val)}
            if tokens is not None and len(tokens[i]):
                vec["tokens"] = np.asarray(tokens[i], dtype=np.float32)
            payload = {"doc": doc_number(doc.id), "id": doc.id, "part": part, "parts": parts, "title": doc.title,
                       "text": doc.text[int(c["start"]):int(c["end"])], "tenant": doc.tenant,
                       "kv": [_kv(k, v) for k, v in sorted(doc.metadata.items())], "meta": dict(doc.metadata)}
            points.append(m.PointStruct(id=point_id(doc.id, part), vector=vec, payload=payload))
        return points

    def migrate(self, snap: LoadedSnapshot, *, replace: bool = False, progress: bool = False) -> dict[str, Any]:
        """Copy a built snapshot into the collection, reusing its dense and token vectors (nothing is
        re-embedded). Refuses an existing collection unless ``replace``. Returns what was done."""
        t0 = time.perf_counter()
        plan = self.start_migration(snap, replace=replace)
        self.upload(snap, plan, 0, len(snap.chunks), progress=progress)
        return self.migrated(snap, t0)

    def start_migration(self, snap: LoadedSnapshot, *, replace: bool = False) -> dict[str, Any]:
        """Create the collection for ``snap`` (its metadata: generation, BM25 parameters, models); the plan that
        :meth:`upload` takes for any range of its chunks, here or in another process (a Ray task)."""
        if snap.vectors is None:
            raise ConfigError(f"snapshot {snap.path} has no dense vectors ({snap.dense_error}); rebuild it first")
        if self.exists():
            if not replace:
                raise ConfigError(f"collection {self.name!r} already exists at {self.config.location}; "
                                  "pass --replace to overwrite it")
            self.drop()
        man = snap.manifest
        analyzer = {k: man["analyzer"][k] for k in ("stemmer", "stopwords", "lowercase")}
        bm = man.get("bm25", {})
        avgdl = bm.get("avgdl")
        if avgdl is None:
            terms = Analyzer(AnalyzerConfig(**analyzer)).batch(chunk_passages(snap.documents, snap.chunks))
            avgdl = float(np.mean([len(t) for t in terms])) if terms else 0.0
        k1, b = float(bm.get("k1", 1.5)), float(bm.get("b", 0.75))
        has_tokens = snap.token_vectors is not None and snap.token_offsets is not None
        token_dim = int((snap.manifest.get("models", {}).get("token_encoder") or {}).get("dim") or 0) or None
        if has_tokens and token_dim is None:
            assert snap.token_vectors is not None
            token_dim = int(snap.token_vectors.shape[1])
        metadata = {"format": FORMAT, "generation": snap.generation, "source": str(snap.path),
                    "migrated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "avgdl": float(avgdl), "k1": k1, "b": b,
                    "manifest": {k: man[k] for k in ("models", "analyzer", "bm25", "hnsw", "chunking", "dim",
                                                      "created_at", "generation") if k in man}}
        assert snap.vectors is not None
        self.create(int(snap.vectors.shape[1]), token_dim, metadata)
        storage = str((man.get("models", {}).get("token_encoder") or {}).get("dtype", "int8"))
        return {"analyzer": analyzer, "avgdl": float(avgdl), "k1": k1, "b": b,
                "storage": storage if has_tokens else ""}

    def upload(self, snap: LoadedSnapshot, plan: dict[str, Any], start: int, stop: int, *,
               progress: bool = False) -> int:
        """Upsert chunks ``start:stop`` of ``snap`` (``upload_batch`` points a call, waited for). Idempotent: point
        ids come from document ids and chunk positions, so a retried range writes the same points."""
        assert snap.vectors is not None
        analyzer = Analyzer(AnalyzerConfig(**plan["analyzer"]))
        stored = None
        if plan["storage"]:
            assert snap.token_vectors is not None and snap.token_offsets is not None
            # a compact store goes in as the vectors its codes stand for (pooled: fewer of them), so the engine's
            # MaxSim scores as the snapshot's stage does
            stored = LateInteractionReranker(snap.token_vectors, snap.token_offsets, snap.token_scales,
                                             plan["storage"])
        chunk_doc = np.asarray(snap.chunks["doc"], dtype=np.int64)
        counts = np.bincount(chunk_doc, minlength=len(snap.documents))
        first = np.searchsorted(chunk_doc, np.arange(len(snap.documents)), side="left")
        batch = self.config.upload_batch
        for a in range(start, stop, batch):
            rows = np.arange(a, min(stop, a + batch))
            tokens = None
            if stored is not None:
                tokens = [stored.decoded(r) for r in rows.tolist()]
            positions = [(int(r) - int(first[d]), int(counts[d])) for r, d in zip(rows.tolist(),
                                                                                  chunk_doc[rows].tolist(),
                                                                                  strict=True)]
            pts = self.make_points(snap.documents, snap.chunks[rows], np.asarray(snap.vectors[rows]), tokens,
                                   analyzer, plan["avgdl"], plan["k1"], plan["b"], positions)
            self.client.upsert(self.name, pts, wait=True)
            if progress and ((a - start) // batch) % 20 == 0:
                log.info("migrated %d / %d chunks", min(stop, a + batch) - start, stop - start)
        return stop - start

    def migrated(self, snap: LoadedSnapshot, t0: float) -> dict[str, Any]:
        """What :meth:`migrate` reports (``t0``: when it began)."""
        return {"collection": self.name, "location": self.config.location, "documents": len(snap.documents),
                "chunks": len(snap.chunks), "token_vectors": snap.token_vectors is not None,
                "seconds": round(time.perf_counter() - t0, 1), "generation": snap.generation}

    # ------------------------------------------------------------------ filters and queries

    def filter_of(self, f: Filter) -> Any:
        m = self.m
        must = [m.FieldCondition(key="tenant", match=m.MatchValue(value=f.tenant))] if f.tenant else []
        must += [m.FieldCondition(key="kv", match=m.MatchValue(value=_kv(k, v))) for k, v in f.metadata]
        return m.Filter(must=must)

    def grouped(self, query: Any, using: str, k: int, qfilter: Any, exact: bool = False) -> list[tuple[Any, float]]:
        """Top ``k`` documents (best chunk each) for ``query`` on vector ``using``: [(point, score)]."""
        m = self.m
        # local mode is exact search and warns on any search_params
        params = m.SearchParams(exact=exact, hnsw_ef=self.config.hnsw_ef or None) if self.config.remote else None
        res = self.client.query_points_groups(self.name, query=query, using=using, group_by="doc", group_size=1,
                                              limit=k, query_filter=qfilter, search_params=params, with_payload=True)
        return [(g.hits[0], float(g.hits[0].score)) for g in res.groups if g.hits]

    def maxsim(self, query_tokens: np.ndarray, ids: Sequence[int]) -> dict[int, float]:
        """MaxSim of the query's token vectors against each of ``ids``' stored token vectors, in the engine."""
        m = self.m
        params = None  # local mode scores float32 in RAM and warns on any search_params
        if self.config.remote and self.config.token_quantization != "none":
            params = m.SearchParams(quantization=m.QuantizationSearchParams(rescore=self.config.token_rescore))
        res = self.client.query_points(self.name, query=np.asarray(query_tokens, dtype=np.float32), using="tokens",
                                       query_filter=m.Filter(must=[m.HasIdCondition(has_id=list(ids))]),
                                       limit=len(ids), with_payload=False, search_params=params)
        return {int(p.id): float(p.score) for p in res.points}

    def retrieve(self, ids: Sequence[int]) -> list[Any]:
        return self.client.retrieve(self.name, list(ids), with_payload=True)

    def first_chunk_of_doc(self, doc: int) -> Any | None:
        m = self.m
        points, _ = self.client.scroll(self.name, scroll_filter=m.Filter(must=[
            m.FieldCondition(key="doc", match=m.MatchValue(value=int(doc)))]), limit=1, with_payload=True)
        return points[0] if points else None

    def owners(self, doc_ids: Sequence[str]) -> dict[str, str]:
        """The tenant of each of ``doc_ids`` already in the collection."""
        found = self.retrieve([point_id(i, 0) for i in doc_ids])
        return {p.payload["id"]: p.payload.get("tenant", "") for p in found}

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 -- closing twice, or a server already gone
            pass


# ---------------------------------------------------------------------- the view (the index contract)


class _Payloads:
    """A bounded cache of chunk payloads seen in search results, by chunk and by document number."""

    def __init__(self, engine: QdrantEngine, size: int = PAYLOAD_CACHE) -> None:
        self.engine = engine
        self.size = size
        self._chunks: OrderedDict[int, dict] = OrderedDict()
        self._docs: OrderedDict[int, dict] = OrderedDict()
        self._lock = threading.Lock()

    def see(self, points: Sequence[Any]) -> None:
        with self._lock:
            for p in points:
                self._chunks[int(p.id)] = p.payload
                self._chunks.move_to_end(int(p.id))
                self._docs[int(p.payload["doc"])] = p.payload
                self._docs.move_to_end(int(p.payload["doc"]))
            while len(self._chunks) > self.size:
                self._chunks.popitem(last=False)
            while len(self._docs) > self.size:
                self._docs.popitem(last=False)

    def chunk(self, c: int) -> dict:
        with self._lock:
            hit = self._chunks.get(c)
        if hit is not None:
            return hit
        found = self.engine.retrieve([c])
        if not found:
            raise KeyError(f"chunk {c} is not in collection {self.engine.name!r} (deleted since it was returned)")
        self.see(found)
        return found[0].payload

    def doc(self, d: int) -> dict:
        with self._lock:
            hit = self._docs.get(d)
        if hit is not None:
            return hit
        p = self.engine.first_chunk_of_doc(d)
        if p is None:
            raise KeyError(f"document {d} is not in collection {self.engine.name!r}")
        self.see([p])
        return p.payload


def _document(payload: dict) -> Document:
    return Document(id=payload["id"], text=payload.get("text", ""), title=payload.get("title", ""),
                    tenant=payload.get("tenant", ""), metadata=dict(payload.get("meta") or {}))


class EngineDocuments:
    """``documents[d]`` by document number (the text is that of the chunk the document was hit through)."""

    def __init__(self, view: QdrantView) -> None:
        self._view = view

    def __getitem__(self, d: int) -> Document:
        return _document(self._view.payloads.doc(int(d)))

    def __len__(self) -> int:
        return self._view.engine.documents()


class EngineChunks:
    """``chunk_doc`` on an engine backend: its length (the chunk count) and a chunk's document number, read from
    the chunk's payload (the payload cache, else one engine call); never iterated."""

    def __init__(self, view: QdrantView) -> None:
        self._view = view

    def __len__(self) -> int:
        return self._view.engine.points()

    def __getitem__(self, chunk: int) -> int:
        return int(self._view.payloads.chunk(int(chunk))["doc"])


class _Filters:
    def __init__(self, engine: QdrantEngine) -> None:
        self.engine = engine

    def masks(self, f: Filter):
        """The engine's restriction for ``f`` in the place of the local (document mask, chunk mask)."""
        return None if not f else (self.engine.filter_of(f), None)


def _hits(view: QdrantView, found: list[tuple[Any, float]]) -> Hits:
    view.payloads.see([p for p, _ in found])
    return Hits(np.array([int(p.payload["doc"]) for p, _ in found], dtype=np.int64),
                np.array([s for _, s in found], dtype=np.float32),
                np.array([int(p.id) for p, _ in found], dtype=np.int64))


class _BM25:
    name = "bm25"

    def __init__(self, view: QdrantView, analyzer: Analyzer) -> None:
        self.view = view
        self.analyzer = analyzer

    def search(self, query: str, k: int, doc_mask: Any = None) -> Hits:
        idx, val = sparse_query(self.analyzer(query))
        if not idx:
            return Hits.empty()
        q = self.view.engine.m.SparseVector(indices=idx, values=val)
        return _hits(self.view, [(p, s) for p, s in self.view.engine.grouped(q, "bm25", k, doc_mask) if s > 0.0])


class _Dense:
    name = "dense"

    def __init__(self, view: QdrantView) -> None:
        self.view = view

    def search(self, query_vec: np.ndarray, k: int, doc_mask: Any = None, chunk_mask: Any = None, *,
               exact: bool = False) -> Hits:
        vec = np.asarray(query_vec, dtype=np.float32)
        return _hits(self.view, self.view.engine.grouped(vec, "dense", k, doc_mask, exact=exact))


class _Late:
    def __init__(self, view: QdrantView) -> None:
        self.view = view

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """None: the engine scores MaxSim in place and sends no token vectors back (no cross-encoder windows)."""
        return None

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        if score != "maxsim":
            raise InvalidRequest(f"late-interaction score {score!r} needs per-token similarities; the Qdrant "
                                 "backend computes MaxSim in the engine (rerank.li_score = 'maxsim')")
        head = [int(c) for c in np.asarray(chunks[:top_k], dtype=np.int64)]
        if not head:
            return rerank_head(np.zeros(0, np.float32), len(chunks), weight)
        got = self.view.engine.maxsim(query_tokens, head)
        scores = np.array([got.get(c, 0.0) for c in head], dtype=np.float32)  # no token vectors: MaxSim 0
        return rerank_head(scores, len(chunks), weight)


class QdrantView:
    """The index contract (:class:`retrieval.search.view.IndexView`) over one Qdrant collection.

    Unlike a snapshot it is not frozen: writes land in the engine and the next request sees them. Its
    ``generation`` is the collection's (the snapshot it was made from); cache entries are also keyed by the write
    version (:mod:`retrieval.search.shared_cache`), which every acknowledged write bumps."""

    in_process = False  # its searches are engine calls (network, or the engine's own threads): never solo

    def __init__(self, engine: QdrantEngine, meta: dict[str, Any]) -> None:
        self.engine = engine
        self.meta = meta
        man = meta.get("manifest", {})
        self.snapshot = EngineSnapshot({**man, "created_at": meta.get("migrated_at", ""), "covered_seq": 0,
                                        "generation": meta.get("generation", 0)},
                                       f"qdrant:{engine.config.location}#{engine.name}")
        a = man.get("analyzer", {})
        self.analyzer = Analyzer(AnalyzerConfig(**{k: a[k] for k in ("stemmer", "stopwords", "lowercase") if k in a}))
        self.payloads = _Payloads(engine)
        self.documents = EngineDocuments(self)
        self.chunk_doc = EngineChunks(self)
        self.filters = _Filters(engine)
        self.bm25 = _BM25(self, self.analyzer)
        self.dense = _Dense(self)
        self.token_encoder: dict | None = man.get("models", {}).get("token_encoder")
        self.late = _Late(self) if self.token_encoder else None
        self.generation = int(meta.get("generation", 0))
        self.dense_error: str | None = None
        self.buffered = 0

    @classmethod
    def open(cls, engine: QdrantEngine, expected: Mapping[str, Any]) -> QdrantView:
        """The view over ``engine``'s collection, refusing one made with another model or analyzer."""
        if not engine.exists():
            if engine.config.location == ":memory:":
                raise ConfigError("the in-process Qdrant engine ([backend] location ':memory:') starts empty: give "
                                  "--index SNAPSHOT to migrate into it, or point location at a folder or a server")
            raise ConfigError(f"Qdrant collection {engine.name!r} does not exist at {engine.config.location}; "
                              "make it with 'hybridrag migrate --index SNAPSHOT --config F' (or 'hybridrag build "
                              "--config F')")
        meta = engine.metadata()
        if meta.get("format") != FORMAT:
            raise ConfigError(f"Qdrant collection {engine.name!r} was not made by hybridrag (format "
                              f"{meta.get('format')!r}, expected {FORMAT})")
        check_settings(meta.get("manifest", {}), dict(expected))
        return cls(engine, meta)

    @property
    def backend(self) -> str:
        return self.engine.config.describe()

    def passage(self, chunk: int) -> str:
        return str(self.payloads.chunk(int(chunk)).get("text", ""))

    def passage_with_title(self, chunk: int) -> str:
        p = self.payloads.chunk(int(chunk))
        return chunk_passage(p.get("title", ""), p.get("text", ""))


# ---------------------------------------------------------------------- writes


class EngineWriter:
    """Upsert and Delete on the engine (a :class:`retrieval.serving.core.Writer`), with the same checks and answers
    as the local live index (:class:`retrieval.live.live_index.LiveIndex`): the batch bounds
    (:func:`retrieval.live.store.validate_batch`), one tenant per id, the deadline checked before the encoding and
    again before the engine call. ``version`` numbers the writes (shared through Redis
    when the caches are, so every replica's cache keys move with any replica's write).

    After a crash (kill -9 included; tests/retrieval/engines/test_engine_crash.py): an acknowledged write is in the
    engine. On a local folder qdrant-client commits each point to SQLite (rollback journal, ``synchronous =
    FULL``) before applying it in memory, and its folder lock is a ``flock`` the kernel drops with the process,
    so the folder reopens as it was. A batch cut by the crash is *not* one transaction, on a folder as on a
    server: it is applied in order (its points, then the deletion of a shorter document's extra chunks), so a
    prefix of it survives (docs/deployment.md)."""

    def __init__(self, view: QdrantView, embedder: Embedder, token_encoder: TokenEncoder, chunking: ChunkConfig,
                 version: Callable[[], int] | None = None) -> None:
        self.view = view  # the collection as it is now (what Rebuild reports: the engine has no buffer)
        self.engine = view.engine
        self.embedder = embedder
        self.token_encoder = token_encoder
        self.chunker = Chunker(embedder.files.tokenizer_path, chunking)
        self._counter = itertools.count(1)
        self._version = version
        self._lock = threading.Lock()
        self._write_listeners: list[Callable[[list[str]], object]] = []
        meta = view.meta
        self.avgdl, self.k1, self.b = float(meta.get("avgdl", 0.0)), float(meta.get("k1", 1.5)), float(meta.get("b", 0.75))

    def on_write(self, fn: Callable[[list[str]], object]) -> None:
        """``fn(ids)`` after every acknowledged write (the in-process result cache invalidates)."""
        self._write_listeners.append(fn)

    def rebuild(self) -> None:
        """Nothing to do: the engine keeps its indexes current (Rebuild answers with the collection as it is)."""
        return None

    def list_documents(self, **_: Any) -> NoReturn:
        raise NotImplementedError("the engine backend keeps no document list to page through: ListDocuments needs "
                                  "the local backend's document store (serve --store)")

    def _bump(self) -> int:
        """The write's sequence number: the shared write version when there is one. The write is already in the
        engine here, so a Redis failure does not fail it: it is logged, and caches keep older entries until
        their TTL."""
        if self._version is None:
            return next(self._counter)
        try:
            return self._version()
        except Exception as e:  # noqa: BLE001
            log.error("the write is in the engine, but the shared cache's version could not be moved (%s): cached "
                      "results stay reachable until their TTL", e)
            return 0

    def _written(self, ids: list[str]) -> None:
        for fn in self._write_listeners:
            fn(ids)

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None,
               deadline: float | None = None) -> WriteResult:
        docs = validate_batch(documents, deadline)
        for i, doc in enumerate(docs):
            if tenant is not None and doc.tenant != tenant:
                raise InvalidRequest(f"document {i} ({doc.id!r}): tenant {doc.tenant!r} is not the caller's tenant "
                                     f"{tenant!r}")
        owners = self.engine.owners([d.id for d in docs])
        for i, d in enumerate(docs):
            if d.id in owners and owners[d.id] != d.tenant:
                raise PermissionDenied(f"document {i} ({d.id!r}): this id cannot be written under tenant "
                                       f"{d.tenant!r}")
        points = self._encode(docs)  # the slow part, before the commit check
        m = self.engine.m
        parts = {p.payload["id"]: int(p.payload["parts"]) for p in points}
        stale = m.Filter(should=[m.Filter(must=[m.FieldCondition(key="id", match=m.MatchValue(value=doc_id)),
                                                m.FieldCondition(key="part", range=m.Range(gte=n))])
                                 for doc_id, n in parts.items()])
        with self._lock:
            check_deadline(deadline, "before the commit")
            self.engine.client.batch_update_points(self.engine.name, [
                m.UpsertOperation(upsert=m.PointsList(points=points)),
                m.DeleteOperation(delete=m.FilterSelector(filter=stale))], wait=True)
            seq = self._bump()
        self._written([d.id for d in docs])
        return WriteResult(seq, len(docs))

    def _encode(self, docs: Sequence[Document]) -> list[Any]:
        chunks = self.chunker.chunk(list(docs))
        passages = chunk_passages(docs, chunks)
        same = isinstance(self.token_encoder, EmbedderTokens)
        enc = self.embedder.encode(passages, with_tokens=same)
        tokens = None
        if self.view.late is not None:
            tokens = enc.token_vectors if same else self.token_encoder.encode_documents(passages)
            assert tokens is not None
            te = self.view.token_encoder or {}
            tokens = stored_form(tokens, int(te.get("dim") or enc.embeddings.shape[1]), str(te.get("dtype", "int8")))
        return self.engine.make_points(docs, chunks, enc.embeddings, tokens, self.view.analyzer, self.avgdl,
                                       self.k1, self.b)

    def delete(self, ids: Sequence[str], *, tenant: str | None = None, deadline: float | None = None) -> WriteResult:
        if len(ids) > MAX_BATCH:
            raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
        check_deadline(deadline, "before it started")
        if not ids:
            return WriteResult(0, 0)
        owners = self.engine.owners(list(dict.fromkeys(ids)))
        mine = [i for i, t in owners.items() if tenant is None or t == tenant]
        if not mine:
            return WriteResult(0, 0)
        m = self.engine.m
        with self._lock:
            check_deadline(deadline, "before the commit")
            self.engine.client.delete(self.engine.name, m.FilterSelector(filter=m.Filter(must=[
                m.FieldCondition(key="id", match=m.MatchAny(any=mine))])), wait=True)
            seq = self._bump()
        self._written(mine)
        return WriteResult(seq, len(mine))
