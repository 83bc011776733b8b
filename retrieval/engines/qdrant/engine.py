"""One collection of chunks on one Qdrant (the local engine or a server): its layout, the migration of a built
snapshot into it, and the calls the view and the writer make.

One Qdrant point per chunk (its id: :func:`~retrieval.engines.qdrant.ids.point_id`), with three named vectors and
the chunk's payload:

- ``dense``: the embedder's vector (dot product; the vectors are unit length), HNSW on a server;
- ``bm25``: a sparse vector of the chunk's analysed terms with Qdrant's ``IDF`` modifier: exactly the local BM25
  (:func:`~retrieval.engines.qdrant.ids.sparse_doc` says how);
- ``tokens``: the late-interaction token vectors as a multivector with ``MAX_SIM`` (no HNSW on it: it only
  rescores candidates), so MaxSim over the top 20 runs in the engine and no token vectors cross the network.

Payload: ``doc`` (the document number: 63 bits of BLAKE2b of its id), ``id``, ``part`` / ``parts`` (the chunk's
position in its document), ``title``, ``text`` (the chunk's text), ``tenant``, ``kv`` (each metadata pair as a
JSON ``[key, value]`` string: tenancy by construction, no metadata can name a tenant) and ``meta``.

A migration reuses the snapshot's dense and token vectors (nothing is re-embedded); :meth:`QdrantEngine.upload`
takes any range of its chunks, here or in a Ray task (:mod:`retrieval.engines.qdrant.ray_upload`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import chunk_passages
from index_builder.errors import ConfigError
from index_builder.snapshot.format import LoadedSnapshot
from index_builder.types import Document
from rerank.late_interaction import LateInteractionReranker
from retrieval.engines.qdrant.ids import doc_number, kv_pair, point_id, sparse_doc
from retrieval.engines.settings import EngineConfig
from retrieval.errors import BackendUnavailable
from retrieval.search.filters import Filter

log = logging.getLogger(__name__)

FORMAT = 1  # the collection layout's version, recorded in its metadata (a view refuses another)


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
                       "kv": [kv_pair(k, v) for k, v in sorted(doc.metadata.items())], "meta": dict(doc.metadata)}
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
        analyzer = dict(man["analyzer"])
        bm = man.get("bm25", {})
        avgdl = bm.get("avgdl")
        if avgdl is None:
            terms = Analyzer.from_settings(analyzer).batch(chunk_passages(snap.documents, snap.chunks))
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
        analyzer = Analyzer.from_settings(plan["analyzer"])
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
        must += [m.FieldCondition(key="kv", match=m.MatchValue(value=kv_pair(k, v))) for k, v in f.metadata]
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
