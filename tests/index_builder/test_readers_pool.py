"""The reader processes (index_builder.documents.reader_pool): answers in order, a worker that dies mid-file skips only that
file, no process outlives the pool. Real worker processes reading real files."""

from __future__ import annotations

import os
import signal
import threading
import time

from index_builder.documents.reader_pool import Job, ReaderPool, read_request


def test_answers_come_back_in_order_with_pre_answered_jobs_between(tmp_path):
    names = [f"f{i:03d}.md" for i in range(200)]
    for i, n in enumerate(names):
        (tmp_path / n).write_text(f"# Note {i}\n\nbody {i}", encoding="utf-8")
    jobs = []
    for i, n in enumerate(names):
        if i % 7 == 0:  # what a cache hit or a skip by name looks like
            jobs.append(Job(n, result={"cached": True}))
        else:
            jobs.append(Job(n, request=read_request(tmp_path / n, n, root=str(tmp_path), max_bytes=2**20)))
    with ReaderPool(workers=2) as pool:
        out = list(pool.run(jobs))
        procs = [w.proc for w in pool.workers]
    assert [j.key for j in out] == names
    for i, j in enumerate(out):
        assert j.result == {"cached": True} if i % 7 == 0 else j.result["ok"]["text"] == f"Note {i}\n\nbody {i}"
    assert procs and all(p.poll() is not None for p in procs)  # closed: no reader process left


def test_a_reader_killed_mid_file_skips_that_file_only(tmp_path):
    (tmp_path / "slow.md").write_text("[" * 3_000_000, encoding="utf-8")  # ~20 s of markdown-it-py
    for n in ("a.md", "b.md"):
        (tmp_path / n).write_text(f"# {n}\n\ntext", encoding="utf-8")
    jobs = [Job(n, request=read_request(tmp_path / n, n, root=str(tmp_path), max_bytes=2**23))
            for n in ("slow.md", "a.md", "b.md")]
    killed: list[int] = []

    def kill_when_busy(pool: ReaderPool) -> None:  # what the kernel's OOM killer does, mid-file
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = list(pool.workers)
            if workers and workers[0].ready and workers[0].jobs:
                time.sleep(0.5)  # inside slow.md by now (a.md and b.md wait behind it)
                os.kill(workers[0].proc.pid, signal.SIGKILL)
                killed.append(workers[0].proc.pid)
                return
            time.sleep(0.02)

    with ReaderPool(workers=1, timeout_s=120) as pool:
        killer = threading.Thread(target=kill_when_busy, args=(pool,))
        killer.start()
        t = time.monotonic()
        out = {j.key: j.result for j in pool.run(jobs)}
        killer.join()
    assert killed and time.monotonic() - t < 60
    assert out["slow.md"] == {"skip": "the reader process ended (signal SIGKILL) while reading it"}
    assert out["a.md"]["ok"]["title"] == "a.md" and out["b.md"]["ok"]["title"] == "b.md"  # read by its successor
    assert pool.started == 2
