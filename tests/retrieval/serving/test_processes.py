"""Several server processes on one port (``[server] processes``, SO_REUSEPORT) over one snapshot: real
``hybridrag serve`` processes on loopback, the sample index and the bundled model."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from hybridrag.cli import main
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from retrieval.config import AppConfig, ServerConfig
from retrieval.processes import worker_config, worker_threads
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


def _served(url: str, transport: str = "grpc") -> float:
    text = httpx.get(url, timeout=10).text
    m = re.search(rf'hybridrag_requests_total\{{code="OK",method="Retrieve",transport="{transport}"\}} (\S+)', text)
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


class _Tally:
    """What the callers saw, under one lock: every call ends in exactly one of ok / unavailable / bad. Refusals
    are kept by caller and reason, with when they were first and last seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = self.ok = self.unavailable = 0
        self.bad: list[str] = []
        self.reasons: dict[str, int] = {}
        self.when: dict[str, list[float]] = {}
        self.ok_by_caller: dict[str, int] = {}

    def add(self, caller: str, outcome: str, detail: str = "") -> None:
        """Count one call. After a refusal the caller backs off 50 ms, as a client does (a gRPC channel in its
        reconnect backoff fails every call at once: a tight loop would count thousands)."""
        now = time.monotonic()
        with self.lock:
            self.calls += 1
            if outcome == "ok":
                self.ok += 1
                self.ok_by_caller[caller] = self.ok_by_caller.get(caller, 0) + 1
            elif outcome == "unavailable":
                self.unavailable += 1
                key = f"{caller} {detail[:300]}"
                self.reasons[key] = self.reasons.get(key, 0) + 1
                self.when.setdefault(key, [now, now])[1] = now
            else:
                self.bad.append(f"{caller}: {detail}")
        if outcome == "unavailable":
            time.sleep(0.05)


def _grpc_caller(name: str, target: str, expected: list[str], fresh: bool, stop: threading.Event,
                 tally: _Tally) -> None:
    """Retrieve in a loop on one long-lived channel, or (``fresh``) on a new connection each call: an answer equal
    to the library's or UNAVAILABLE; a deadline reached (a hang) or any other status is a failure."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    ch = None
    try:
        while not stop.is_set():
            if ch is None:
                ch = grpc.insecure_channel(target, options=options)
            try:
                r = pb_grpc.RetrieverStub(ch).Retrieve(pb.RetrieveRequest(query=QUERY, top_k=5), timeout=DEADLINE_S)
                got = [p.doc_id for p in r.passages]
                tally.add(name, "ok" if got == expected else "bad", f"answer {got}")
            except grpc.RpcError as e:
                code = e.code()
                tally.add(name, "unavailable" if code == grpc.StatusCode.UNAVAILABLE else "bad",
                          f"{code.name}: {e.details()}")
            if fresh:
                ch.close()
                ch = None
    finally:
        if ch is not None:
            ch.close()


def _http_caller(name: str, url: str, expected: list[str], fresh: bool, stop: threading.Event,
                 tally: _Tally) -> None:
    """POST /v1/retrieve in a loop on one keep-alive connection, or (``fresh``) a new one each call: 200 with the
    library's answer, 503, or a connection error; a timeout (a hang) or any other status is a failure."""
    client = None
    try:
        while not stop.is_set():
            if client is None:
                client = httpx.Client(timeout=DEADLINE_S)
            try:
                r = client.post(url + "/v1/retrieve", json={"query": QUERY, "top_k": 5})
                if r.status_code == 200:
                    got = [p["doc_id"] for p in r.json()["passages"]]
                    tally.add(name, "ok" if got == expected else "bad", f"answer {got}")
                else:
                    tally.add(name, "unavailable" if r.status_code == 503 else "bad",
                              f"HTTP {r.status_code}: {r.text[:200]}")
            except httpx.TimeoutException as e:
                tally.add(name, "bad", f"timeout (a hang): {e!r}")
            except httpx.TransportError as e:  # the connection went with the process
                tally.add(name, "unavailable", f"connection error {type(e).__name__}")
            if fresh:
                client.close()
                client = None
    finally:
        if client is not None:
            client.close()


DEADLINE_S = 30.0


