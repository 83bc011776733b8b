"""Generate: retrieve, assemble the prompt, stream the answer from the routed backend.

Events, in order: :class:`Passages` (the retrieval result, so a client can show sources before the first token),
:class:`Token` deltas as the backend produces them, then :class:`Stats` (retrieval ms, time to first token,
generation ms, tokens in and out, the model that answered). A finished answer is kept in the semantic cache
(scoped by the retrieval options and the generation settings, valid for the index generation that retrieved its
passages, invalidated when a write touches one of them); a cache hit streams the cached answer at once.

Backends: the configured OpenAI-compatible server (vLLM, llama.cpp), or the embedded llama.cpp server
(:mod:`retrieval.generation.embedded`) when no URL is configured. With routing on, short and simple questions go to the
``small`` backend and the rest to ``large`` (:func:`retrieval.generation.backend.route`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import math
import time
import typing
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from index_builder.errors import ConfigError
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.generation.backend import BackendConfig, ChatBackend, GenerationConfig, route
from retrieval.generation.embedded import EmbeddedLLMServer, llama_server_available
from retrieval.generation.prompt import ContextPassage, HeuristicCounter, TokenCounter, build_prompt, make_counter
from retrieval.search.cache_check import InvalidEntry, check_result, expect
from retrieval.search.pipeline import Pipeline, ResultCache
from retrieval.search.request import SearchRequest
from retrieval.search.results import SearchResult
from retrieval.search.shared_cache import register_codec, result_from_dict, result_to_dict
from retrieval.search.view import IndexView

log = logging.getLogger(__name__)


@dataclass
class Passages:
    result: SearchResult


@dataclass
class Token:
    text: str


@dataclass
class Stats:
    retrieval_ms: float
    time_to_first_token_ms: float
    generation_ms: float
    tokens_in: int
    tokens_out: int
    model: str
    route: str
    cache_hit: bool = False
    passages_in_prompt: int = 0
    context_truncated: bool = False
    finish_reason: str = ""


@dataclass
class _CachedAnswer:
    result: SearchResult
    text: str
    stats: Stats


def _answer_to_dict(a: _CachedAnswer) -> dict:
    return {"result": result_to_dict(a.result), "text": a.text, "stats": dataclasses.asdict(a.stats)}


_STATS_TYPES = typing.get_type_hints(Stats)


def _answer_from_dict(o: Any) -> _CachedAnswer:
    """The answer :func:`_answer_to_dict` wrote, every type checked (:class:`InvalidEntry` otherwise: whoever can
    write to Redis can write anything)."""
    expect(type(o) is dict and {"result", "text", "stats"} <= set(o), "an answer is not {result, text, stats}")
    expect(type(o["text"]) is str and bool(o["text"].strip()), "an answer's text is not a non-empty string")
    stats = o["stats"]
    expect(type(stats) is dict and set(stats) <= set(_STATS_TYPES), "an answer's stats are not an object of its fields")
    for f in dataclasses.fields(Stats):
        if f.name not in stats:
            expect(f.default is not dataclasses.MISSING, f"an answer's stats have no {f.name!r}")
            continue
        v, t = stats[f.name], _STATS_TYPES[f.name]
        ok = (type(v) in (int, float) and math.isfinite(v) and v >= 0) if t is float else (
            type(v) is int and v >= 0) if t is int else type(v) is t
        expect(ok, f"an answer's {f.name!r} is not a {t.__name__}")
    return _CachedAnswer(result_from_dict(o["result"]), o["text"], Stats(**stats))


def _check_answer(value: Any, index: IndexView, request: SearchRequest) -> None:
    """What a cached answer read from outside the process (the shared cache) must be to answer ``request`` on
    ``index``: an answer whose passages that index could have given this request (:func:`check_result`)."""
    if not isinstance(value, _CachedAnswer):
        raise InvalidEntry(f"a {type(value).__name__}, not an answer")
    assert request.resolved
    check_result(value.result, index, request.filter, request.k)


class Generator:
    """Owns the backends (one, or small + large when routing is on) and streams answers for the gRPC layer.

    ``ready``: awaited before the first call (the embedded server starting); raising :class:`BackendUnavailable`
    there fails Generate with UNAVAILABLE after the passages were sent.
    """

    def __init__(self, pipeline: Pipeline, config: GenerationConfig, backends: dict[str, ChatBackend],
                 counter: TokenCounter, cache: ResultCache | None = None,
                 ready: Callable[[], Awaitable[None]] | None = None) -> None:
        if config.routing.enabled and set(backends) != {"small", "large"}:
            raise ValueError("routing needs a 'small' and a 'large' backend")
        self.pipeline = pipeline
        self.config = config
        self.backends = backends
        self.counter = counter
        self.cache = cache if config.cache_answers else None
        if self.cache is not None and self.cache.shared:  # a shared (Redis) cache keeps answers as JSON too
            register_codec("answer", _CachedAnswer, _answer_to_dict, _answer_from_dict)
        self._ready = ready
        self._prompt_id = hashlib.sha256(config.system_prompt.encode()).hexdigest()[:12]

    async def aclose(self) -> None:
        for b in self.backends.values():
            await b.aclose()

    def route_for(self, question: str) -> str:
        return route(question, self.config.routing) if self.config.routing.enabled else "default"

    def check_max_tokens(self, requested: int) -> int:
        if requested == 0:
            return self.config.max_tokens
        if not 1 <= requested <= self.config.max_tokens_limit:
            raise InvalidRequest(f"max_tokens must be in [1, {self.config.max_tokens_limit}] (0 = "
                                 f"{self.config.max_tokens}), got {requested}")
        return requested

    async def generate(self, request: SearchRequest | str, *, max_tokens: int = 0,
                       **options: Any) -> AsyncGenerator[Passages | Token | Stats, None]:
        """Retrieve with ``request`` (its ``k`` 0 = the configured number of passages; a plain question takes the
        request's fields as keywords), then stream the answer (see the module docstring)."""
        max_tokens = self.check_max_tokens(max_tokens)
        request = self._resolve(request, options)
        question, deadline = request.query, request.deadline
        t0 = time.perf_counter()
        epoch = self.cache.epoch() if self.cache is not None and request.use_cache else 0
        result = await self.pipeline.search_async(request)
        retrieval_ms = (time.perf_counter() - t0) * 1000.0
        which = self.route_for(question)
        backend = self.backends[which]
        scope = None
        # The answer cache is read when the retrieval could be cached: it ran the dense side (it has the query's
        # vector), or it came from the cache. An exact repeat is looked up by its text first: a retrieval answered
        # by the shared cache's exact lookup has no vector (that lookup is made before anything is embedded), and
        # the exact key is one GET where the semantic lookup is a stream read and a matrix product.
        serving = self.pipeline.index  # the serving generation, for checking what a shared cache reads
        if (self.cache is not None and request.use_cache and not result.degraded
                and (result.query_vec is not None or result.cache_hit) and serving.generation == result.generation):
            scope = ("generate", request.filter, request.k, request.stages, request.candidates, request.li_top_k,
                     request.ce_top_k, request.exact_dense, which, backend.model, max_tokens, self.config.temperature,
                     self.config.stop, self._prompt_id)
            check = functools.partial(_check_answer, index=serving, request=request)
            hit = self.cache.lookup_exact(scope, result.generation, question, epoch=epoch, check=check)
            if hit is None and result.query_vec is not None:
                hit = self.cache.lookup(scope, result.generation, result.query_vec, question, epoch=epoch,
                                        check=check)
            if hit is not None:
                cached: _CachedAnswer = hit.value  # its passages are the ones the answer was generated from
                yield Passages(dataclasses.replace(cached.result, cache_hit=True, cache_similarity=hit.similarity,
                                                   timings_ms=result.timings_ms))
                yield Token(cached.text)
                s = cached.stats
                yield Stats(retrieval_ms, 0.0, 0.0, s.tokens_in, s.tokens_out, s.model, s.route, cache_hit=True,
                            passages_in_prompt=s.passages_in_prompt, context_truncated=s.context_truncated,
                            finish_reason=s.finish_reason)
                return
        yield Passages(result)

        index = result.index
        passages = [ContextPassage(index.documents[d].id, index.documents[d].title, index.passage(int(c)))
                    for d, c in zip(result.hits.doc.tolist(), result.hits.chunk.tolist(), strict=True)]
        prompt = build_prompt(question, passages, counter=self.counter, budget_tokens=self.config.context_tokens,
                              system_prompt=self.config.system_prompt,
                              max_question_tokens=self.config.max_question_tokens)
        if self._ready is not None:
            await self._wait_ready(deadline)
        t_gen = time.perf_counter()
        ttft = 0.0
        parts: list[str] = []
        last = None
        async for event in backend.stream(prompt.messages, max_tokens=max_tokens, temperature=self.config.temperature,
                                          stop=self.config.stop, deadline=deadline):
            if event.text:
                if not parts:
                    ttft = (time.perf_counter() - t_gen) * 1000.0
                parts.append(event.text)
                yield Token(event.text)
            else:
                last = event
        generation_ms = (time.perf_counter() - t_gen) * 1000.0
        text = "".join(parts)
        tokens_in = last.prompt_tokens if last and last.prompt_tokens else self._estimate_prompt_tokens(prompt.messages)
        tokens_out = last.completion_tokens if last and last.completion_tokens else len(parts)
        stats = Stats(retrieval_ms, ttft, generation_ms, tokens_in, tokens_out, backend.model, which,
                      passages_in_prompt=prompt.passages_used, context_truncated=prompt.truncated,
                      finish_reason=(last.finish_reason if last else None) or "")
        if scope is not None and text.strip():
            await self._keep_answer(scope, request, result, text, stats, epoch)
        yield stats

    def _resolve(self, request: SearchRequest | str, options: dict[str, Any]) -> SearchRequest:
        """The request to retrieve with (a plain question takes ``options`` as its fields; ``k`` 0 = the configured
        number of passages), resolved by the pipeline."""
        if isinstance(request, str):
            request = SearchRequest.of(request, options.pop("k", 0), **options)
        elif options:
            raise TypeError("pass either a SearchRequest or a question with options, not both")
        return self.pipeline.resolve(dataclasses.replace(request, k=request.k or self.config.passages))

    async def _keep_answer(self, scope: tuple, request: SearchRequest, result: SearchResult, text: str, stats: Stats,
                           epoch: int) -> None:
        """Put a finished answer in the cache under the question's vector (embedded now when the retrieval was an
        exact hit of the shared cache, which has none); a failure only leaves it out of the cache."""
        assert self.cache is not None
        question, vector = request.query, result.query_vec
        if vector is None:  # the retrieval was an exact hit of the shared cache: the entry needs the vector
            try:
                vector = (await self.pipeline.embed_texts_async([question]))[0]
            except Exception:  # noqa: BLE001 -- the answer is streamed; it is only not cached
                log.exception("embedding the question to cache its answer failed")
        if vector is not None:
            keep = result.detached()  # not the view: a cached answer must not pin the write buffer it was read from
            self.cache.put(scope, result.generation, vector, question, _CachedAnswer(keep, text, stats),
                           result.doc_ids(), since=epoch, nbytes=keep.approx_bytes() + len(text) + request.filter.nbytes)

    def _estimate_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(self.counter.count(m["content"]) for m in messages)

    async def _wait_ready(self, deadline: float | None) -> None:
        assert self._ready is not None
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(self._ready())), timeout)
        except TimeoutError:
            raise DeadlineExceeded("the call's deadline passed while the generation backend was starting") from None


