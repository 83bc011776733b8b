"""Shared test helpers (imported as ``tests.helpers``): the repository's paths, and a real ``hybridrag serve``
process on free ports whose port is read from its log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from retrieval.generation.embedded import free_port  # the one free-port helper (tests and benches import it)

__all__ = ["CE_MODEL", "REPO", "SAMPLE", "SHARED", "SHARED_BEIR", "RedisServer", "ServeProcess", "free_port",
           "train_cross_encoder_cli"]

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
SHARED = REPO.parent / "shared"
SHARED_BEIR = SHARED / "data" / "beir"
CE_MODEL = SHARED / "models" / "ce-minilm-l6-beir-train"


class ServeProcess:
    """``python -m hybridrag serve ARGS --port PORT --metrics-port 0``; returns once it logs the port it serves on.
    Its stderr is drained on a thread into ``lines`` (a full pipe would block the server). ``env``: extra
    variables (``clean_env`` drops the caller's ``HYBRIDRAG_*`` first); ``port``: 0 = any free one (a restart on
    the same port passes the one it had)."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None, clean_env: bool = False,
                 port: int = 0) -> None:
        base = {k: v for k, v in os.environ.items() if not (clean_env and k.startswith("HYBRIDRAG_"))}
        self.proc = subprocess.Popen([sys.executable, "-m", "hybridrag", "serve", *args, "--port", str(port),
                                      "--metrics-port", "0"], stderr=subprocess.PIPE, text=True, errors="replace",
                                     env={**base, **(env or {})}, cwd=REPO)
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.port = 0
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if m := re.search(r"serving .* on port (\d+)", line):
                self.port = int(m.group(1))
                break
        if not self.port:
            self.proc.kill()
            raise AssertionError(f"serve exited ({self.proc.wait()}) before serving:\n{''.join(self.lines)}")
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        self.target = f"127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.lines[mark:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (graceful drain), then SIGKILL after ``timeout``; the exit code."""
        if self.alive():
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def wait_drained(self, timeout: float = 10) -> None:
        """After exit: the log thread has read everything."""
        self._drain.join(timeout)


class RedisServer:
    """Debian's ``redis-server`` on a free loopback port, no persistence, data in ``folder``; ``url`` once it
    answers PING. ``binary``: ``shutil.which("redis-server")`` (the callers skip when it is absent)."""

    def __init__(self, binary: str, folder: Path) -> None:
        import time

        import redis

        self.port = free_port()
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def train_cross_encoder_cli(out: Path, dataset: Path, index_dir: Path, *extra: str) -> tuple[dict, str]:
    """A real, tiny ``hybridrag train cross-encoder`` run (2 steps, dev evaluated, ONNX exported and checked):
    its train log and model card. Needs torch (the bench extra)."""
    import json

    from hybridrag.cli import main

    assert main(["train", "cross-encoder", "--dataset", str(dataset), "--index", str(index_dir), "--out", str(out),
                 "--max-steps", "2", "--eval-every", "1", "--groups-per-step", "2", "--max-length", "64",
                 "--mine-depth", "8", "--threads", "1", "--quiet", *extra]) == 0
    summary = json.loads(next(out.glob("*train_log.json")).read_text())
    return summary, (out / "README.md").read_text()
