"""The gRPC service: ``hybridrag.v1.Retriever`` on ``grpc.aio``, with health, reflection, admission control,
deadlines, API keys and TLS.

The event loop only parses, checks and answers: every search runs in the pipeline (its own loop thread, a bounded
worker pool for BM25/faiss/MaxSim, model calls through the cross-request batchers), awaited here. Errors are
mapped to status codes in one place (:func:`status_for`). ``create_server`` builds a started server without
blocking (tests run one on port 0); ``serve`` loads everything, serves until SIGTERM/SIGINT, then drains.

Every RPC goes through :meth:`RetrieverService._rpc`: a server span (``hybridrag.<Method>``, with the request id;
the pipeline's stage spans hang under it) and the request metrics by status code (:mod:`retrieval.serving.metrics`,
``/metrics`` on its own HTTP port).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Tracer

from index_builder.corpus import MAX_ID_CHARS, check_tenant
from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from retrieval.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    DeadlineExceeded,
    IndexNotReady,
    InvalidRequest,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
)
from retrieval.generation.generator import GeneratorSetup, Passages, Stats, Token
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import MAX_BATCH, MAX_BATCH_BYTES
from retrieval.observability.tracing import NO_TRACER, set_error
from retrieval.search.filters import Filter
from retrieval.search.pipeline import Pipeline, SearchResult
from retrieval.search.request import SearchRequest
from retrieval.serving.auth import ALL_TENANTS, API_KEY_HEADER, load_api_keys, parse_api_keys  # noqa: F401
from retrieval.serving.metrics import MetricsConfig, ServiceMetrics

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Retriever"].full_name


_STATUS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (IndexNotReady, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (BackendTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (BackendUnavailable, grpc.StatusCode.UNAVAILABLE),
    (BackendError, grpc.StatusCode.FAILED_PRECONDITION),  # the backend refused the request (4xx): config or model
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
)


@dataclass(frozen=True)
class ServerConfig:
    """``max_in_flight``: requests served at once; more are refused with RESOURCE_EXHAUSTED (no queue).
    ``api_keys_file``: JSON ``{"key": ["tenant", ...]}`` (``"*"`` = every tenant); empty = no authentication.
    Keys live outside the repository (a file path from config or ``HYBRIDRAG_SERVER__API_KEYS_FILE``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_in_flight: int = 64
    # Writes (Upsert, Delete, Rebuild) have their own budget: each write encodes its documents (model CPU), so
    # a flood of them would otherwise take the cores from queries; past it writes get RESOURCE_EXHAUSTED.
    max_writes_in_flight: int = 2
    grace_s: float = 10.0
    tls_cert: str = ""
    tls_key: str = ""
    api_keys_file: str = ""
    max_message_mb: int = 16
    # How often a thread holding the GIL hands it over (sys.setswitchinterval, process-wide; 0 = Python's 5 ms).
    # The gRPC event loop is I/O work competing for the GIL with the pipeline's compute threads; at 5 ms each of
    # its callbacks can wait 5 ms per busy thread, so past saturation calls queue before admission control sees
    # them. 0.5 ms kept refusals fast and admitted latency bounded (bench.load open loop, README: Results).
    switch_interval_ms: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or self.max_in_flight < 1 or self.max_writes_in_flight < 1 or self.grace_s < 0:
            raise ValueError("server needs 0 <= port <= 65535, max_in_flight >= 1, max_writes_in_flight >= 1 and "
                             "grace_s >= 0")
        if not 0 <= self.switch_interval_ms <= 100:
            raise ValueError(f"server.switch_interval_ms must be in [0, 100], got {self.switch_interval_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key go together")


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The one mapping from our errors to gRPC status codes; anything else is a bug: INTERNAL."""
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message, request_id and timings when the record has them)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for key in ("request_id", "timings_ms"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


@dataclass
class ServiceState:
    """What the service serves; ``pipeline`` is None until the index and models are loaded; ``live`` (writes) is
    None without a document store."""

    pipeline: Pipeline | None = None
    api_keys: dict[str, frozenset[str]] = field(default_factory=dict)
    in_flight: int = 0
    writes_in_flight: int = 0
    live: LiveIndex | None = None
    generation: GeneratorSetup | None = None
    generation_error: str = "generation is not set up on this server"
    tracer: Tracer = NO_TRACER
    metrics: ServiceMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServiceMetrics(lambda: {"in_flight": self.in_flight, "pipeline": self.pipeline})
        if self.pipeline is not None:
            self.metrics.watch_batchers(self.pipeline)

    def attach(self, pipeline: Pipeline, live: LiveIndex | None = None) -> None:
        """Serve ``pipeline`` (and accept writes through ``live``), with its batches and rebuilds in the metrics."""
        self.metrics.watch_batchers(pipeline)
        if live is not None:
            live.on_rebuild(self.metrics.observe_rebuild)
            self.live = live
        self.pipeline = pipeline


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


def to_response(pipeline: Pipeline, result: SearchResult, request_id: str) -> pb.RetrieveResponse:
    index = result.index  # the generation that served the request (a swap may have happened since)
    passages = []
    docs = result.hits.doc.tolist()
    ranks = _stage_ranks(result, docs)
    for d, s, c in zip(docs, result.hits.scores.tolist(), result.hits.chunk.tolist(), strict=True):
        doc = index.documents[d]
        passages.append(pb.Passage(doc_id=doc.id, chunk_id=int(c), title=doc.title, text=index.passage(int(c)),
                                   score=float(s), stages=ranks[d], tenant=doc.tenant,
                                   metadata={k: str(v) for k, v in doc.metadata.items()}))
    return pb.RetrieveResponse(
        passages=passages, timings_ms={k: float(v) for k, v in result.timings_ms.items()},
        stages_run=[s for s in result.stages if s != "fused"],
        skipped=[pb.SkippedStage(stage=k, reason=v) for k, v in result.skipped.items()],
        degraded=result.degraded, index_generation=result.generation, request_id=request_id,
        cache_hit=result.cache_hit, cache_similarity=result.cache_similarity)


MAX_DETAILS_BYTES = 1000


def _details(message: str) -> str:
    """The status message, cut to 1,000 bytes of UTF-8: gRPC percent-encodes non-ASCII details (up to 3x) and a
    client refuses trailing metadata over 8-16 KiB, so a message quoting a huge bad value would otherwise arrive as
    RESOURCE_EXHAUSTED ("metadata size exceeds hard limit") instead of its own code.

    >>> len(_details("x" * 5000).encode()), _details("ok")
    (1003, 'ok')
    """
    raw = message.encode("utf-8")
    if len(raw) <= MAX_DETAILS_BYTES:
        return message
    return raw[:MAX_DETAILS_BYTES].decode("utf-8", errors="ignore") + "..."


class Undecodable:
    """Stands in for a request whose bytes do not parse (the handler answers INVALID_ARGUMENT with one short log
    line; grpc's own path logs a traceback and answers UNKNOWN)."""

    def __init__(self, message_type: str, size: int, error: Exception) -> None:
        self.message_type, self.size, self.error = message_type, size, error


def _lenient(message_cls):
    def deserialize(data: bytes):
        try:
            return message_cls.FromString(data)
        except Exception as e:  # noqa: BLE001  (DecodeError, invalid UTF-8 in a string field, ...)
            return Undecodable(message_cls.DESCRIPTOR.name, len(data), e)
    return deserialize


def add_service(servicer: RetrieverService, server: grpc.aio.Server) -> None:
    """Register the Retriever methods with deserializers that never raise (see :class:`Undecodable`); otherwise
    what ``retriever_pb2_grpc.add_RetrieverServicer_to_server`` does."""
    handlers = {}
    for name, method in pb.DESCRIPTOR.services_by_name["Retriever"].methods_by_name.items():
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[name] = make(getattr(servicer, name), request_deserializer=_lenient(request_cls),
                              response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _decoded(request, request_id: str):
    if isinstance(request, Undecodable):
        log.info("request %s: undecodable %s (%d bytes): %s", request_id, request.message_type, request.size,
                 str(request.error)[:120], extra={"request_id": request_id})
        raise InvalidRequest(f"the request is not a valid {request.message_type} message ({request.size} bytes)")
    return request


class RetrieverService(pb_grpc.RetrieverServicer):
    """Thin handlers: each checks its request and calls into the pipeline / live index; errors become status
    codes in one place (:meth:`_fail`, :func:`status_for`)."""

    def __init__(self, state: ServiceState, config: ServerConfig) -> None:
        self.state = state
        self.config = config

    # ------------------------------------------------------------------ checks

    def _authenticate(self, context: grpc.aio.ServicerContext) -> frozenset[str] | None:
        """The caller's tenants (None when no API keys are configured: everyone may read everything)."""
        keys = self.state.api_keys
        if not keys:
            return None
        meta = dict(context.invocation_metadata() or ())
        key = meta.get(API_KEY_HEADER, "")
        if not key and meta.get("authorization", "").lower().startswith("bearer "):
            key = meta["authorization"][7:]
        if not key:
            raise Unauthenticated(f"an API key is required (metadata '{API_KEY_HEADER}')")
        tenants = keys.get(key)
        if tenants is None:
            raise Unauthenticated("unknown API key")
        return tenants

    def _authorize(self, context: grpc.aio.ServicerContext, tenant: str) -> None:
        tenants = self._authenticate(context)
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

    def _pipeline(self) -> Pipeline:
        if self.state.pipeline is None:
            raise IndexNotReady("the index is not loaded yet")
        return self.state.pipeline

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException, request_id: str) -> None:
        code = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("request %s failed", request_id, exc_info=exc, extra={"request_id": request_id})
            await context.abort(code, f"internal error (request id {request_id})")
        await context.abort(code, _details(str(exc)))

    @contextlib.contextmanager
    def _rpc(self, method: str, request_id: str, **attributes: str | int):
        """The call's server span (current, so the pipeline's spans nest under it) and its metrics: duration and
        status code. The handler's exceptions pass through (``_fail`` maps them outside)."""
        t0 = time.perf_counter()
        code = "OK"
        with self.state.tracer.start_as_current_span(
                f"hybridrag.{method}", kind=SpanKind.SERVER, record_exception=False, set_status_on_exception=False,
                attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
                            "hybridrag.request_id": request_id, **attributes}) as span:
            try:
                yield span
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            except BaseException as e:
                code = status_for(e).name
                set_error(span, e)
                raise
            finally:
                span.set_attribute("rpc.grpc.status_code", getattr(grpc.StatusCode, code).value[0])
                self.state.metrics.observe_rpc(method, code, time.perf_counter() - t0)

    async def _unary(self, method: str, request, context: grpc.aio.ServicerContext, body):
        """One wrapper for every unary handler: request id, decoding check, span and metrics, cancellation log,
        and the one error-to-status mapping. ``body(request, request_id)`` does the call's own work."""
        request_id = uuid.uuid4().hex[:16]
        context.set_trailing_metadata((("x-request-id", request_id),))
        t0 = time.perf_counter()
        try:
            with self._rpc(method, request_id):
                return await body(_decoded(request, request_id), request_id)
        except asyncio.CancelledError:
            log.info("%s %s cancelled by the client after %.1f ms", method, request_id,
                     (time.perf_counter() - t0) * 1000, extra={"request_id": request_id})
            raise
        except Exception as e:  # noqa: BLE001  (mapped to a status code in one place)
            await self._fail(context, e, request_id)
            raise  # unreachable: abort raises

    @contextlib.contextmanager
    def _admitted(self, context: grpc.aio.ServicerContext, kind: str = "read"):
        """Admission control and an in-flight slot for the call; yields its deadline (absolute monotonic seconds,
        or None). Reads and writes have their own budgets (``max_in_flight``, ``max_writes_in_flight``), so a
        write flood cannot starve reads, nor the other way round."""
        attr, limit = ("in_flight", self.config.max_in_flight) if kind == "read" else (
            "writes_in_flight", self.config.max_writes_in_flight)
        now = getattr(self.state, attr)
        if now >= limit:
            raise Overloaded(f"overloaded: {now} {'requests' if kind == 'read' else 'writes'} in flight (max {limit})")
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded("the call's deadline passed before it started")
        setattr(self.state, attr, now + 1)
        try:
            yield None if remaining is None else time.monotonic() + remaining
        finally:
            setattr(self.state, attr, getattr(self.state, attr) - 1)

    def _search_request(self, request: pb.RetrieveRequest, pipeline: Pipeline, deadline: float | None,
                        default_k: int = 10) -> SearchRequest:
        """The typed, validated request of a RetrieveRequest (0 = default for every number)."""
        opts = request.options
        for name in ("candidates", "li_top_k", "ce_top_k"):
            if getattr(opts, name) < 0:
                raise InvalidRequest(f"options.{name} must be >= 1 (0 = default), got {getattr(opts, name)}")
        if request.top_k < 0:
            raise InvalidRequest(f"top_k must be in [1, {pipeline.config.first_stage.max_k}] (0 = default), "
                                 f"got {request.top_k}")
        return pipeline.resolve(SearchRequest(
            request.query, request.top_k or default_k, Filter.of(request.tenant, dict(request.filters)),
            candidates=opts.candidates or None, stages=tuple(opts.stages) or None, li_top_k=opts.li_top_k or None,
            ce_top_k=opts.ce_top_k or None, deadline=deadline, use_cache=not request.bypass_cache))

    # ------------------------------------------------------------------ RPCs

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        async def body(request: pb.RetrieveRequest, request_id: str) -> pb.RetrieveResponse:
            with self._admitted(context) as deadline:
                self._authorize(context, request.tenant)
                pipeline = self._pipeline()
                result = await pipeline.search_async(self._search_request(request, pipeline, deadline))
            self.state.metrics.observe_search(result)
            response = to_response(pipeline, result, request_id)
            log.debug("request %s: %d passages, timings %s", request_id, len(response.passages), result.timings_ms,
                      extra={"request_id": request_id, "timings_ms": result.timings_ms})
            return response
        return await self._unary("Retrieve", request, context, body)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        """Stream: the passages, the answer's tokens, the stats. A failure after the passages ends the stream with
        the error's status; what was sent stays valid. Cancellation closes the backend stream at once."""
        request_id = uuid.uuid4().hex[:16]
        context.set_trailing_metadata((("x-request-id", request_id),))
        t0 = time.perf_counter()
        try:
            with self._rpc("Generate", request_id) as rpc_span:
                request = _decoded(request, request_id)
                with self._admitted(context) as deadline:
                    r = request.retrieve
                    self._authorize(context, r.tenant)
                    pipeline = self._pipeline()
                    setup = self.state.generation
                    search = self._search_request(r, pipeline, deadline,
                                                  default_k=setup.generator.config.passages if setup else 10)
                    if setup is None:
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
                                yield pb.GenerateResponse(passages=to_response(pipeline, event.result, request_id))
                                llm_span = self.state.tracer.start_span(
                                    "hybridrag.llm", context=otel_context.get_current())
                            elif isinstance(event, Stats):
                                yield pb.GenerateResponse(stats=self._stats(event))
                                self._generated(event, llm_span, rpc_span)
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
        except asyncio.CancelledError:
            log.info("generate %s cancelled by the client after %.1f ms", request_id, (time.perf_counter() - t0) * 1000,
                     extra={"request_id": request_id})
            raise
        except Exception as e:  # noqa: BLE001
            await self._fail(context, e, request_id)

    @staticmethod
    def _stats(event: Stats) -> pb.GenerateStats:
        return pb.GenerateStats(
            retrieval_ms=event.retrieval_ms, time_to_first_token_ms=event.time_to_first_token_ms,
            generation_ms=event.generation_ms, tokens_in=event.tokens_in, tokens_out=event.tokens_out,
            model=event.model, cache_hit=event.cache_hit, route=event.route,
            passages_in_prompt=event.passages_in_prompt, context_truncated=event.context_truncated,
            finish_reason=event.finish_reason)

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

    async def GetIndexStatus(self, request: pb.GetIndexStatusRequest, context: grpc.aio.ServicerContext) -> pb.IndexStatus:
        async def body(request: pb.GetIndexStatusRequest, request_id: str) -> pb.IndexStatus:
            self._authenticate(context)  # status is not tenant data: any valid key may read it
            pipeline = self._pipeline()
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
                backend=str(getattr(index, "backend", "local snapshot")))
        return await self._unary("GetIndexStatus", request, context, body)

    def _live(self) -> LiveIndex:
        self._pipeline()
        if self.state.live is None:
            raise NotImplementedError("this server has no document store: start it with --store PATH to accept writes")
        return self.state.live

    async def _write(self, context: grpc.aio.ServicerContext, fn, *args, **kwargs):
        """A write under the write budget, with the caller's deadline passed down to the durable commit (a write
        whose deadline passed before the commit is not applied)."""
        with self._admitted(context, "write") as deadline:
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: fn(*args, deadline=deadline, **kwargs))

    async def Upsert(self, request: pb.UpsertRequest, context: grpc.aio.ServicerContext) -> pb.UpsertResponse:
        async def body(request: pb.UpsertRequest, request_id: str) -> pb.UpsertResponse:
            self._authenticate(context)  # UNAUTHENTICATED before anything about the request
            live = self._live()
            n = len(request.documents)
            if n > MAX_BATCH:  # before any work: nothing is chunked or encoded for a refused batch
                raise InvalidRequest(f"{n} documents in one upsert; at most {MAX_BATCH} are allowed")
            if (size := request.ByteSize()) > MAX_BATCH_BYTES:
                raise InvalidRequest(f"the upsert is {size} bytes; at most {MAX_BATCH_BYTES} are allowed")
            for i, d in enumerate(request.documents):
                self._authorize(context, d.tenant)
                if not d.id:
                    raise InvalidRequest(f"document {i}: 'id' must be a non-empty string")
            docs = [{"_id": d.id, "title": d.title, "text": d.text, "tenant": d.tenant, "metadata": dict(d.metadata)}
                    for d in request.documents]
            result = await self._write(context, live.upsert, docs)
            log.info("request %s: upserted %d documents (seq %d)", request_id, result.count, result.seq,
                     extra={"request_id": request_id})
            return pb.UpsertResponse(sequence=result.seq, upserted=result.count)
        return await self._unary("Upsert", request, context, body)

    async def Rebuild(self, request: pb.RebuildRequest, context: grpc.aio.ServicerContext) -> pb.RebuildResponse:
        async def body(request: pb.RebuildRequest, request_id: str) -> pb.RebuildResponse:
            tenants = self._authenticate(context)
            if tenants is not None and ALL_TENANTS not in tenants:
                raise PermissionDenied("rebuilding the index needs a key for all tenants ('*')")
            live = self._live()
            t = time.perf_counter()
            with self._admitted(context, "write"):
                await asyncio.get_running_loop().run_in_executor(None, live.rebuild)
            view = live.view
            return pb.RebuildResponse(generation=view.generation,
                                      covered_sequence=int(view.snapshot.manifest.get("covered_seq", 0)),
                                      seconds=time.perf_counter() - t, still_buffered=view.buffered)
        return await self._unary("Rebuild", request, context, body)

    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        async def body(request: pb.DeleteRequest, request_id: str) -> pb.DeleteResponse:
            self._authorize(context, request.tenant)
            live = self._live()
            ids = list(request.ids)
            if len(ids) > MAX_BATCH:
                raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
            for i, doc_id in enumerate(ids):
                if len(doc_id) > MAX_ID_CHARS:
                    raise InvalidRequest(f"id {i} is {len(doc_id)} characters; at most {MAX_ID_CHARS} are allowed")
            result = await self._write(context, live.delete, ids, tenant=request.tenant or None)
            return pb.DeleteResponse(sequence=result.seq, deleted=result.count)
        return await self._unary("Delete", request, context, body)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    state: ServiceState

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self.health.set(name, status)

    @property
    def metrics_port(self) -> int | None:
        """The port of ``/metrics`` (None when the HTTP endpoint is off)."""
        return self.state.metrics.port

    async def stop(self, grace_s: float) -> None:
        """Health NOT_SERVING, refuse new calls, let in-flight ones finish within ``grace_s``; then ``/metrics``
        closes."""
        await self.set_serving(False)
        await self.server.stop(grace_s)
        self.state.metrics.close()