@pytest.mark.slow  # ~10 s: two server processes under load, one killed and restarted
def test_kill_9_of_one_worker_under_load_ends_every_call_cleanly(sample_index_dir, pipeline, record_property):
    """``serve --processes 2 --http-port 0`` under gRPC and HTTP callers (long-lived and fresh connections); one
    worker is killed with SIGKILL. Every call ends with the library's answer or a clean refusal (UNAVAILABLE; a
    connection error or 503 over HTTP): none reaches its deadline, none is INTERNAL/UNKNOWN/500. The supervisor
    restarts the worker, which listens only once loaded (no call is refused as "not loaded yet"), after which every
    caller is served again and the new worker takes its share. Then the supervisor itself is killed with SIGKILL:
    both workers end with it (they used to live on, orphaned, still serving on the port)."""
    t0 = time.monotonic()
    sp = ServeProcess(["--index", str(sample_index_dir), "--processes", "2", "--http-port", "0"], env=NO_LLM)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    workers: list[int] = []
    try:
        _wait_for(sp, r"worker \d .*serving .* on port", 2)
        head = re.search(r"HTTP on ([\d.]+:\d+) .*pids (\d+), (\d+)", sp.text())
        assert head, sp.text()
        http_url, pids = f"http://{head.group(1)}", [int(head.group(2)), int(head.group(3))]
        expected = [pipeline.index.documents[d].id for d in pipeline.search(QUERY, 5).hits.doc]
        tally = _Tally()
        callers = {"grpc-long-0": (_grpc_caller, sp.target, False), "grpc-long-1": (_grpc_caller, sp.target, False),
                   "grpc-fresh-0": (_grpc_caller, sp.target, True), "grpc-fresh-1": (_grpc_caller, sp.target, True),
                   "http-long": (_http_caller, http_url, False), "http-fresh": (_http_caller, http_url, True)}
        for name, (fn, where, fresh) in callers.items():
            threads.append(threading.Thread(target=fn, args=(name, where, expected, fresh, stop, tally), daemon=True,
                                            name=name))
            threads[-1].start()
        time.sleep(2.0)
        assert not tally.bad and tally.ok, (tally.bad, tally.calls)
        victim = re.search(r"worker 0 .*metrics on (\S+/metrics)", sp.text())
        assert victim and _served("http://" + victim.group(1)) + _served("http://" + victim.group(1), "http") > 0
        before = tally.calls

        os.kill(pids[0], signal.SIGKILL)
        t_kill = time.monotonic()
        kills = 1
        _wait_for(sp, rf"worker 0 \(pid {pids[0]}\) exited with code -9: restarting it", 1, timeout=30)
        _wait_for(sp, r"worker \d .*serving .* on port", 3, timeout=90)  # the new worker, loaded under load
        new_metrics = "http://" + _wait_for(sp, r"metrics on (\S+/metrics)", 3)[2].group(1)
        with tally.lock:
            ok_at_restart = dict(tally.ok_by_caller)
        # after the restart: every caller is served again, and the new worker takes connections
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with tally.lock:
                again = all(tally.ok_by_caller.get(n, 0) > ok_at_restart.get(n, 0) + 2 for n in callers)
            if again and _served(new_metrics) + _served(new_metrics, "http") > 0:
                break
            time.sleep(0.2)
        new_served = _served(new_metrics) + _served(new_metrics, "http")
        stop.set()
        for t in threads:
            t.join(DEADLINE_S + 5)
        hung = [t.name for t in threads if t.is_alive()]
        with tally.lock:
            summary = (f"kill -9 of one of 2 workers under load: {kills} worker kill, {tally.calls} calls "
                       f"({tally.calls - before} from the kill on), {tally.ok} OK, {tally.unavailable} unavailable, "
                       f"{len(tally.bad)} bad; the new worker served {new_served:.0f}; OK per caller "
                       f"{tally.ok_by_caller}; {time.monotonic() - t0:.1f} s")
            refusals = [f"  {n} x {k} ({tally.when[k][0] - t_kill:+.2f} to {tally.when[k][1] - t_kill:+.2f} s after "
                        "the kill)" for k, n in tally.reasons.items()]
            print("\n" + "\n".join([summary, *refusals]))
            record_property("kills", kills)
            record_property("calls", tally.calls)
            record_property("ok", tally.ok)
            record_property("unavailable", tally.unavailable)
            assert not hung, (hung, summary)
            assert not tally.bad, (tally.bad[:10], summary)
            assert again, ("a caller was not served again after the restart", ok_at_restart, summary)
            assert new_served > 0, summary
            # the new worker listens only once loaded: no call that reached it was refused as not ready
            assert not [k for k in tally.reasons if "not loaded yet" in k], refusals
        # the supervisor killed too: its workers (the survivor and the restarted one) end with it
        workers = _workers(sp.pid)
        assert len(workers) == 2, workers
        sp.kill()
        t_sup = time.monotonic()
        deadline = t_sup + 30
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(workers), f"workers {_alive(workers)} outlived their supervisor (kill -9)"
        print(f"then kill -9 of the supervisor: its 2 workers ended {time.monotonic() - t_sup:.1f} s later")
        record_property("supervisor_kills", 1)
    finally:
        stop.set()
        sp.kill()
        for pid in _alive(workers):  # never leave a worker serving (and holding this test's pipe)
            os.kill(pid, signal.SIGKILL)


def _workers(supervisor: int) -> list[int]:
    """The supervisor's worker processes (its children that run multiprocessing's spawn_main)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == supervisor and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie waiting to be reaped has ended)."""
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            continue
    return out

