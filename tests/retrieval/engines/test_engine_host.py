"""``hybridrag engine`` (retrieval/engines/qdrant/host.py), the development Qdrant host, as a real process on
loopback: what a web page or a slow client can do to it (issue 51 item 10). qdrant-client's remote path must keep
working through every check (the replica and bench tests use it for the rest)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
# What a page of another site can send without a preflight: fetch(url, {method, body, mode: "no-cors"}).
PAGE = {"origin": "http://evil.example", "content-type": "text/plain;charset=UTF-8", "sec-fetch-site": "cross-site",
        "sec-fetch-mode": "no-cors"}


class Host:
    def __init__(self, proc: subprocess.Popen, url: str, banner: str) -> None:
        self.proc, self.url, self.banner = proc, url, banner

    def threads(self) -> int:
        """The host's threads now (Linux: /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads: line")


@contextmanager
def engine_host(*args: str, host: str = "127.0.0.1") -> Iterator[Host]:
    """``hybridrag engine --location :memory: --port 0 ARGS``, once it has printed where it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "hybridrag", "engine", "--location", ":memory:", "--host", host,
                             "--port", "0", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    banner = ""
    try:
        for line in proc.stdout:
            banner += line
            if m := re.search(r"engine host listening on http://\S+:(\d+)", line):
                break
        else:
            raise AssertionError(f"the engine host exited ({proc.wait()}):\n{banner}")
        yield Host(proc, f"http://127.0.0.1:{m.group(1)}", banner)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _seed(url: str):
    from qdrant_client import QdrantClient, models

    client = QdrantClient(url=url, check_compatibility=False, timeout=30)
    client.create_collection("col", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE))
    client.upsert("col", [models.PointStruct(id=i, vector=[1.0, float(i)], payload={"n": i}) for i in range(5)])
    return client


def _ids(client) -> list[int]:
    return sorted(int(p.id) for p in client.scroll("col", limit=100)[0])


def test_a_page_of_another_origin_cannot_write_and_foreign_hosts_are_refused():
    """Before: a cross-origin ``no-cors`` write planted a point and deleted 3 of 5 (200 each), ``Host: evil.example``
    was answered. Now 403 for both (another origin, a foreign Host), 415 for a write that is not JSON, and the
    collection is untouched; qdrant-client's own calls pass."""
    with engine_host() as host:
        client = _seed(host.url)
        plant = httpx.put(host.url + "/collections/col/points",
                          content=json.dumps({"points": [{"id": 99, "vector": [0.5, 0.5]}]}), headers=PAGE)
        delete = httpx.post(host.url + "/collections/col/points/delete", content=json.dumps({"points": [0, 1, 2]}),
                            headers=PAGE)
        assert (plant.status_code, delete.status_code) == (403, 403), (plant.text, delete.text)
        assert "origin 'http://evil.example' are not allowed" in plant.json()["status"]["error"]
        # the same write as JSON from another origin (a page would need a preflight, which is never granted)
        assert httpx.put(host.url + "/collections/col/points", json={"points": [{"id": 98, "vector": [0.5, 0.5]}]},
                         headers={"origin": "http://evil.example"}).status_code == 403
        options = httpx.options(host.url + "/collections/col/points", headers={
            "origin": "http://evil.example", "access-control-request-method": "PUT"})
        assert options.status_code == 403 and "access-control-allow-origin" not in options.headers
        # no Origin but the browser's own mark of a cross-site request
        assert httpx.post(host.url + "/collections/col/points/delete", json={"points": [3]},
                          headers={"sec-fetch-site": "cross-site"}).status_code == 403
        # a body that is not said to be JSON (an HTML form's types), from anyone
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"content-type": ctype} if ctype else {}
            r = httpx.post(host.url + "/collections/col/points/delete", content=b'{"points": [4]}', headers=headers)
            assert r.status_code == 415, (ctype, r.status_code, r.text)
        # DNS rebinding: a name that resolves to 127.0.0.1 is still not a loopback name
        for name in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", ""):
            r = httpx.get(host.url + "/collections/col", headers={"host": name})
            assert r.status_code == 403, (name, r.status_code)
        assert httpx.get(host.url.replace("127.0.0.1", "localhost") + "/collections/col").status_code == 200
        assert _ids(client) == [0, 1, 2, 3, 4]
        client.delete("col", points_selector=[4])
        assert _ids(client) == [0, 1, 2, 3]
        answer = httpx.get(host.url + "/collections/col")
        assert answer.headers["x-content-type-options"] == "nosniff" and answer.json()["status"] == "ok"


