"""Where a search's compute runs: the one thing that differs between a lone request and one among many.

The stages (:mod:`retrieval.search.stages`) are written once, against :class:`Runner`: they ``await`` index work
(``call``), start work to overlap with later steps (``start`` / ``spawn``, awaited later or ``discard``-ed), and
call the models (``embed_query``, ``encode_query_tokens``, ``score_pairs``). Two runners:

- :class:`PoolRunner`, the batched path: the search runs on the pipeline's event loop, index work (BM25, faiss,
  MaxSim) in the worker pool, model calls through the cross-request micro-batchers, so concurrent requests share
  ONNX runs and BM25 overlaps the query embedding.
- :class:`ThreadRunner`, a solo search (``first_stage.solo_when_idle``: no other search in flight): every step on
  the calling thread, in sequence, the models called directly (no batcher to wait in, no pool round trips). Its
  coroutines never suspend, so :meth:`ThreadRunner.run` drives a whole search to its end in one step (a stage that
  waited on a loop would be a bug, and is reported as one). Measured on SciFact: the default path at 1.13-1.18x its
  compute floor at one caller against 1.52x batched (docs/results/interactive-cascade.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Protocol, TypeVar

import numpy as np

from retrieval.search.model_calls import ModelCalls

T = TypeVar("T")


class Runner(Protocol):
    """How a search runs its work (see the module docstring)."""

    async def call(self, fn: Callable[..., T], *args: Any, beside: Awaitable[Any] | None = None) -> T:
        """``fn(*args)``: index work (BM25, faiss, MaxSim). ``beside``: work :meth:`start` returned, to run at the
        same time as ``fn`` where the runner has not begun it yet (a solo search's BM25 beside its dense search)."""

    def start(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """``fn(*args)`` begun now where the runner can overlap it with what follows; await it for the result."""

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``coro`` begun now where the runner can overlap it; await it for the result."""

    def discard(self, pending: Awaitable[Any]) -> None:
        """Give up on what :meth:`start` or :meth:`spawn` returned (its result is not needed)."""

    async def embed_query(self, query: str) -> tuple[np.ndarray, np.ndarray | None, float]:
        """The query's embedding, its embedder token vectors (None with a separate token encoder), queue wait ms."""

    async def encode_query_tokens(self, query: str) -> tuple[np.ndarray, float]:
        """The separate token encoder's query vectors (a ColBERT model) and the queue wait in ms."""

    async def score_pairs(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """The cross-encoder's logit of each (query, passage), float32."""


class PoolRunner:
    """The batched path: on the pipeline's loop, index work in ``executor``, models through ``models``' batchers."""

    def __init__(self, executor: Executor, models: ModelCalls) -> None:
        self.executor, self.models = executor, models

    async def call(self, fn: Callable[..., T], *args: Any, beside: Awaitable[Any] | None = None) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)  # beside: running

    def start(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return self.spawn(self.call(fn, *args))

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return asyncio.ensure_future(coro)

    def discard(self, pending: Awaitable[Any]) -> None:
        if isinstance(pending, asyncio.Future):
            pending.cancel()

    async def embed_query(self, query: str) -> tuple[np.ndarray, np.ndarray | None, float]:
        return await self.models.embed_query(query)

    async def encode_query_tokens(self, query: str) -> tuple[np.ndarray, float]:
        return await self.models.encode_query_tokens(query)

    async def score_pairs(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return await self.models.score_pairs(query, passages)


class Later:
    """Work a :class:`ThreadRunner` was asked to start: it runs when awaited, on the awaiting thread, unless
    :meth:`begin` handed it to another thread first (then awaiting it waits for that thread's result)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.future: Future[Any] | None = None

    def begin(self, executor: Executor) -> None:
        if self.future is None:
            self.future = executor.submit(self.fn, *self.args)

    async def _result(self) -> Any:
        return self.future.result() if self.future is not None else self.fn(*self.args)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result().__await__()


class ThreadRunner:
    """A solo search: everything on the calling thread, in sequence, models called directly. ``cancelled``: set
    when the caller goes away; the model calls stop before their next batch.

    ``beside``: a thread (one, kept by the pipeline) for the one overlap that pays when a search runs alone: work
    started early (BM25) runs there while this thread runs the index call it was passed ``beside`` (the dense
    search: faiss holds no lock and one core), not beside the query embedding (ONNX already uses both cores).
    Measured in one process: BM25 + dense at 1M passages 3.3 -> 1.8 ms, at 10k 0.47 -> 0.36 ms; served, -0.4 ms at 1M
    and +0.3 ms at 10k (with the embedder's threads still spinning after its run; since they stop, 10k with it
    from 0 chunks was within the noise), so the pipeline passes ``beside`` from ``first_stage.solo_beside_from``
    chunks."""

    def __init__(self, models: ModelCalls, beside: Executor | None = None) -> None:
        self.models = models
        self.cancelled = threading.Event()
        self.beside = beside

    async def call(self, fn: Callable[..., T], *args: Any, beside: Awaitable[Any] | None = None) -> T:
        if beside is not None and self.beside is not None and isinstance(beside, Later):
            beside.begin(self.beside)
        return fn(*args)

    def start(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return Later(fn, args)  # runs when awaited, or beside a later call

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return coro

    def discard(self, pending: Awaitable[Any]) -> None:
        if isinstance(pending, Coroutine):
            pending.close()  # never started: nothing was computed
        # a Later never begun computes nothing; one begun finishes on its thread, its result unread

    async def embed_query(self, query: str) -> tuple[np.ndarray, np.ndarray | None, float]:
        return await self.models.embed_query(query, direct=self.cancelled)

    async def encode_query_tokens(self, query: str) -> tuple[np.ndarray, float]:
        assert self.models.token_encoder is not None
        return self.models.token_encoder.encode_queries([query])[0], 0.0

    async def score_pairs(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return await self.models.score_pairs(query, passages, direct=self.cancelled)

    @staticmethod
    def run(coro: Coroutine[Any, Any, T]) -> T:
        """Drive ``coro`` (a search on this runner) to its end: one step, since nothing in it waits on a loop."""
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise RuntimeError("a search on a ThreadRunner waited on an event loop: a step is not solo-safe")
