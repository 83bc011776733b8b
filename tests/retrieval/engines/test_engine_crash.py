"""kill -9 of a real server on the Qdrant *folder* backend (qdrant-client's local engine persisted in a folder)
during a stream of upserts, several times over: after each restart on the same folder every acknowledged write
is present and searchable, and the folder reopens (its lock is a ``flock``, which the kernel drops with the
process).

What the engine path promises (``EngineWriter``, docs/deployment.md "What a write means there") is tested, and no
more: an acknowledged batch is all there (every point of it committed before the answer); the batch that was in
flight when the server died is *not* one transaction, but it is applied in order, so what survives of it is a
prefix of its documents (possibly none, possibly all)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from index_builder.snapshot.format import load_snapshot
from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.engines.qdrant.engine import QdrantEngine
from retrieval.engines.settings import EngineConfig
from tests.helpers import ServeProcess

PER_BATCH = 3
KILL_AFTER_S = (0.02, 0.07, 0.13)  # one kill per round, at a different point of a write each time
WARM = 3  # acknowledged writes per round before the kill is armed (the first warms the encoder)


def _config(tmp_path: Path, folder: Path) -> Path:
    cfg = tmp_path / "engine.toml"
    cfg.write_text(f'[backend]\nkind = "qdrant"\nlocation = "{folder}"\ncollection = "sample"\n\n'
                   '[generation.embedded]\nenabled = false\n')
    return cfg


def _client(target: str) -> RetrieverClient:
    return RetrieverClient(target, ClientOptions(retry=RetryPolicy(attempts=1), timeout=60))


def _batch(i: int) -> list[pb.Document]:
    return [pb.Document(id=f"eq{i}-{j}", tenant="acme", text=f"engine crash marker eq{i}x{j} batch {i} doc {j}")
            for j in range(PER_BATCH)]


def _present(folder: Path, batches: list[int]) -> dict[int, list[int]]:
    """The documents of each batch found in the folder (opened in this process: the server must be gone)."""
    engine = QdrantEngine(EngineConfig(kind="qdrant", location=str(folder), collection="sample"))
    try:
        owners = engine.owners([d.id for i in batches for d in _batch(i)])
    finally:
        engine.close()
    return {i: [j for j in range(PER_BATCH) if f"eq{i}-{j}" in owners] for i in batches}


@pytest.mark.slow  # ~15 s: writer processes killed with SIGKILL mid-upsert on a Qdrant folder, then recovery
def test_kill_9_during_upserts_on_the_qdrant_folder_backend(tmp_path, sample_index_dir, record_property):
    folder = tmp_path / "engine"
    engine = QdrantEngine(EngineConfig(kind="qdrant", location=str(folder), collection="sample"))
    try:
        engine.migrate(load_snapshot(sample_index_dir))
    finally:
        engine.close()
    cfg = _config(tmp_path, folder)
    t0 = time.monotonic()
    acked: list[int] = []
    in_flight: list[int] = []
    kills = 0
    for r, delay in enumerate(KILL_AFTER_S):
        server = ServeProcess(["--config", str(cfg)])  # the same folder: it must reopen after the last kill
        timer = threading.Timer(delay, os.kill, (server.pid, signal.SIGKILL))
        try:
            with _client(server.target) as c:
                if acked:  # what the previous rounds acknowledged is still there after their kill
                    assert c.retrieve(f"eq{acked[-1]}x1", 3, stages=["bm25"]).passages[0].doc_id == f"eq{acked[-1]}-1"
                for i in range(r * 1000, r * 1000 + 1000):
                    if i == r * 1000 + WARM:
                        timer.start()
                    try:
                        c.upsert(_batch(i), timeout=60)
                    except grpc.RpcError as e:
                        assert i >= r * 1000 + WARM, (e, server.text())  # before the kill: the server's own failure
                        assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # the connection went with the process
                        in_flight.append(i)
                        break
                    acked.append(i)
        finally:
            timer.cancel()
            server.kill()
        assert server.proc.returncode == -signal.SIGKILL, server.text()
        kills += 1
        assert (folder / ".lock").exists()  # left behind; its flock went with the process
    assert len(in_flight) == kills == len(KILL_AFTER_S)

    # every acknowledged write: present and searchable on a server restarted on the same folder
    server = ServeProcess(["--config", str(cfg)])
    try:
        with _client(server.target) as c:
            for i in acked:
                r1 = c.retrieve(f"eq{i}x1", 3, stages=["bm25"], bypass_cache=True)
                assert r1.passages and r1.passages[0].doc_id == f"eq{i}-1", i
            assert c.retrieve("how do bees find flowers", 5).passages
    finally:
        assert server.stop() == 0
    present = _present(folder, acked + in_flight)
    assert all(present[i] == list(range(PER_BATCH)) for i in acked), {i: present[i] for i in acked}
    # the batch in flight at each kill: not a transaction, but applied in order, so a prefix survives
    for i in in_flight:
        assert present[i] == list(range(len(present[i]))), (i, present[i])
    partial = sum(0 < len(present[i]) < PER_BATCH for i in in_flight)
    took = time.monotonic() - t0
    print(f"\nqdrant folder kill -9: {kills} kills, {len(acked)} acknowledged writes ({len(acked) * PER_BATCH} "
          f"documents) checked present and searchable; in flight at the kills: "
          f"{[len(present[i]) for i in in_flight]} of {PER_BATCH} documents survived ({partial} partial); "
          f"{took:.1f} s")
    record_property("kills", kills)
    record_property("acknowledged_writes_checked", len(acked))
    record_property("in_flight_documents_surviving", [len(present[i]) for i in in_flight])
