"""A real ``hybridrag serve``: its compute threads run at ``server.compute_nice``, its event loop and gRPC's own
threads keep their priority, and it answers the same either way (retrieval/serving/priority.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pbg
from retrieval.serving.priority import nice_of, run_niced
from tests.helpers import ServeProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values: Linux /proc")


def _nices(pid: int) -> dict[int, tuple[str, int]]:
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        comm = (t / "comm").read_text().strip()
        out[int(t.name)] = (comm, int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]))  # field 19: nice
    return out


def _answer(target: str) -> list[str]:
    with grpc.insecure_channel(target) as channel:
        res = pbg.RetrieverStub(channel).Retrieve(pb.RetrieveRequest(query="how do bees find nectar", top_k=5,
                                                                     bypass_cache=True), timeout=30)
    return [p.doc_id for p in res.passages]


def test_compute_threads_run_below_the_loop_and_answers_do_not_change(sample_index_dir):
    niced = ServeProcess(["--index", str(sample_index_dir)], env={"HYBRIDRAG_SERVER__COMPUTE_NICE": "7"})
    try:
        got = _answer(niced.target)
        threads = _nices(niced.pid)
        assert threads[niced.pid][1] == 0  # the main thread runs the event loop (both doors, the pipeline)
        grpc_own = [n for c, n in threads.values() if c.startswith(("grpc", "event_engine", "lifeguard"))]
        assert grpc_own and all(n == 0 for n in grpc_own)
        # the model pool (4) and the BM25/faiss pool (4), started before serving, plus ONNX Runtime's own
        assert sum(1 for _, n in threads.values() if n == 7) >= 8, threads
        assert "compute threads at nice 7" in niced.text()
    finally:
        assert niced.stop() == 0
    plain = ServeProcess(["--index", str(sample_index_dir)], env={"HYBRIDRAG_SERVER__COMPUTE_NICE": "0"})
    try:
        assert _answer(plain.target) == got
        assert all(n == 0 for _, n in _nices(plain.pid).values())
    finally:
        assert plain.stop() == 0


def test_run_niced_lowers_only_its_own_thread_and_what_it_creates():
    import threading

    def child_nice() -> tuple[int, int]:
        seen = []
        t = threading.Thread(target=lambda: seen.append(nice_of(threading.get_native_id())))
        t.start()
        t.join()
        return nice_of(threading.get_native_id()), seen[0]

    mine = nice_of(threading.get_native_id())
    assert run_niced(mine + 3, child_nice) == (mine + 3, mine + 3)  # the loader and a thread it made
    assert nice_of(threading.get_native_id()) == mine  # the caller keeps its priority
    with pytest.raises(ZeroDivisionError):
        run_niced(mine + 1, lambda: 1 / 0)  # errors come back to the caller