class _EmbeddedStarter:
    """Starts the embedded server off the event loop; later calls await the same start, and a dead server is
    started again on the next call."""

    def __init__(self, server: EmbeddedLLMServer) -> None:
        self.server = server
        self._future: asyncio.Future[str] | None = None

    def kick(self) -> None:
        """Begin starting now (serve calls this at start-up so the first Generate does not wait)."""
        if self.server.ready():
            return
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().run_in_executor(None, self.server.start)

    async def ready(self) -> None:
        self.kick()
        if self._future is not None and not self.server.ready():
            await asyncio.shield(self._future)


@dataclass
class GeneratorSetup:
    generator: Generator
    embedded: EmbeddedLLMServer | None
    starter: _EmbeddedStarter | None

    def describe(self) -> str:
        return ", ".join(f"{name}: {b.label} model {b.model!r}" for name, b in self.generator.backends.items())

    async def aclose(self) -> None:
        await self.generator.aclose()
        if self.embedded is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.embedded.stop)


def open_generator(pipeline: Pipeline, config: GenerationConfig, cache: ResultCache | None = None) -> GeneratorSetup:
    """The configured backends; a backend without a URL is the embedded llama.cpp server (one for all such
    backends), which is created here but started by :meth:`_EmbeddedStarter.kick` / on the first call."""
    embedded: EmbeddedLLMServer | None = None

    def backend(b: BackendConfig, name: str) -> ChatBackend:
        nonlocal embedded
        if b.base_url:
            return ChatBackend(b, label=f"{name} ({b.base_url})")
        if not config.embedded.enabled:
            raise ConfigError(f"generation backend {name!r} has no base_url and the embedded generator is off")
        if embedded is None:
            embedded = EmbeddedLLMServer(config.embedded)
        return ChatBackend(b, base_url=embedded.base_url, model=b.model or config.embedded.alias,
                           label=f"embedded llama.cpp ({embedded.base_url})")

    r = config.routing
    backends = {"small": backend(r.small, "small"), "large": backend(r.large, "large")} if r.enabled else {
        "default": backend(config.backend, "default")}
    if config.tokenizer:
        counter: TokenCounter = make_counter(config.tokenizer)
    elif embedded is not None and llama_server_available():
        counter = make_counter(embedded.model_path)
    else:
        counter = HeuristicCounter()
    starter = _EmbeddedStarter(embedded) if embedded is not None else None
    generator = Generator(pipeline, config, backends, counter, cache, ready=starter.ready if starter else None)
    return GeneratorSetup(generator, embedded, starter)
