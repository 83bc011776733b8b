"""The service core that both front doors call: gRPC (:mod:`retrieval.serving.grpc_service`) and HTTP
(:mod:`retrieval.serving.http`). Its answers are built by :mod:`retrieval.serving.answers`.

A door turns its request into a :class:`Caller` (the API key it carried and its deadline) and a proto message,
then calls one method here; every check lives here once: authentication, tenant authorization, admission control
(separate read and write budgets), deadlines, the pipeline and the writer, the span and the metrics of the
call. The door only translates: its wire format in, proto messages out, our errors (:mod:`retrieval.errors`) to
its own status codes through :func:`~retrieval.serving.status.status_for` (the gRPC code; HTTP maps that code to an
HTTP status).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import numpy as np
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind, Tracer

from index_builder.documents.corpus import MAX_ID_CHARS, check_tenant
from index_builder.types import Document
from retrieval.api import retriever_pb2 as pb
from retrieval.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    IndexNotReady,
    InvalidRequest,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
)
from retrieval.generation.generator import GeneratorSetup, Passages, Stats, Token
from retrieval.live.store import MAX_BATCH, MAX_BATCH_BYTES, DocumentPage, WriteResult
from retrieval.observability.tracing import NO_TRACER, set_error
from retrieval.search.filters import Filter
from retrieval.search.pipeline import Pipeline
from retrieval.search.request import SearchRequest, check_length
from retrieval.serving.answers import (
    MAX_ANSWER_BYTES,
    MAX_MESSAGE_BYTES_DEFAULT,
    document_info,
    stats_message,
    to_response,
    unwire,
    wire,
)
from retrieval.serving.auth import ALL_TENANTS, API_KEY_HEADER
from retrieval.serving.metrics import ServiceMetrics
from retrieval.serving.status import status_for

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Retriever"].full_name

class CallerGone(Exception):
    """The caller went away (an HTTP client disconnected): its work was cancelled, nobody reads the answer."""


@dataclass(frozen=True)
class Caller:
    """Who is calling and until when: what both doors read off their own transport (gRPC metadata and
    ``time_remaining``; HTTP headers) before calling the core. ``deadline``: absolute ``time.monotonic()``
    seconds, None = no deadline."""

    api_key: str = ""
    deadline: float | None = None
    transport: str = "grpc"

    @staticmethod
    def key_from(headers: Mapping[str, str]) -> str:
        """The API key of ``x-api-key``, else of ``authorization: Bearer KEY`` (lower-case names, as gRPC metadata
        and Starlette's headers both give them)."""
        key = headers.get(API_KEY_HEADER, "")
        auth = headers.get("authorization", "")
        if not key and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        return key

    @classmethod
    def of(cls, headers: Mapping[str, str], timeout_s: float | None, transport: str) -> Caller:
        return cls(cls.key_from(headers), None if timeout_s is None else time.monotonic() + timeout_s, transport)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


class WrittenView(Protocol):
    """What Rebuild reports of a writer's current view: its generation, the snapshot it is built on (its manifest's
    ``covered_seq``) and the writes buffered since."""

    @property
    def generation(self) -> int: ...

    @property
    def snapshot(self) -> Any: ...

    @property
    def buffered(self) -> int: ...


class Writer(Protocol):
    """Where the core sends writes: the live index over the document store
    (:class:`retrieval.live.live_index.LiveIndex`: buffered, rebuilt in the background) or the engine
    (:class:`retrieval.engines.qdrant.EngineWriter`: indexed online). Both check a batch the same way
    (:func:`retrieval.live.store.validate_batch`) and answer the same :class:`~retrieval.live.store.WriteResult`.
    ``rebuild``: build a new generation now (the engine has nothing to rebuild); ``view``: what Rebuild reports."""

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None,
               deadline: float | None = None) -> WriteResult: ...

    def delete(self, ids: Sequence[str], *, tenant: str | None = None, deadline: float | None = None) -> WriteResult: ...

    def rebuild(self) -> object: ...

    def list_documents(self, *, tenant: str | None = None, filters: Mapping[str, str] | None = None,
                       after: str = "", limit: int = MAX_BATCH) -> DocumentPage: ...

    @property
    def view(self) -> WrittenView: ...


