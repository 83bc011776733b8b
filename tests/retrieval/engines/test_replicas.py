"""Two ``hybridrag serve`` replicas over one engine and one Redis, as separate processes on loopback: the same
answers, a write through one visible through the other at the next query, and the shared cache filled by one,
hit by the other and invalidated for both by a write.

The engine is ``hybridrag engine`` (Qdrant's local engine behind its REST API: no Qdrant server installs here),
so the replicas use qdrant-client's remote path, as against a Qdrant cluster; Redis is Debian's redis-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from tests.helpers import RedisServer, ServeProcess, free_port

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (apt-get install redis-server)")


def _wait(pred, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except Exception:  # noqa: BLE001 -- not up yet
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not come up in {timeout} s")


@pytest.fixture()
def cluster(tmp_path, sample_index_dir):
    """redis-server + the engine host + the sample index migrated into it; yields (config path, env, redis,
    the replicas started, stopped at the end)."""
    eport = free_port()
    redis_server = RedisServer(REDIS, tmp_path)
    engine = subprocess.Popen([sys.executable, "-m", "hybridrag", "engine", "--location", str(tmp_path / "engine"),
                               "--port", str(eport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    replicas: list[ServeProcess] = []
    try:
        import httpx

        _wait(lambda: httpx.get(f"http://127.0.0.1:{eport}/healthz", timeout=1).status_code == 200, "engine host")
        cfg = tmp_path / "replica.toml"
        cfg.write_text(f'[backend]\nkind = "qdrant"\nlocation = "http://127.0.0.1:{eport}"\ncollection = "sample"\n\n'
                       f'[cache]\nredis_url = "{redis_server.url}"\n\n[generation.embedded]\nenabled = false\n')
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        out = subprocess.run([sys.executable, "-m", "hybridrag", "migrate", "--index", str(sample_index_dir),
                              "--config", str(cfg)], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "vectors reused, nothing re-embedded" in out.stdout
        yield cfg, env, redis_server.client, replicas
    finally:
        for replica in replicas:
            replica.stop()
        engine.terminate()
        try:
            engine.wait(timeout=20)
        except subprocess.TimeoutExpired:
            engine.kill()
        redis_server.stop()


def _replica(cfg: Path, env: dict, replicas: list[ServeProcess]) -> str:
    replicas.append(ServeProcess(["--config", str(cfg)], env=env))
    return replicas[-1].target


def test_two_replicas_share_the_engine_and_the_cache(cluster):
    cfg, env, r, replicas = cluster
    a_target, b_target = _replica(cfg, env, replicas), _replica(cfg, env, replicas)
    opts = ClientOptions(retry=RetryPolicy(attempts=1), timeout=60)
    with RetrieverClient(a_target, opts) as a, RetrieverClient(b_target, opts) as b:
        assert a.status().backend.startswith("qdrant http://127.0.0.1:")
        for q in ("how do bees share where flowers are", "who settles contract disputes", "why is venus hot"):
            ra, rb = a.retrieve(q, 10, bypass_cache=True), b.retrieve(q, 10, bypass_cache=True)
            assert [p.doc_id for p in ra.passages] == [p.doc_id for p in rb.passages]  # the same answers

        q = "how do axolotls regrow their limbs"
        first = a.retrieve(q, 5)
        assert not first.cache_hit
        again = b.retrieve(q, 5)  # filled by A, hit by B: the exact-match entry
        assert again.cache_hit and again.cache_similarity == pytest.approx(1.0)
        assert [p.doc_id for p in again.passages] == [p.doc_id for p in first.passages]
        near = b.retrieve(q + "?", 5)  # a near-duplicate: the semantic lookup, vectors shared through the stream
        assert near.cache_hit and 0.91 <= near.cache_similarity < 1.0

        w = b.upsert([pb.Document(id="axo-1", tenant="acme", title="Axolotl regeneration",
                                  text="Axolotls regrow whole limbs from a blastema of dedifferentiated cells.")])
        assert w.upserted == 1 and w.sequence == int(r.get("hybridrag:v"))
        after = a.retrieve(q, 5)  # the write through B invalidated A's entry: a fresh search that sees it
        assert not after.cache_hit and after.passages[0].doc_id == "axo-1"
        assert b.retrieve(q, 5).cache_hit  # refilled by A under the new version, hit by B

        assert a.delete(["axo-1"], tenant="acme").deleted == 1
        gone = b.retrieve(q, 5)
        assert not gone.cache_hit and "axo-1" not in [p.doc_id for p in gone.passages]
