"""Cross-request dynamic batching for model calls (query embedding, token encoding, cross-encoder scoring).

Why: an ONNX encoder call has a large fixed cost (session dispatch, thread wake-up, kernel launches on a GPU), so
one call over 16 queries costs far less than 16 calls over one. Under concurrent load, each request submits its
items here; a single collector task gathers items from *different* requests into one batch and runs the blocking
batch function once, the way TEI's and Triton's dynamic batchers do.

The policy, and why each part is there:

* **Nothing added at one caller.** When no batch of this model is running (the model is idle), whatever is queued is
  dispatched at once: a lone caller never waits out a window (``idle_dispatch``; it once waited 2 ms per model
  call, issue 26). Only items that queue *behind a running batch* are gathered, and they go out when that batch
  ends or their window does, whichever is first.
* **Bounded added latency.** The first waiting item opens a window of ``max_wait_ms``, measured from when *that
  item* was submitted; the batch closes when the window ends or ``max_batch_size`` items are in. Measuring from the
  submit time (not from when the collector looked) means an item that already waited for a free execution slot is
  not made to wait again: under load, batches go out at once and grow by themselves.
* **Collection overlaps execution.** Up to ``max_concurrent_batches`` batches run in the executor at once, so the
  next batch is being gathered while the previous one computes. The collector takes an execution slot *before*
  it collects, so when every slot is busy items stay in the queue and join the next (larger) batch instead of
  being frozen into a small one that merely waits.
* **A request's items stay together.** :meth:`MicroBatcher.submit_many` (e.g. a query's cross-encoder pairs) is
  queued as one group; a group that does not fit in the current batch closes it and opens the next one (FIFO is
  kept: nothing jumps ahead of it). Only a group larger than ``max_batch_size`` is split.
* **Failures stay local.** If the batch function raises, exactly the callers of that batch get the exception; if
  it returns the wrong number of results they get a :class:`RuntimeError` saying so. Later batches are unaffected.
* **Cancellation saves work.** An item whose caller was cancelled before its batch started is dropped from the
  batch (never computed); a cancellation after the start just discards that item's result.
* **Never on the event loop.** The batch function runs in the given executor via ``loop.run_in_executor``.

With ``enabled=False`` every :meth:`~MicroBatcher.submit` calls ``fn([item])`` directly in the executor: the
unbatched baseline for the benchmark, with the same interface and statistics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from retrieval.search.settings import BatcherConfig  # noqa: F401  (its section lives with the search settings)

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

CLOSED_MESSAGE = "batcher closed"





@dataclass
class BatcherStats:
    """Running statistics, updated on the event loop, and by solo searches from their thread (one lock).

    ``batch_sizes`` and ``queue_wait_ms`` keep the most recent values only, so memory stays bounded on a
    long-running server; the counters cover the batcher's whole life.
    """

    batches: int = 0  # calls of the batch function
    items: int = 0  # items computed (dropped ones excluded)
    errors: int = 0  # batches whose function raised or returned the wrong number of results
    dropped: int = 0  # items cancelled before their batch started, never computed
    direct: int = 0  # of ``batches``: calls a solo search made on its own thread, not through the queue
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1024))
    queue_wait_ms: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    # called after every batch with (size, queue waits in ms, failed): the Prometheus histograms
    observers: list[Callable[[int, Sequence[float], bool], None]] = field(default_factory=list)

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, size: int, waits_ms: Sequence[float], failed: bool, direct: bool = False) -> None:
        """One call of the model: ``size`` items, their queue waits; ``direct``: made by a solo search (no queue,
        waits of 0), counted like a batch so that the model's call and item counts stay whole."""
        for observe in self.observers:
            observe(size, waits_ms, failed)
        with self._lock:
            self.batches += 1
            self.direct += int(direct)
            self.items += size
            self.errors += int(failed)
            self.batch_sizes.append(size)
            self.queue_wait_ms.extend(waits_ms)

    def snapshot(self) -> dict[str, float | int]:
        """Counters plus mean batch size and p50/p95 queue wait (ms) over the recent window; 0.0 when empty."""
        with self._lock:  # a solo search may be appending from its thread
            sizes = np.array(self.batch_sizes, dtype=np.float64)
            waits = np.array(self.queue_wait_ms, dtype=np.float64)
        p50, p95 = (float(v) for v in np.percentile(waits, [50, 95])) if len(waits) else (0.0, 0.0)
        return {
            "batches": self.batches,
            "items": self.items,
            "errors": self.errors,
            "dropped": self.dropped,
            "direct": self.direct,
            "mean_batch_size": float(sizes.mean()) if len(sizes) else 0.0,
            "queue_wait_p50_ms": p50,
            "queue_wait_p95_ms": p95,
        }


class _Entry(Generic[T, R]):
    """One queued item: its caller's future, its submit time and, once started, its queue wait."""

    __slots__ = ("item", "future", "submitted", "wait_ms")

    def __init__(self, item: T, future: asyncio.Future[R]) -> None:
        self.item = item
        self.future = future
        self.submitted = time.perf_counter()
        self.wait_ms = 0.0