@dataclass
class ServiceState:
    """What the service serves; ``pipeline`` is None until the index and models are loaded; ``writer`` (where
    writes go) is None on a read-only server. Filled by :mod:`retrieval.serving.server`."""

    pipeline: Pipeline | None = None
    api_keys: dict[str, frozenset[str]] = field(default_factory=dict)
    in_flight: int = 0
    writes_in_flight: int = 0
    writer: Writer | None = None
    generation: GeneratorSetup | None = None
    generation_error: str = "generation is not set up on this server"
    tracer: Tracer = NO_TRACER
    serving: bool = False  # health: SERVING once the index and models are loaded (both doors' readiness)
    metrics: ServiceMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServiceMetrics(lambda: {"in_flight": self.in_flight, "pipeline": self.pipeline})


MAX_EMBED_INPUTS = 256  # texts in one embeddings call (each bounded like a query)


class ServiceCore:
    """The calls of the service on proto messages, for any door. Each method checks the caller first
    (UNAUTHENTICATED before anything about the request), then the request, then does the work under the
    caller's admission slot and deadline."""

    def __init__(self, state: ServiceState, max_in_flight: int, max_writes_in_flight: int,
                 max_message_bytes: int = MAX_MESSAGE_BYTES_DEFAULT) -> None:
        self.state = state
        self.max_in_flight = max_in_flight
        self.max_writes_in_flight = max_writes_in_flight
        self.max_answer_bytes = min(max_message_bytes, MAX_ANSWER_BYTES)  # both doors' answers (fit_response)

    # ------------------------------------------------------------------ checks

    def authenticate(self, caller: Caller) -> frozenset[str] | None:
        """The caller's tenants (None when no API keys are configured: everyone may read everything)."""
        keys = self.state.api_keys
        if not keys:
            return None
        if not caller.api_key:
            raise Unauthenticated(f"an API key is required ('{API_KEY_HEADER}' or 'authorization: Bearer KEY')")
        tenants = keys.get(caller.api_key)
        if tenants is None:
            raise Unauthenticated("unknown API key")
        return tenants

    def authorize(self, caller: Caller, tenant: str) -> None:
        tenants = self.authenticate(caller)
        try:
            check_tenant(tenant)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        if tenants is None or ALL_TENANTS in tenants:
            return
        if not tenant:
            raise PermissionDenied(f"this key is bound to tenants {sorted(tenants)}: name one in 'tenant'")
        if tenant not in tenants:
            raise PermissionDenied(f"this key may not access tenant {tenant!r}")

    def pipeline(self) -> Pipeline:
        if self.state.pipeline is None:
            raise IndexNotReady("the index is not loaded yet")
        return self.state.pipeline

    def writer(self) -> Writer:
        self.pipeline()
        if self.state.writer is None:
            raise NotImplementedError("this server has no document store: start it with --store PATH to accept writes")
        return self.state.writer

    @contextlib.contextmanager
    def admitted(self, caller: Caller, kind: str = "read"):
        """Admission control and an in-flight slot for the call; yields its deadline (absolute monotonic seconds,
        or None). Reads and writes have their own budgets (``max_in_flight``, ``max_writes_in_flight``), so a
        write flood cannot starve reads, nor the other way round. Both doors share the slots."""
        attr, limit = ("in_flight", self.max_in_flight) if kind == "read" else (
            "writes_in_flight", self.max_writes_in_flight)
        now = getattr(self.state, attr)
        if now >= limit:
            raise Overloaded(f"overloaded: {now} {'requests' if kind == 'read' else 'writes'} in flight (max {limit})")
        remaining = caller.remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded("the call's deadline passed before it started")
        setattr(self.state, attr, now + 1)
        try:
            yield caller.deadline
        finally:
            setattr(self.state, attr, getattr(self.state, attr) - 1)

    def search_request(self, request: pb.RetrieveRequest, pipeline: Pipeline, deadline: float | None,
                       default_k: int = 10) -> SearchRequest:
        """The typed request of a RetrieveRequest (0 = default for every number), checked for what only the proto
        form can get wrong (a negative number); whoever runs it resolves it, once (:meth:`Pipeline.resolve`: the
        configured defaults and every bound)."""
        opts = request.options
        for name in ("candidates", "li_top_k", "ce_top_k"):
            if getattr(opts, name) < 0:
                raise InvalidRequest(f"options.{name} must be >= 1 (0 = default), got {getattr(opts, name)}")
        if request.top_k < 0:
            raise InvalidRequest(f"top_k must be in [1, {pipeline.config.first_stage.max_k}] (0 = default), "
                                 f"got {request.top_k}")
        return SearchRequest(
            request.query, request.top_k or default_k, Filter.of(request.tenant, dict(request.filters)),
            candidates=opts.candidates or None, stages=tuple(opts.stages) or None, li_top_k=opts.li_top_k or None,
            ce_top_k=opts.ce_top_k or None, deadline=deadline, use_cache=not request.bypass_cache,
            highlights=request.highlights)

    # ------------------------------------------------------------------ span and metrics

    @contextlib.contextmanager
    def call(self, method: str, request_id: str, transport: str = "grpc", **attributes: str | int):
        """The call's server span (current, so the pipeline's spans nest under it) and its metrics: duration and
        status code, by door. The handler's exceptions pass through (each door maps them)."""
        t0 = time.perf_counter()
        code = "OK"
        with self.state.tracer.start_as_current_span(
                f"hybridrag.{method}", kind=SpanKind.SERVER, record_exception=False, set_status_on_exception=False,
                attributes={"rpc.system": transport, "rpc.service": SERVICE, "rpc.method": method,
                            "hybridrag.request_id": request_id, **attributes}) as span:
            try:
                yield span
            except (asyncio.CancelledError, GeneratorExit, CallerGone):
                code = "CANCELLED"
                raise
            except BaseException as e:
                code = status_for(e).name
                set_error(span, e)
                raise
            finally:
                span.set_attribute("rpc.grpc.status_code", getattr(grpc.StatusCode, code).value[0])
                self.state.metrics.observe_rpc(method, code, time.perf_counter() - t0, transport)

    # ------------------------------------------------------------------ calls

    async def retrieve(self, caller: Caller, request: pb.RetrieveRequest, request_id: str) -> pb.RetrieveResponse:
        with self.admitted(caller) as deadline:
            self.authorize(caller, request.tenant)
            pipeline = self.pipeline()
            result = await pipeline.search_async(self.search_request(request, pipeline, deadline))
        if deadline is not None and time.monotonic() >= deadline:
            # the caller has given up by now: say so rather than send an answer it will not read (its own timer
            # may fire late on busy cores, and a late OK would then look like a met deadline)
            raise DeadlineExceeded("the call's deadline passed while it ran (its answer was dropped)")
        self.state.metrics.observe_search(result)
        response = to_response(result, request_id, self.max_answer_bytes)
        log.debug("request %s: %d passages, timings %s", request_id, len(response.passages), result.timings_ms,
                  extra={"request_id": request_id, "timings_ms": result.timings_ms})
        return response

    async def generate(self, caller: Caller, request: pb.GenerateRequest, request_id: str,
                       span: Span) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The answer's events as proto messages: the passages, the tokens, the stats. Holds a read slot for the
        whole stream; closing the iterator (cancellation, a client gone) closes the backend stream at once."""
        t0 = time.perf_counter()
        with self.admitted(caller) as deadline:
            r = request.retrieve
            self.authorize(caller, r.tenant)
            pipeline = self.pipeline()
            setup = self.state.generation
            search = self.search_request(r, pipeline, deadline,
                                         default_k=setup.generator.config.passages if setup else 10)
            if setup is None:
                pipeline.resolve(search)  # a bad request is still a 400 where no generator is set up
                raise BackendUnavailable(self.state.generation_error)
            generator = setup.generator
            if request.max_tokens < 0:
                raise InvalidRequest(f"max_tokens must be in [1, {generator.config.max_tokens_limit}] "
                                     f"(0 = default), got {request.max_tokens}")
            events = generator.generate(search, max_tokens=request.max_tokens)
            llm_span = None
            try:
                async for event in events:
                    if isinstance(event, Token):
                        yield pb.GenerateResponse(token=event.text)
                    elif isinstance(event, Passages):
                        self.state.metrics.observe_search(event.result)
                        yield pb.GenerateResponse(passages=to_response(event.result, request_id,
                                                                               self.max_answer_bytes))
                        llm_span = self.state.tracer.start_span("hybridrag.llm", context=otel_context.get_current())
                    elif isinstance(event, Stats):
                        yield pb.GenerateResponse(stats=stats_message(event))
                        self._generated(event, llm_span, span)
                        if llm_span is not None:
                            llm_span.end()
                            llm_span = None
                        log.info("request %s: answered by %s (%s) in %.0f ms, %d tokens out%s", request_id,
                                 event.model, event.route, (time.perf_counter() - t0) * 1000, event.tokens_out,
                                 " (cache hit)" if event.cache_hit else "", extra={"request_id": request_id})
            except BaseException as e:
                if llm_span is not None:
                    set_error(llm_span, e)
                raise
            finally:
                if llm_span is not None:
                    llm_span.end()
                await events.aclose()  # closes the backend's HTTP stream now, also on cancellation

    def _generated(self, event: Stats, llm_span, rpc_span) -> None:
        """Metrics and span attributes of a finished answer (a cached answer generated nothing: no LLM figures)."""
        rpc_span.set_attribute("hybridrag.cache_hit", event.cache_hit)
        if llm_span is not None:
            llm_span.set_attributes({"gen_ai.request.model": event.model, "hybridrag.route": event.route,
                                     "gen_ai.usage.input_tokens": event.tokens_in,
                                     "gen_ai.usage.output_tokens": event.tokens_out,
                                     "hybridrag.time_to_first_token_ms": event.time_to_first_token_ms,
                                     "hybridrag.cache_hit": event.cache_hit, "hybridrag.finish_reason": event.finish_reason})
        if not event.cache_hit:
            self.state.metrics.observe_generation(event.time_to_first_token_ms / 1000.0, event.tokens_in,
                                                  event.tokens_out)

    def status(self, caller: Caller) -> pb.IndexStatus:
        self.authenticate(caller)  # status is not tenant data: any valid key may read it
        pipeline = self.pipeline()
        index = pipeline.index
        models = {"embedder": str(pipeline.embedder.model_id),
                  "token_encoder": str(pipeline.token_encoder.describe().get("name")),
                  "cross_encoder": pipeline.cross_encoder.files.name if pipeline.cross_encoder else ""}
        return pb.IndexStatus(
            generation=index.generation, documents=len(index.documents), chunks=len(index.chunk_doc),
            buffered_writes=index.buffered,
            last_rebuild=str(index.snapshot.manifest.get("created_at", "")), models=models,
            dense_available=index.dense is not None, dense_error=index.dense_error or "",
            late_interaction_available=pipeline.late_interaction_unavailable(index) is None,
            snapshot_path=str(index.snapshot.path),
            cache={k: float(v) for k, v in (pipeline.cache.stats() if pipeline.cache else {}).items()},
            generation_backend=self.state.generation.describe() if self.state.generation else
            self.state.generation_error,
            backend=index.backend)

    async def _write(self, caller: Caller, fn, *args, **kwargs):
        """A write under the write budget, with the caller's deadline passed down to the durable commit (a write
        whose deadline passed before the commit is not applied)."""
        with self.admitted(caller, "write") as deadline:
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: fn(*args, deadline=deadline, **kwargs))

    async def upsert(self, caller: Caller, request: pb.UpsertRequest, request_id: str) -> pb.UpsertResponse:
        self.authenticate(caller)  # UNAUTHENTICATED before anything about the request
        writer = self.writer()
        n = len(request.documents)
        if n > MAX_BATCH:  # before any work: nothing is chunked or encoded for a refused batch
            raise InvalidRequest(f"{n} documents in one upsert; at most {MAX_BATCH} are allowed")
        if (size := request.ByteSize()) > MAX_BATCH_BYTES:
            raise InvalidRequest(f"the upsert is {size} bytes; at most {MAX_BATCH_BYTES} are allowed")
        for i, d in enumerate(request.documents):
            self.authorize(caller, d.tenant)
            if not d.id:
                raise InvalidRequest(f"document {i}: 'id' must be a non-empty string")
        docs = [{"_id": d.id, "title": d.title, "text": d.text, "tenant": d.tenant, "metadata": dict(d.metadata)}
                for d in request.documents]
        result = await self._write(caller, writer.upsert, docs)
        log.info("request %s: upserted %d documents (seq %d)", request_id, result.count, result.seq,
                 extra={"request_id": request_id})
        return pb.UpsertResponse(sequence=result.seq, upserted=result.count)

    async def delete(self, caller: Caller, request: pb.DeleteRequest) -> pb.DeleteResponse:
        self.authorize(caller, request.tenant)
        writer = self.writer()
        ids = list(request.ids)
        if len(ids) > MAX_BATCH:
            raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
        for i, doc_id in enumerate(ids):
            if len(doc_id) > MAX_ID_CHARS:
                raise InvalidRequest(f"id {i} is {len(doc_id)} characters; at most {MAX_ID_CHARS} are allowed")
        result = await self._write(caller, writer.delete, ids, tenant=request.tenant or None)
        return pb.DeleteResponse(sequence=result.seq, deleted=result.count)

    async def list_documents(self, caller: Caller, request: pb.ListDocumentsRequest) -> pb.ListDocumentsResponse:
        """A page of the store's documents without their text; a key bound to tenants lists only the one it names.
        The filters obey Retrieve's limits (:meth:`Filter.of`: count, key and value rules); a filtered page examines
        a bounded number of rows, so it may hold fewer than ``limit`` documents, even none, with ``next_after`` set
        (:meth:`retrieval.live.store.DocumentStore.list_page`)."""
        self.authorize(caller, request.tenant)
        writer = self.writer()
        limit = request.limit or MAX_BATCH
        if not 0 < limit <= MAX_BATCH:
            raise InvalidRequest(f"'limit' must be in [1, {MAX_BATCH}] (0 = {MAX_BATCH}), got {request.limit}")
        after = unwire(request.after[:8 * MAX_ID_CHARS])
        if len(after) > MAX_ID_CHARS:
            raise InvalidRequest(f"'after' is {len(request.after)} characters; ids are at most {MAX_ID_CHARS}")
        filters = dict(Filter.of(request.tenant, dict(request.filters)).metadata)
        with self.admitted(caller, "read"):
            page = await asyncio.get_running_loop().run_in_executor(None, lambda: writer.list_documents(
                tenant=request.tenant or None, filters=filters, after=after, limit=limit))
        return pb.ListDocumentsResponse(documents=[document_info(*row) for row in page.rows],
                                        next_after=wire(page.next_after))

    async def rebuild(self, caller: Caller) -> pb.RebuildResponse:
        tenants = self.authenticate(caller)
        if tenants is not None and ALL_TENANTS not in tenants:
            raise PermissionDenied("rebuilding the index needs a key for all tenants ('*')")
        writer = self.writer()
        t = time.perf_counter()
        with self.admitted(caller, "write"):
            await asyncio.get_running_loop().run_in_executor(None, writer.rebuild)
        view = writer.view
        return pb.RebuildResponse(generation=view.generation,
                                  covered_sequence=int(view.snapshot.manifest.get("covered_seq", 0)),
                                  seconds=time.perf_counter() - t, still_buffered=view.buffered)

    # ------------------------------------------------------------------ model calls (HTTP extras)

    async def embed(self, caller: Caller, texts: list[str]) -> np.ndarray:
        """The configured embedder's vectors of ``texts`` (normalised, float32, ``(len(texts), dim)``), under a read
        slot: any valid key may embed (nothing tenant-owned is read)."""
        self.authenticate(caller)
        if not texts or len(texts) > MAX_EMBED_INPUTS:
            raise InvalidRequest(f"'input' must hold 1 to {MAX_EMBED_INPUTS} texts, got {len(texts)}")
        for i, t in enumerate(texts):
            if not t.strip():
                raise InvalidRequest(f"input {i} is empty")
        with self.admitted(caller):
            pipeline = self.pipeline()
            limit = pipeline.config.first_stage.max_query_chars
            for i, t in enumerate(texts):
                check_length(t, limit, f"input {i}")
            return await pipeline.embed_texts_async(texts)

    async def rerank(self, caller: Caller, query: str, texts: list[str], stage: str) -> tuple[str, np.ndarray]:
        """Scores of ``texts`` for ``query`` by one reranking stage (``late_interaction``, ``cross_encoder``, or
        "" = the cascade's last configured one), under a read slot."""
        self.authenticate(caller)
        if not query.strip():
            raise InvalidRequest("query is empty")
        if not texts or len(texts) > MAX_EMBED_INPUTS:
            raise InvalidRequest(f"'documents' must hold 1 to {MAX_EMBED_INPUTS} texts, got {len(texts)}")
        with self.admitted(caller):
            pipeline = self.pipeline()
            limit = pipeline.config.first_stage.max_query_chars
            check_length(query, limit)
            for i, t in enumerate(texts):
                check_length(t, limit, f"document {i}")
            return await pipeline.rerank_texts_async(query, texts, stage)
