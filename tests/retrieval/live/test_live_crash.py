"""kill -9 of a real server (``hybridrag serve --store``) during a stream of upserts, and again during a rebuild:
after a restart every acknowledged write is present, no batch is half-present, and queries work."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from hybridrag.cli import main as cli
from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.live.store import DocumentStore
from tests.helpers import REPO, ServeProcess


def start(index: Path, store: Path, **env: str) -> tuple[ServeProcess, str]:
    server = ServeProcess(["--index", str(index), "--store", str(store)],
                          env={"HYBRIDRAG_LIVE__REBUILD_AFTER_S": "0",
                               "HYBRIDRAG_LIVE__REBUILD_AFTER_WRITES": "0", **env})  # rebuilds only when asked
    return server, server.target


def client(target: str) -> RetrieverClient:
    return RetrieverClient(target, ClientOptions(retry=RetryPolicy(attempts=1), timeout=60))


def batch(i: int) -> list[pb.Document]:
    return [pb.Document(id=f"kq{i}-{j}", tenant="acme", text=f"crash marker kq{i}x{j} batch {i} document {j}")
            for j in range(3)]


def check_after_restart(index: Path, store_path: Path, acked: list[int], generation: int) -> None:
    proc, target = start(index, store_path)
    try:
        with client(target) as c:
            assert c.status().generation == generation  # CURRENT still names a complete snapshot
            for i in acked:
                r = c.retrieve(f"kq{i}x1", 3, stages=["bm25"])
                assert r.passages and r.passages[0].doc_id == f"kq{i}-1", i  # acknowledged: present and searchable
            assert c.retrieve("how do bees find flowers", 5).passages
    finally:
        proc.kill()
    store = DocumentStore(store_path)
    _, docs = store.snapshot()
    per_batch: dict[str, int] = {}
    for d in docs:
        if d.id.startswith("kq"):
            per_batch[d.id.split("-")[0]] = per_batch.get(d.id.split("-")[0], 0) + 1
    assert set(per_batch.values()) <= {3}, per_batch  # no half-present batch
    store.close()


@pytest.mark.slow  # ~18 s: processes killed with SIGKILL during upserts and during a rebuild, then replayed
def test_kill_9_during_upserts_and_during_a_rebuild(tmp_path):
    index, store = tmp_path / "index", tmp_path / "store.db"
    assert cli(["build", "--corpus", str(REPO / "data" / "sample"), "--out", str(index), "--store", str(store),
                "--quiet"]) == 0
    # 1. a stream of upserts, killed mid-stream
    proc, target = start(index, store)
    acked: list[int] = []
    try:
        with client(target) as c:
            for i in range(1000):
                if i == 6:
                    threading.Timer(0.05, lambda: os.kill(proc.pid, signal.SIGKILL)).start()
                try:
                    c.upsert(batch(i), timeout=60)  # the first write warms the encoder: slack on a loaded machine
                except grpc.RpcError:
                    if i < 6:  # before the kill is scheduled, a failure is the server's, not the crash's: show it
                        raise
                    break
                acked.append(i)
    finally:
        proc.kill()
    assert 6 <= len(acked) < 1000
    check_after_restart(index, store, acked, generation=1)
    # 2. killed during a rebuild (the writes made before it must survive; CURRENT must stay loadable). A rebuild
    # reuses every encoding it can and is over in well under a second here: [build] reuse = false makes this one
    # embed the corpus again (~3 s), so the kill lands inside it
    proc, target = start(index, store, HYBRIDRAG_BUILD__REUSE="false")
    try:
        with client(target) as c:
            for i in range(1000, 1004):
                c.upsert(batch(i))
                acked.append(i)
            rebuild = threading.Thread(target=lambda: pytest.raises(grpc.RpcError, c.rebuild), daemon=True)
            rebuild.start()
            time.sleep(1.5)  # the rebuild is embedding the corpus
            os.kill(proc.pid, signal.SIGKILL)
            rebuild.join(timeout=30)
    finally:
        proc.kill()
    check_after_restart(index, store, acked, generation=1)  # the killed rebuild never became current
    # a later rebuild cleans up the dead builder's half-written folder and completes
    assert cli(["index", "rebuild", "--index", str(index), "--store", str(store), "--quiet"]) == 0
    assert not list((index / "snapshots").glob(".tmp-gen-*"))
    check_after_restart(index, store, acked, generation=2)
