"""The cross-request dynamic batcher, with real blocking batch functions (and the real bundled embedder).

Timing on a shared CI machine is noisy, so no test asserts a latency: windows are made long where two items must
share a batch, and otherwise only membership, order and counts are checked.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from retrieval.search.batching import BatcherConfig, MicroBatcher


class Recorder:
    """A blocking batch function: records each batch it receives and returns ``item * 10``.

    ``poison`` makes a batch containing it raise; ``gate`` (when set) blocks every call until released, so tests
    can hold execution slots busy.
    """

    def __init__(self, *, poison: object = None, short_by: int = 0) -> None:
        self.batches: list[list[object]] = []
        self.poison = poison
        self.short_by = short_by
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def __call__(self, items: list[object]) -> list[object]:
        with self.lock:
            self.batches.append(list(items))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        if self.poison is not None and self.poison in items:
            raise ValueError(f"poisoned batch {items}")
        out = [x * 10 for x in items]  # type: ignore[operator]
        return out[: len(out) - self.short_by]

    def batch_of(self, item: object) -> list[object]:
        (batch,) = [b for b in self.batches if item in b]
        return batch


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="test-batching")
    yield pool
    pool.shutdown(wait=True)


async def _wait_entered(fn: Recorder) -> None:
    """Until the batch function has started (it blocks on its gate in an executor thread)."""
    assert await asyncio.to_thread(fn.entered.wait, 10)


def test_config_validation_names_field_and_range() -> None:
    BatcherConfig(max_batch_size=1, max_wait_ms=0)
    BatcherConfig(max_batch_size=1024, max_wait_ms=1000)
    with pytest.raises(ValueError, match=r"max_batch_size .*\[1, 1024\].*0"):
        BatcherConfig(max_batch_size=0)
    with pytest.raises(ValueError, match=r"max_batch_size .*\[1, 1024\]"):
        BatcherConfig(max_batch_size=2048)
    with pytest.raises(ValueError, match=r"max_wait_ms .*\[0, 1000\].*-1"):
        BatcherConfig(max_wait_ms=-1)
    with pytest.raises(ValueError, match=r"max_wait_ms .*\[0, 1000\]"):
        BatcherConfig(max_wait_ms=1500)
    with pytest.raises(ValueError, match=r"max_concurrent_batches .*\[1, 64\]"):
        BatcherConfig(max_concurrent_batches=0)


def test_concurrent_submits_get_their_own_results(executor) -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=8, max_wait_ms=5), executor=executor, name="order")

    async def one(i: int) -> int:
        await asyncio.sleep(random.random() * 0.01)  # spread the submits over several batches
        return await batcher.submit(i)

    async def main() -> list[int]:
        try:
            return await asyncio.gather(*(one(i) for i in range(50)))
        finally:
            await batcher.close()

    assert asyncio.run(main()) == [i * 10 for i in range(50)]
    assert sorted(x for b in fn.batches for x in b) == list(range(50))  # each item computed exactly once
    assert len(fn.batches) < 50
    snap = batcher.snapshot()
    assert snap["items"] == 50 and snap["batches"] == len(fn.batches) and snap["name"] == "order"
    assert snap["mean_batch_size"] == pytest.approx(50 / len(fn.batches))
    assert 0 <= snap["queue_wait_p50_ms"] <= snap["queue_wait_p95_ms"]


def test_max_batch_size_respected_and_requests_kept_together(executor) -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=4, max_wait_ms=50), executor=executor)

    async def main():
        try:
            singles = asyncio.gather(*(batcher.submit(i) for i in range(30)))
            groups = asyncio.gather(*(batcher.submit_many([100 + 10 * g + j for j in range(3)]) for g in range(5)))
            big = batcher.submit_many(list(range(1000, 1010)))  # larger than a batch: split, order kept
            return await singles, await groups, await big
        finally:
            await batcher.close()

    singles, groups, big = asyncio.run(main())
    assert singles == [i * 10 for i in range(30)]
    assert groups == [[(100 + 10 * g + j) * 10 for j in range(3)] for g in range(5)]
    assert big == [x * 10 for x in range(1000, 1010)]
    assert all(1 <= len(b) <= 4 for b in fn.batches)
    assert sum(len(b) for b in fn.batches) == 30 + 15 + 10
    for g in range(5):  # a request's 3 items fit in a batch of 4, so they share one
        batch = fn.batch_of(100 + 10 * g)
        assert all(100 + 10 * g + j in batch for j in range(3))


def test_lone_item_served_and_items_within_window_share_a_batch(executor) -> None:
    fn = Recorder()
    quick = MicroBatcher(fn, BatcherConfig(max_batch_size=8, max_wait_ms=2), executor=executor)
    fn2 = Recorder()
    slow = MicroBatcher(fn2, BatcherConfig(max_batch_size=2, max_wait_ms=1000, idle_dispatch=False),
                        executor=executor)  # every batch holds its window (full at 2: no 1 s wait)

    async def main():
        try:
            lone = await asyncio.wait_for(quick.submit(7), 10)  # served once its (short) window ends
            first = asyncio.ensure_future(slow.submit(1))
            await asyncio.sleep(0.02)  # well inside the 1 s window
            second = await slow.submit(2)
            return lone, await first, second
        finally:
            await quick.close()
            await slow.close()

    assert asyncio.run(main()) == (70, 10, 20)
    assert fn.batches == [[7]]
    assert fn2.batches == [[1, 2]]


def test_an_idle_model_takes_a_lone_item_at_once_and_batches_what_queues_behind_a_running_batch(executor) -> None:
    """idle_dispatch (the default): with nothing running, an item goes at once, whatever the window (a 1 s window
    here: served well inside it); items that arrive while a batch computes are gathered and go together as soon as
    it ends (not when their 1 s window does). The 0.9 s bounds only tell "before the window" from "after it"."""
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=8, max_wait_ms=1000, max_concurrent_batches=2),
                           executor=executor)

    async def main():
        try:
            first = await asyncio.wait_for(batcher.submit(1), 0.9)  # did not wait out its 1 s window
            await batcher.submit(2)
            fn.gate = threading.Event()
            fn.entered.clear()
            running = asyncio.ensure_future(batcher.submit(3))
            await _wait_entered(fn)  # batch [3] computes (blocked on the gate)
            behind = [asyncio.ensure_future(batcher.submit(i)) for i in (4, 5, 6)]
            await asyncio.sleep(0.05)
            assert not any(b.done() for b in behind) and batcher.queue_depth == 3
            fn.gate.set()
            return first, await running, await asyncio.wait_for(asyncio.gather(*behind), 0.9)
        finally:
            if fn.gate is not None:
                fn.gate.set()
            await batcher.close()

    assert asyncio.run(main()) == (10, 30, [40, 50, 60])
    assert fn.batches == [[1], [2], [3], [4, 5, 6]]


def test_full_batch_does_not_wait_for_window(executor) -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=4, max_wait_ms=1000), executor=executor)

    async def main():
        try:  # 4 items fill the batch at once; the 1 s window must not be waited out (10 s is a hang guard)
            return await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(4))), 10)
        finally:
            await batcher.close()

    assert asyncio.run(main()) == [0, 10, 20, 30]
    assert fn.batches == [[0, 1, 2, 3]]


def test_next_batch_runs_while_previous_one_computes(executor) -> None:
    first_gate = threading.Event()
    calls: list[list[int]] = []

    def fn(items: list[int]) -> list[int]:
        calls.append(list(items))
        if 1 in items:  # hold the first batch until the second one has finished
            assert first_gate.wait(10)
        return [x * 10 for x in items]

    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=4, max_wait_ms=0, max_concurrent_batches=2),
                           executor=executor)

    async def main():
        try:
            blocked = asyncio.ensure_future(batcher.submit(1))
            while not calls:
                await asyncio.sleep(0.005)
            second = await asyncio.wait_for(batcher.submit(2), 10)  # completes while batch [1] still runs
            still_running = not blocked.done()
            first_gate.set()
            return second, await blocked, still_running
        finally:
            first_gate.set()
            await batcher.close()

    assert asyncio.run(main()) == (20, 10, True)
    assert calls == [[1], [2]]


def test_error_reaches_only_the_callers_of_that_batch(executor) -> None:
    fn = Recorder(poison=13)
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=2, max_wait_ms=50), executor=executor)
    items = [1, 13, 2, 3, 4]

    async def main():
        try:
            outcomes = await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)
            later = await batcher.submit(5)
            return outcomes, later
        finally:
            await batcher.close()

    outcomes, later = asyncio.run(main())
    poisoned = fn.batch_of(13)
    for item, outcome in zip(items, outcomes, strict=True):
        if item in poisoned:
            assert isinstance(outcome, ValueError) and "poisoned" in str(outcome)
        else:
            assert outcome == item * 10
    assert len(poisoned) < len(items)  # some callers were in other batches and succeeded
    assert later == 50
    assert batcher.stats.errors == 1


def test_wrong_result_count_is_a_runtime_error(executor) -> None:
    fn = Recorder(short_by=1)
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=4, max_wait_ms=20), executor=executor, name="short")

    async def main():
        try:
            return await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
        finally:
            await batcher.close()

    outcomes = asyncio.run(main())
    assert fn.batches == [[1, 2]]
    for outcome in outcomes:
        assert isinstance(outcome, RuntimeError)
        assert "returned 1 results for 2 items" in str(outcome) and "short" in str(outcome)


def test_cancelled_before_batch_runs_is_not_computed(executor) -> None:
    fn = Recorder()
    fn.gate = threading.Event()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=8, max_wait_ms=0, max_concurrent_batches=1),
                           executor=executor)

    async def main():
        try:
            running = asyncio.ensure_future(batcher.submit(1))
            await _wait_entered(fn)  # the only execution slot is busy: later items wait in the queue
            cancelled = asyncio.ensure_future(batcher.submit(2))
            kept = asyncio.ensure_future(batcher.submit(3))
            await asyncio.sleep(0.01)
            cancelled.cancel()
            running.cancel()  # after its batch started: the result is just discarded
            fn.gate.set()
            return await kept, cancelled, running
        finally:
            fn.gate.set()
            await batcher.close()

    kept, cancelled, running = asyncio.run(main())
    assert kept == 30 and cancelled.cancelled() and running.cancelled()
    assert fn.batches == [[1], [3]]
    assert batcher.stats.dropped == 1 and batcher.stats.items == 2


def test_disabled_calls_fn_once_per_item(executor) -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(enabled=False, max_batch_size=4), executor=executor)

    async def main():
        singles = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
        timed = await batcher.submit_timed(11)
        many = await batcher.submit_many(list(range(20, 26)))
        await batcher.close()
        return singles, timed, many

    singles, (result, wait_ms), many = asyncio.run(main())
    assert singles == [i * 10 for i in range(10)] and result == 110 and wait_ms >= 0
    assert many == [x * 10 for x in range(20, 26)]
    assert sorted(fn.batches[:10]) == [[i] for i in range(10)]
    assert fn.batches[10] == [11]
    assert fn.batches[11:] == [[20, 21, 22, 23], [24, 25]]  # a request's own items, in chunks of max_batch_size


def test_close_fails_pending_callers(executor) -> None:
    fn = Recorder()
    fn.gate = threading.Event()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=8, max_wait_ms=0, max_concurrent_batches=1),
                           executor=executor)

    async def main():
        running = asyncio.ensure_future(batcher.submit(1))
        await _wait_entered(fn)
        pending = asyncio.ensure_future(batcher.submit_many([2, 3]))
        await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(batcher.close())
        with pytest.raises(RuntimeError, match="batcher closed"):
            await asyncio.wait_for(pending, 10)
        fn.gate.set()  # the running batch finishes and its caller still gets the result
        await closing
        with pytest.raises(RuntimeError, match="batcher closed"):
            await batcher.submit(4)
        return await running

    try:
        assert asyncio.run(main()) == 10
    finally:
        fn.gate.set()
    assert fn.batches == [[1]]


def test_submit_timed_reports_queue_wait(executor) -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_size=4, max_wait_ms=30, idle_dispatch=False), executor=executor)

    async def main():
        try:
            batcher.start()
            return await asyncio.gather(batcher.submit_timed(1), batcher.submit_timed(2))
        finally:
            await batcher.close()

    (r1, w1), (r2, w2) = asyncio.run(main())
    assert (r1, r2) == (10, 20)
    assert w1 >= 0 and w2 >= 0
    assert list(batcher.stats.queue_wait_ms) == pytest.approx([w1, w2])


def test_real_embedder_batched_equals_unbatched(embedder) -> None:
    sentences = [
        "Honey bees dance to tell the hive where flowers are.",
        "The court settles disputes between the two companies.",
        "Photosynthesis turns light into chemical energy.",
        "A quick brown fox jumps over the lazy dog.",
        "Glaciers carve valleys over thousands of years.",
        "The central bank raised interest rates again.",
        "Vaccines train the immune system to recognise pathogens.",
        "Rust guarantees memory safety without a garbage collector.",
        "The orchestra tuned to the oboe's A.",
        "Tides follow the pull of the moon.",
        "Who wrote the contract's arbitration clause?",
        "Volcanic ash grounded flights across Europe.",
        "Mitochondria produce most of the cell's ATP.",
        "The marathon route crosses five bridges.",
        "Sourdough rises thanks to wild yeast and lactobacilli.",
        "Satellites relay signals around the curved Earth.",
    ]
    expected = embedder.embed(sentences)
    with ThreadPoolExecutor(2) as pool:
        batcher = MicroBatcher(embedder.embed, BatcherConfig(max_batch_size=32, max_wait_ms=20), executor=pool,
                               name="query-embedding")

        async def main():
            try:
                return await asyncio.gather(*(batcher.submit(s) for s in sentences))
            finally:
                await batcher.close()

        rows = asyncio.run(main())
    assert len(rows) == len(sentences)
    for row, want in zip(rows, expected, strict=True):
        np.testing.assert_allclose(row, want, atol=2e-3)
    assert batcher.stats.batches < len(sentences)
    assert batcher.stats.items == len(sentences)