async def create_server(config: ServerConfig, pipeline: Pipeline | None = None,
                        api_keys: Mapping[str, frozenset[str]] | None = None,
                        generation: GeneratorSetup | None = None, *, metrics: MetricsConfig | None = None,
                        tracer: Tracer = NO_TRACER) -> RunningServer:
    """Build and start a server (port 0 picks a free one). Health is NOT_SERVING until a pipeline is set and
    :meth:`RunningServer.set_serving` is called (``serve`` does both once the index and models are loaded).
    ``metrics``: where to serve ``/metrics`` (None: metrics are kept, not served); ``tracer``: the server spans'
    (the pipeline has its own, normally the same)."""
    limit = config.max_message_mb * 2**20
    server = grpc.aio.server(options=[("grpc.max_send_message_length", limit),
                                      ("grpc.max_receive_message_length", limit),
                                      ("grpc.so_reuseport", 0)])
    state = ServiceState(pipeline=pipeline, api_keys=dict(api_keys or load_api_keys(config.api_keys_file)),
                         generation=generation, tracer=tracer)
    add_service(RetrieverService(state, config), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    if config.tls_cert:
        creds = grpc.ssl_server_credentials([(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise ConfigError(f"cannot listen on {address}")
    await server.start()
    if metrics is not None:
        try:
            state.metrics.start_http(metrics)
        except OSError as e:
            await server.stop(0)
            raise ConfigError(f"cannot serve metrics on {metrics.host}:{metrics.port}: {e}") from e
    running = RunningServer(server, port, health_servicer, state)
    await running.set_serving(False)
    return running


class BackgroundServer:
    """A started server on its own event-loop thread, for blocking callers (tests, benchmarks, a service embedded
    in a synchronous program). ``target`` is its ``host:port``."""

    def __init__(self, pipeline: Pipeline | None, config: ServerConfig,
                 api_keys: Mapping[str, frozenset[str]] | None = None, generation: GeneratorSetup | None = None, *,
                 metrics: MetricsConfig | None = None, tracer: Tracer = NO_TRACER) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hybridrag-server", daemon=True)
        self.thread.start()
        self.running: RunningServer = self.run(create_server(config, pipeline, api_keys, generation, metrics=metrics,
                                                             tracer=tracer))
        self.run(self.running.set_serving(True))
        self.target = f"{config.host}:{self.running.port}"

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def stop(self, grace: float = 5.0) -> None:
        self.run(self.running.stop(grace))
        if self.running.state.generation is not None:
            self.run(self.running.state.generation.generator.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