def _open_within(sockets: list[socket.socket], wait: float) -> int:
    """How many of ``sockets`` the host has not closed after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    open_ = list(sockets)
    while open_ and time.monotonic() < deadline:
        still = []
        for s in open_:
            s.settimeout(0)
            try:
                if s.recv(65536):
                    still.append(s)  # an answer (408) before the close
            except BlockingIOError:
                still.append(s)
            except OSError:
                pass
        open_ = still
        time.sleep(0.1)
    return len(open_)


def test_silent_and_slow_connections_are_closed_and_hold_no_thread():
    """Before: 200 silent connections held 200 threads (202 in all) after 30 s. Now a connection holds no thread,
    one that has not sent its headers in ``--header-timeout-s`` (1 s here) is closed, one that trickles its body
    too; past ``--max-connections`` a request is answered 503 at once; the host serves throughout."""
    with engine_host("--header-timeout-s", "1", "--body-timeout-s", "1", "--max-connections", "64") as host:
        client = _seed(host.url)
        base = host.threads()
        silent = [socket.create_connection(("127.0.0.1", int(host.url.rsplit(":", 1)[1]))) for _ in range(200)]
        time.sleep(0.5)
        assert host.threads() <= base + 2, (base, host.threads())
        refused = httpx.get(host.url + "/healthz", timeout=10)
        assert refused.status_code == 503  # 200 connections open: past --max-connections
        assert _open_within(silent, 8) == 0
        assert _ids(client) == [0, 1, 2, 3, 4]
        port = int(host.url.rsplit(":", 1)[1])
        half = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        for s in half:
            s.sendall(b"PUT /collections/col/points HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        trickle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        for s in trickle:
            s.sendall(b"PUT /collections/col/points HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                      b"content-length: 100000\r\n\r\n{")
        assert _open_within(half + trickle, 8) == 0
        assert host.threads() <= base + 2
        assert _ids(client) == [0, 1, 2, 3, 4]
        for s in silent + half + trickle:
            s.close()


def test_a_body_past_the_limit_is_refused_unread():
    with engine_host("--max-body-mb", "1") as host:
        client = _seed(host.url)
        big = {"points": [{"id": i, "vector": [0.5, 0.5], "payload": {"pad": "x" * 1000}} for i in range(2000)]}
        r = httpx.put(host.url + "/collections/col/points", json=big, timeout=30)
        assert r.status_code == 413 and "at most 1048576" in r.json()["status"]["error"]
        assert _ids(client) == [0, 1, 2, 3, 4]


def test_bound_beyond_loopback_it_warns_and_answers_only_addresses_and_named_hosts():
    """``--host 0.0.0.0`` used to bind every interface without a word. Now it says so loudly (no authentication:
    anyone who reaches the port reads and writes every collection), and it answers a Host that is an IP address or
    a name given with ``--allowed-host`` only: a name of an attacker's site that resolves to this machine (DNS
    rebinding) is refused."""
    with engine_host("--allowed-host", "engine.internal", host="0.0.0.0") as host:
        assert "WARNING" in host.banner and "no authentication" in host.banner and "0.0.0.0" in host.banner
        _seed(host.url)
        assert httpx.get(host.url + "/collections/col").status_code == 200
        assert httpx.get(host.url + "/collections/col", headers={"host": "10.1.2.3:6333"}).status_code == 200
        assert httpx.get(host.url + "/collections/col", headers={"host": "engine.internal:6333"}).status_code == 200
        assert httpx.get(host.url + "/collections/col", headers={"host": "evil.example"}).status_code == 403
    with engine_host() as host:
        assert "WARNING" not in host.banner


@pytest.mark.parametrize("args", [["--max-connections", "0"], ["--header-timeout-s", "0"], ["--max-body-mb", "0"]])
def test_bad_limits_are_refused_in_one_line(args):
    out = subprocess.run([sys.executable, "-m", "hybridrag", "engine", "--location", ":memory:", "--port", "0", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
