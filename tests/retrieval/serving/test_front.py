"""The shedding front (retrieval/serving/front.py): real nginx before a real ``hybridrag serve`` on loopback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pbg
from retrieval.serving.front import FrontConfig, FrontError, render, start_front, stop_front, write_config
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[3]
NGINX = shutil.which("nginx") or (Path("/usr/sbin/nginx").is_file() and "/usr/sbin/nginx") or None
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/setup.sh installs nginx-light)")


def test_bad_front_configuration_is_refused_with_what_is_wrong():
    with pytest.raises(ConfigError, match="'localhost' is not HOST:PORT"):
        FrontConfig(grpc_backends=("localhost",))
    with pytest.raises(ConfigError, match="at least one replica"):
        FrontConfig(grpc_backends=())
    with pytest.raises(ConfigError, match="http_backends is empty"):
        FrontConfig(http_port=8081)
    with pytest.raises(ConfigError, match="port must be in"):
        FrontConfig(port=0)
    with pytest.raises(ConfigError, match="max_in_flight"):
        FrontConfig(max_in_flight=0)


@needs_nginx
def test_the_rendered_configuration_is_accepted_by_nginx(tmp_path):
    """Both doors, several replicas: the text is valid nginx (``nginx -t``), with the limits and replicas given."""
    config = FrontConfig(grpc_backends=("127.0.0.1:50051", "127.0.0.1:50061"), http_backends=("127.0.0.1:8080",),
                         http_port=8081, max_in_flight=32, max_writes_in_flight=3, nginx=str(NGINX))
    conf = write_config(config, tmp_path).read_text()
    assert conf == render(config, tmp_path)
    # five budgeted locations (gRPC reads, writes; HTTP reads, writes, /v1/documents by method), each under both
    # zones, of which its budget's key alone is not empty
    assert conf.count("limit_conn hybridrag_reads 32;") == 5 and conf.count("limit_conn hybridrag_writes 3;") == 5
    assert "(Retrieve|Generate|ListDocuments)" in conf
    assert "server 127.0.0.1:50061;" in conf and "server 127.0.0.1:8080;" in conf
    with pytest.raises(FrontError, match="nginx not found"):
        write_config(FrontConfig(nginx="no-such-nginx-binary"), tmp_path / "x")


@needs_nginx
@pytest.mark.slow  # nginx before a spawned server with both doors, bursts through both
def test_the_front_passes_calls_through_and_refuses_past_its_limit(sample_index_dir, tmp_path):
    """``hybridrag front`` (the command, as deployed) before ``hybridrag serve`` with both doors, at 2 reads in
    flight: calls through the front answer as the server does; a burst's excess gets the front's own refusal
    (gRPC RESOURCE_EXHAUSTED, HTTP 429 with the service's JSON error), the server's own budget (64) untouched; a
    replica that is gone becomes UNAVAILABLE / 503; SIGTERM stops the front with exit code 0."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.helpers import ServeProcess

    server = ServeProcess(["--index", str(sample_index_dir), "--http-port", "0"], clean_env=True,
                          env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    (http_url,) = re.findall(r"HTTP on (http://\S+)", server.text())
    grpc_port, http_port = free_port(), free_port()
    front = subprocess.Popen(
        [sys.executable, "-m", "hybridrag", "front", "--grpc-backend", server.target,
         "--http-backend", http_url.removeprefix("http://").rstrip("/"), "--port", str(grpc_port),
         "--http-port", str(http_port), "--max-in-flight", "2"],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "HYBRIDRAG_FRONT__NGINX": str(NGINX)})
    assert front.stderr is not None
    line = front.stderr.readline()
    assert "hybridrag front (nginx" in line and "2 reads" in line, line
    front_url = f"http://127.0.0.1:{http_port}"
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    direct = grpc.insecure_channel(server.target)
    try:
        stub, direct_stub = pbg.RetrieverStub(channel), pbg.RetrieverStub(direct)
        request = pb.RetrieveRequest(query="how do bees share where flowers are", top_k=5, bypass_cache=True)
        via, own = stub.Retrieve(request, timeout=60), direct_stub.Retrieve(request, timeout=60)
        assert [p.doc_id for p in via.passages] == [p.doc_id for p in own.passages] and via.passages
        assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert stub.GetIndexStatus(pb.GetIndexStatusRequest(), timeout=10).documents > 0

        calls = [stub.Retrieve.future(pb.RetrieveRequest(query=f"bees and flowers {i}", top_k=5, bypass_cache=True),
                                      timeout=60) for i in range(24)]
        codes: dict[str, int] = {}
        for call in calls:
            try:
                call.result()
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert e.details() == "overloaded: 2 requests in flight at the front (max 2)"
        assert codes.get("OK", 0) >= 2 and codes.get("RESOURCE_EXHAUSTED", 0) >= 1, codes

        body = {"query": "how do bees share where flowers are", "top_k": 5, "bypass_cache": True}
        r = httpx.post(front_url + "/v1/retrieve", json=body, timeout=60)
        assert r.status_code == 200
        assert [p["doc_id"] for p in r.json()["passages"]] == [p.doc_id for p in own.passages]
        assert httpx.get(front_url + "/readyz", timeout=10).status_code == 200

        def post(i: int) -> httpx.Response:
            return httpx.post(front_url + "/v1/retrieve", json={**body, "query": f"bees {i}"}, timeout=60)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, range(32)))
        refused = [a for a in answers if a.status_code == 429]
        assert refused and all(a.status_code in (200, 429) for a in answers), [a.status_code for a in answers]
        assert refused[0].headers["retry-after"] == "1"
        assert refused[0].json()["error"] == {"code": 429, "status": "RESOURCE_EXHAUSTED", "type": "rate_limit_error",
                                              "message": "overloaded: 2 requests in flight at the front (max 2)"}

        assert server.stop() == 0  # the replica goes away: the front says so
        with pytest.raises(grpc.RpcError) as gone:
            stub.Retrieve(request, timeout=10)
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
        assert gone.value.details() == "no hybridrag replica answered the front"
        r = httpx.post(front_url + "/v1/retrieve", json=body, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["status"] == "UNAVAILABLE"
    finally:
        channel.close()
        direct.close()
        server.kill()
        front.send_signal(signal.SIGTERM)
        try:
            code = front.wait(timeout=20)
        except subprocess.TimeoutExpired:
            front.kill()
            front.wait()
            raise
        assert code == 0


@needs_nginx
def test_start_front_reports_a_taken_port(tmp_path):
    """A port another process holds: nginx cannot bind it, and the error says why (not a hang)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = FrontConfig(port=taken.getsockname()[1], nginx=str(NGINX))
        t0 = time.monotonic()
        with pytest.raises(FrontError, match="Address already in use|exited"):
            proc = start_front(config, tmp_path)
            stop_front(proc)
        assert time.monotonic() - t0 < 10


def _closed_within(s: socket.socket, wait: float) -> bytes | None:
    """What the peer sent before it closed the connection, or None if it is still open after ``wait`` seconds."""
    s.settimeout(wait)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
        return got
    except TimeoutError:
        return None
    except ConnectionResetError:
        return got


@needs_nginx
def test_the_front_cuts_off_slow_clients_and_serves_others(pipeline, tmp_path):
    """nginx's own timeouts (``[front] header_timeout_s`` ...), 1 s here: connections that send nothing, half a
    request line, or a trickled body are closed on both doors while normal calls pass through; an idle keep-alive
    connection is closed after keepalive_timeout_s."""
    from retrieval.config import ServerConfig
    from retrieval.serving.server import BackgroundServer
    from retrieval.serving.settings import HttpConfig

    with BackgroundServer(pipeline, ServerConfig(port=0), http=HttpConfig(port=0)) as server:
        grpc_port, http_port = free_port(), free_port()
        config = FrontConfig(grpc_backends=(server.target,), http_backends=(server.http_url.removeprefix("http://"),),
                             port=grpc_port, http_port=http_port, nginx=str(NGINX), header_timeout_s=1,
                             body_timeout_s=1, keepalive_timeout_s=2)
        proc = start_front(config, tmp_path)
        try:
            def connect(port: int) -> socket.socket:
                return socket.create_connection(("127.0.0.1", port), timeout=10)

            idle = [connect(http_port) for _ in range(20)] + [connect(grpc_port) for _ in range(20)]
            half = [connect(http_port) for _ in range(20)]
            for s in half:
                s.sendall(b"POST /v1/retrieve HT")
            trickle = [connect(http_port) for _ in range(20)]
            for s in trickle:
                s.sendall(b"POST /v1/retrieve HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                          b"content-length: 100000\r\n\r\n{")
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                r = pbg.RetrieverStub(channel).Retrieve(pb.RetrieveRequest(query="bees", top_k=3), timeout=30)
                assert r.passages
            assert httpx.post(f"http://127.0.0.1:{http_port}/v1/retrieve", json={"query": "bees", "top_k": 3},
                              timeout=30).status_code == 200
            t0 = time.monotonic()
            results = [_closed_within(s, 6) for s in idle + half + trickle]
            assert all(g is not None for g in results), f"{sum(g is None for g in results)} of 100 still open"
            assert time.monotonic() - t0 < 8
            keep = connect(http_port)
            keep.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            t1 = time.monotonic()
            assert (_closed_within(keep, 10) or b"").startswith(b"HTTP/1.1 200")
            assert 1.5 < time.monotonic() - t1 < 6  # keepalive_timeout_s = 2
            for s in idle + half + trickle + [keep]:
                s.close()
        finally:
            stop_front(proc)


def _hold(port: int, path: str) -> socket.socket:
    """A call that stays in flight at the front: its headers sent, its body (1,000 bytes declared) not. nginx has
    counted it against the path's budget, and keeps it counted until the body arrives or ``body_timeout_s``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              "content-length: 1000\r\n\r\n{".encode())
    return s


@needs_nginx
@pytest.mark.slow  # nginx before a spawned server with a store, each slot held in turn
def test_listing_is_a_read_at_the_front_on_both_doors(writable, tmp_path):
    """issue 51 item 7: through the front, listing (``GET /v1/documents``, gRPC ``ListDocuments``) is a read. With
    the one write slot taken, both doors still list (it used to be refused over HTTP: two listing loops made 89% of
    another tenant's upserts 429); with the one read slot taken, both doors refuse a listing with the read refusal
    (gRPC did not count it at all)."""
    from tests.helpers import ServeProcess

    server = ServeProcess(["--index", str(writable / "index"), "--store", str(writable / "store.db"),
                           "--http-port", "0"], clean_env=True, env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    (http_url,) = re.findall(r"HTTP on (http://\S+)", server.text())
    grpc_port, http_port = free_port(), free_port()
    config = FrontConfig(grpc_backends=(server.target,), http_backends=(http_url.removeprefix("http://").rstrip("/"),),
                         port=grpc_port, http_port=http_port, max_in_flight=1, max_writes_in_flight=1,
                         nginx=str(NGINX))
    proc = start_front(config, tmp_path / "front")
    url = f"http://127.0.0.1:{http_port}"
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pbg.RetrieverStub(channel)
    upsert = {"documents": [{"id": "front-write", "text": "bees dance to tell where the flowers are"}]}
    read_refusal = "overloaded: 1 requests in flight at the front (max 1)"
    write_refusal = "overloaded: 1 writes in flight at the front (max 1)"

    def held(path: str, probe) -> socket.socket:
        """Take the budget of ``path``; return once the front refuses ``probe`` (the slot is counted)."""
        s = _hold(http_port, path)
        deadline = time.monotonic() + 10
        while probe().status_code != 429:
            assert time.monotonic() < deadline, f"the front never counted the call held on {path}"
            time.sleep(0.05)
        return s

    try:
        assert httpx.get(url + "/v1/documents?limit=3", timeout=30).status_code == 200
        assert stub.ListDocuments(pb.ListDocumentsRequest(limit=3), timeout=30).documents

        hold = held("/v1/documents", lambda: httpx.post(url + "/v1/documents", json=upsert, timeout=30))
        try:
            refused = httpx.post(url + "/v1/documents", json=upsert, timeout=30)
            assert refused.json()["error"]["message"] == write_refusal
            listed = httpx.get(url + "/v1/documents?limit=3", timeout=30)
            assert listed.status_code == 200, listed.text
            assert listed.json()["documents"]
            assert stub.ListDocuments(pb.ListDocumentsRequest(limit=3), timeout=30).documents
        finally:
            hold.close()

        hold = held("/v1/retrieve", lambda: httpx.post(url + "/v1/retrieve", json={"query": "bees"}, timeout=30))
        try:
            listed = httpx.get(url + "/v1/documents?limit=3", timeout=30)
            assert listed.status_code == 429 and listed.json()["error"]["message"] == read_refusal, listed.text
            with pytest.raises(grpc.RpcError) as e:
                stub.ListDocuments(pb.ListDocumentsRequest(limit=3), timeout=30)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.details() == read_refusal
            # writes keep their own budget: an upsert passes while the read slot is taken
            assert httpx.post(url + "/v1/documents", json=upsert, timeout=60).status_code == 200
        finally:
            hold.close()
        deadline = time.monotonic() + 10  # the held call ends (its connection closed): listing passes again
        while httpx.get(url + "/v1/documents?limit=3", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        channel.close()
        stop_front(proc)
        server.stop()