def _closed_error() -> RuntimeError:
    return RuntimeError(CLOSED_MESSAGE)


def _fail(entries: Sequence[_Entry[Any, Any]], make_error: Callable[[], BaseException]) -> None:
    """Fail every entry whose caller still waits; ``make_error`` is called per caller, so ours are not shared."""
    for entry in entries:
        if not entry.future.done():
            entry.future.set_exception(make_error())


class MicroBatcher(Generic[T, R]):
    """Gathers items from concurrent requests into batches for one blocking batch function.

    ``fn`` takes a list of items and returns one result per item, in order (e.g. ``embedder.embed`` returning one
    row per text; row ``i`` of a numpy array is handed to the caller of item ``i``). ``executor`` is where ``fn``
    runs (the service's bounded pool); ``name`` labels the batcher in logs and metrics.

    The collector task starts on the running event loop at the first submit (or :meth:`start`); the batcher then
    belongs to that loop. Call :meth:`close` to stop it.
    """

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], config: BatcherConfig | None = None, *,
                 executor: Executor, name: str = "batcher") -> None:
        self.fn = fn
        self.config = config or BatcherConfig()
        self.executor = executor
        self.name = name
        self.stats = BatcherStats()
        self._queue: deque[list[_Entry[T, R]]] = deque()  # groups of entries, FIFO
        self._queued_items = 0
        self._collecting: list[_Entry[T, R]] = []  # taken from the queue, batch not yet started
        self._inflight: set[asyncio.Task[None]] = set()  # batches computing now (the model is idle when empty)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collector: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._closed = False
        self._max_wait_s = self.config.max_wait_ms / 1000.0

    # ------------------------------------------------------------------ public API

    @property
    def queue_depth(self) -> int:
        """Items waiting for a batch (queued or being collected): the gauge for metrics and admission control."""
        return self._queued_items + len(self._collecting)

    @property
    def closed(self) -> bool:
        return self._closed

    def snapshot(self) -> dict[str, Any]:
        """Statistics for logs, metrics and the benchmark: the name, queue depth and :meth:`BatcherStats.snapshot`."""
        return {"name": self.name, "enabled": self.config.enabled, "queue_depth": self.queue_depth,
                **self.stats.snapshot()}

    def start(self) -> None:
        """Start the collector on the running event loop (optional: the first submit does it)."""
        self._ensure_started(asyncio.get_running_loop())

    async def submit(self, item: T) -> R:
        """Compute one item, batched with whatever other requests submit at about the same time."""
        result, _ = await self.submit_timed(item)
        return result

    async def submit_timed(self, item: T) -> tuple[R, float]:
        """Like :meth:`submit`, also returning the item's queue wait in ms (submit until its batch started)."""
        if not self.config.enabled:
            started = time.perf_counter()
            results, wait_ms = await self._run_direct([item], started)
            return results[0], wait_ms
        (entry,) = self._enqueue([item])
        return await entry.future, entry.wait_ms

    async def submit_many(self, items: list[T]) -> list[R]:
        """Compute several items of one request, kept in one batch when they fit (``max_batch_size``).

        If any item fails, the request's other items are cancelled (not computed if their batch has not started)
        and the first error is raised.
        """
        if not items:
            return []
        if not self.config.enabled:
            # The baseline: the request batches its own items (as the code did before cross-request batching),
            # in chunks of max_batch_size so fn sees the same batch bound either way.
            out: list[R] = []
            bs = self.config.max_batch_size
            for start in range(0, len(items), bs):
                results, _ = await self._run_direct(items[start:start + bs], time.perf_counter())
                out.extend(results)
            return out
        entries = self._enqueue(list(items))
        futures = [e.future for e in entries]
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    async def close(self) -> None:
        """Stop collecting: queued callers get ``RuntimeError("batcher closed")``; running batches finish.

        Running batches are awaited rather than abandoned because their executor threads cannot be interrupted
        anyway, and their callers may as well get the results. Later submits raise at once. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        collector, self._collector = self._collector, None
        if collector is not None and not collector.done():
            collector.cancel()
            try:
                await collector
            except asyncio.CancelledError:
                pass
        _fail(self._collecting, _closed_error)
        self._collecting = []
        while self._queue:
            _fail(self._queue.popleft(), _closed_error)
        self._queued_items = 0
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    # ------------------------------------------------------------------ queueing

    def _ensure_started(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed:
            raise _closed_error()
        if self._loop is loop and self._collector is not None:
            return
        if self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(f"batcher {self.name!r} is bound to another running event loop")
            # The previous loop ended (e.g. one asyncio.run per test or CLI call): its tasks and futures died
            # with it, so start afresh on this one.
            self._queue.clear()
            self._queued_items = 0
            self._collecting = []
            self._inflight = set()
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self.config.max_concurrent_batches)
        self._collector = loop.create_task(self._collect_forever(), name=f"batcher-{self.name}")

    def _enqueue(self, items: list[T]) -> list[_Entry[T, R]]:
        loop = asyncio.get_running_loop()
        self._ensure_started(loop)
        entries: list[_Entry[T, R]] = [_Entry(item, loop.create_future()) for item in items]
        self._queue.append(entries)
        self._queued_items += len(entries)
        assert self._wakeup is not None
        self._wakeup.set()
        return entries

    # ------------------------------------------------------------------ collector

    async def _collect_forever(self) -> None:
        """Take an execution slot, collect a batch, launch it; repeat until cancelled by :meth:`close`."""
        assert self._slots is not None and self._loop is not None
        try:
            while True:
                await self._slots.acquire()
                try:
                    batch = await self._collect()
                except BaseException:
                    self._slots.release()
                    raise
                live = [e for e in batch if not e.future.done()]
                self.stats.dropped += len(batch) - len(live)
                self._collecting = []
                if not live:
                    self._slots.release()
                    continue
                task = self._loop.create_task(self._run_batch(live), name=f"batcher-{self.name}-batch")
                self._inflight.add(task)  # the batch takes itself out when it ends (_run_batch's finally)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave callers waiting forever
            log.exception("batcher %s: collector failed", self.name)
            self._closed = True
            message = f"batcher {self.name!r} failed: {e!r}"
            _fail(self._collecting, lambda: RuntimeError(message))
            self._collecting = []
            while self._queue:
                _fail(self._queue.popleft(), lambda: RuntimeError(message))
            self._queued_items = 0

    async def _collect(self) -> list[_Entry[T, R]]:
        """Wait for a first item, then gather more until the batch is full or the first item's window ends."""
        assert self._wakeup is not None
        max_size = self.config.max_batch_size
        batch = self._collecting = []
        while not batch:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = self._queue[0][0].submitted + self._max_wait_s
            while True:
                blocked = self._take(batch, max_size)
                if blocked or len(batch) >= max_size or not batch:
                    break  # full, next group does not fit, or everything taken so far was cancelled
                if self.config.idle_dispatch and not self._inflight:
                    break  # the model is idle: run what is here now (a running batch's end also wakes us)
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wakeup.clear()  # the queue is empty here (_take drained it), so no wake-up is lost
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
        return batch

    def _take(self, batch: list[_Entry[T, R]], max_size: int) -> bool:
        """Move queued groups into ``batch`` while they fit; True if a waiting group was left for the next batch."""
        while self._queue and len(batch) < max_size:
            group = self._queue[0]
            live = [e for e in group if not e.future.done()]
            dropped = len(group) - len(live)
            room = max_size - len(batch)
            if len(live) <= room:
                self._queue.popleft()
                self._queued_items -= len(group)
                self.stats.dropped += dropped
                batch.extend(live)
            elif len(live) > max_size:
                # Too big for any batch: fill this one with its head, leave the tail queued at the front.
                self._queue[0] = live[room:]
                self._queued_items -= len(group) - len(live) + room
                self.stats.dropped += dropped
                batch.extend(live[:room])
            else:
                return True  # keep the request's items together: it opens the next batch
        return False

    # ------------------------------------------------------------------ execution

    def _call(self, items: list[T]) -> tuple[float, Sequence[R] | None, Exception | None]:
        """Runs in the executor: the start time (so queue waits include time queued in the executor) and fn's
        results or exception."""
        started = time.perf_counter()
        try:
            return started, self.fn(items), None
        except Exception as e:
            return started, None, e

    async def _run_batch(self, batch: list[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._slots is not None
        try:
            started, results, error = await self._loop.run_in_executor(self.executor, self._call, [e.item for e in batch])
            waits = []
            for entry in batch:
                entry.wait_ms = (started - entry.submitted) * 1000.0
                waits.append(entry.wait_ms)
            if error is None and results is not None and len(results) != len(batch):
                error = RuntimeError(f"batch function of batcher {self.name!r} returned {len(results)} results "
                                     f"for {len(batch)} items")
            self.stats.record(len(batch), waits, failed=error is not None)
            if error is not None:
                err = error
                _fail(batch, lambda: err)  # the callers share fn's own exception, as they would unbatched
                return
            assert results is not None
            for entry, result in zip(batch, results, strict=True):
                if not entry.future.done():  # cancelled after the start: discard
                    entry.future.set_result(result)
        except asyncio.CancelledError:
            _fail(batch, _closed_error)
            raise
        except Exception as e:  # executor-level failure, e.g. the executor was shut down
            executor_error = e
            _fail(batch, lambda: executor_error)
        finally:
            self._inflight.discard(asyncio.current_task())
            self._slots.release()
            if self._wakeup is not None and (self._queue or self._collecting):
                self._wakeup.set()  # items gathered behind this batch go now, if the model is idle

    async def _run_direct(self, items: list[T], submitted: float) -> tuple[Sequence[R], float]:
        """Unbatched path (``enabled=False``): one call per request chunk, same checks and statistics."""
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        started, results, error = await loop.run_in_executor(self.executor, self._call, items)
        wait_ms = (started - submitted) * 1000.0
        if error is None and results is not None and len(results) != len(items):
            error = RuntimeError(f"batch function of batcher {self.name!r} returned {len(results)} results "
                                 f"for {len(items)} items")
        self.stats.record(len(items), [wait_ms] * len(items), failed=error is not None)
        if error is not None:
            raise error
        assert results is not None
        return results, wait_ms
