"""Several server processes on one port (``[server] processes``, SO_REUSEPORT) over one snapshot: real
``hybridrag serve`` processes on loopback, the sample index and the bundled model."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time

import grpc
import httpx
import pytest

from hybridrag.cli import main
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from retrieval.app import worker_config, worker_threads
from retrieval.config import AppConfig, ServerConfig
from tests.helpers import ServeProcess

NO_LLM = {"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"}
QUERY = "how do bees find flowers"


def _wait_for(sp: ServeProcess, pattern: str, count: int, timeout: float = 120.0) -> list[re.Match]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(re.finditer(pattern, sp.text()))
        if len(found) >= count:
            return found
        assert sp.alive(), sp.text()
        time.sleep(0.2)
    raise AssertionError(f"{count} x {pattern!r} not logged in {timeout:.0f} s:\n{sp.text()}")


def _retrieve_on_new_connections(target: str, n: int) -> list[list[str]]:
    out = []
    for _ in range(n):  # a local subchannel pool: each channel its own TCP connection, so the kernel picks anew
        with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            r = pb_grpc.RetrieverStub(ch).Retrieve(pb.RetrieveRequest(query=QUERY, top_k=5), timeout=30)
            out.append([p.doc_id for p in r.passages])
    return out


def _served(url: str) -> float:
    text = httpx.get(url, timeout=10).text
    m = re.search(r'hybridrag_requests_total\{code="OK",method="Retrieve",transport="grpc"\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def test_processes_share_one_port_spread_connections_and_a_dead_one_is_restarted(sample_index_dir, pipeline):
    """Two processes on one port: connections land on both (each process's own /metrics counts its calls), every
    answer is the library's; a worker killed with SIGKILL is restarted while the other keeps serving (the new one
    listens only once loaded); SIGTERM to the supervisor drains both and exits 0."""
    sp = ServeProcess(["--index", str(sample_index_dir), "--processes", "2"], env=NO_LLM)
    try:
        _wait_for(sp, r"worker \d .*serving .* on port", 2)
        pids = [int(p) for p in re.search(r"pids (\d+), (\d+)", sp.text()).groups()]
        metrics = ["http://" + m.group(1) for m in _wait_for(sp, r"metrics on (\S+/metrics)", 2)]
        expected = [pipeline.index.documents[d].id for d in pipeline.search(QUERY, 5).hits.doc]

        answers = _retrieve_on_new_connections(sp.target, 16)
        assert all(a == expected for a in answers), (answers, expected)
        counts = [_served(u) for u in metrics]
        assert sum(counts) == 16 and min(counts) > 0, counts  # all 16 on one process: p = 2 ** -15

        os.kill(pids[0], signal.SIGKILL)
        time.sleep(0.5)
        assert _retrieve_on_new_connections(sp.target, 4) == [expected] * 4  # the survivor serves meanwhile
        _wait_for(sp, r"worker 0 \(pid \d+\) exited with code -9: restarting it", 1)
        # while the new worker loads (seconds) it does not listen yet, so no connection lands on it and fails
        assert _retrieve_on_new_connections(sp.target, 8) == [expected] * 8
        _wait_for(sp, r"worker \d .*serving .* on port", 3)
        assert _retrieve_on_new_connections(sp.target, 4) == [expected] * 4

        assert sp.stop() == 0
        sp.wait_drained()
        assert "stopping 2 server processes" in sp.text()
        assert sp.text().count("draining in-flight calls") == 2, sp.text()
        for pid in pids[1:]:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        sp.kill()


def test_processes_refuse_a_document_store_and_bad_counts(sample_index_dir, tmp_path, capsys):
    """One document store has one writer: ``--store`` with two processes is refused at start, naming both."""
    rc = main(["serve", "--index", str(sample_index_dir), "--store", str(tmp_path / "store.db"), "--processes", "2",
               "--port", "0", "--metrics-port", "-1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "server.processes = 2" in err and "--store" in err and "processes = 1" in err
    assert not (tmp_path / "store.db").exists()  # refused before anything was opened
    for bad in (0, 65):
        with pytest.raises(ValueError, match="server.processes must be in"):
            ServerConfig(processes=bad)


def test_each_worker_gets_its_share_of_the_cores_and_its_own_metrics_port():
    """Runtimes left at 0 threads (all cores) get cores / processes each; a set value stays; metrics ports are
    offset by the worker's number."""
    base = AppConfig()
    base = dataclasses.replace(base, server=ServerConfig(processes=2), cross_encoder=dataclasses.replace(
        base.cross_encoder, runtime=dataclasses.replace(base.cross_encoder.runtime, intra_op_threads=3)))
    w = worker_config(base, 1, 50999, -1)
    assert w.server.port == 50999 and w.server.reuse_port and w.server.processes == 1
    assert w.metrics.port == base.metrics.port + 1 and w.http.port == -1
    assert w.embedder.runtime.intra_op_threads == w.late_interaction.runtime.intra_op_threads == worker_threads(2)
    assert worker_threads(2) == max(1, (os.cpu_count() or 1) // 2)
    assert w.cross_encoder.runtime.intra_op_threads == 3
