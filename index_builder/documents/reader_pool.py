"""Reader processes: each file of a folder is read in a worker process with a time and a memory budget.

A folder holds files nobody checked; the readers are linear-time (:mod:`index_builder.documents.readers`), but a 64 MiB file
read in linear time can still take minutes, and a PDF can inflate a small file into gigabytes. One such file must
never stall or kill a build, a sync or a ``--watch`` round, so every file is read by a worker:
- a plain ``python -I -c`` child (a spawn, not a fork: the parent's model, index and threads are not copied),
  started when the first file needs reading and reused for the next ones; ``workers`` of them read in parallel;
- with an address-space limit (``RLIMIT_AS``, 2 GiB by default): an allocation past it raises ``MemoryError`` in
  the worker (the file is skipped, the worker goes on), and a worker that dies anyway is restarted;
- with a wall-clock budget per file (30 s by default): past it the worker is killed (``SIGKILL``), the file is
  skipped with the reason and a fresh worker reads the next file.
Requests and answers are JSON lines on the worker's stdin and stdout (nothing is unpickled from a process that
just parsed a hostile file). A process rather than a thread: a thread cannot be stopped, and memory cannot be
limited per thread.

The worker also opens the file (:func:`read_checked`): with ``O_NOFOLLOW`` on the resolved path the walk checked
(a last part swapped for a link fails to open), then it checks that the file it holds lies inside the folder, by
the path the kernel gives for the open descriptor (``/proc/self/fd/N``; elsewhere, the inode at a resolved path
under the root must be the one opened). A folder swapped for a link between the walk and the read is refused, not
read: the check is on what was opened, so no later swap can change it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from index_builder.documents.readers import MAX_TEXT_CHARS, READER_VERSION, SECTION_BREAK, Unreadable, read_file

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_WORKERS = 2
_START_S = 60.0  # a worker's start (an interpreter and its imports) may take this long on a loaded machine
_READ_AHEAD = 32  # files in flight per worker: bounds the answers held before they are yielded in order


def content_hash(data: bytes) -> str:
    """What a re-run compares: the bytes and the reader version (a reader change re-reads every file)."""
    return hashlib.sha256(READER_VERSION.encode() + b"\0" + data).hexdigest()[:32]


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or under it (both resolved).

    >>> inside("/srv/docs/a.md", "/srv/docs"), inside("/srv/docs2/a.md", "/srv/docs"), inside("/etc", "/")
    (True, False, True)
    """
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _opened_inside(fd: int, path: str, st: os.stat_result, root: str) -> bool:
    """Whether the open file lies under ``root``: by the path the kernel holds for it (Linux's /proc/self/fd, one
    call), else by a resolved path under ``root`` whose inode is the one opened."""
    try:
        return inside(os.readlink(f"/proc/self/fd/{fd}"), root)
    except OSError:
        pass
    real = os.path.realpath(path)
    try:
        same = os.stat(real)
    except OSError:
        return False
    return inside(real, root) and (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino)


def read_checked(path: str, name: str, *, root: str | None, max_bytes: int,
                 max_chars: int = MAX_TEXT_CHARS) -> dict[str, Any]:
    """Open, check and read one file; its text and facts as a JSON-able dict. :class:`Unreadable` with the reason.

    ``path``: the resolved path the walk checked; ``name``: the file's name in the folder (its suffix picks the
    reader); ``root``: the folder's resolved root when the file must lie inside it (None: links out allowed)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW: the checked path's last part is a link now
            raise Unreadable("became a symbolic link after the folder was listed") from None
        raise Unreadable(f"cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if root is not None and not _opened_inside(fd, path, st, root):
            raise Unreadable("changed into a path outside the folder after the folder was listed")
        if st.st_size > max_bytes:
            raise Unreadable(f"{st.st_size / 2**20:,.0f} MiB is over the {max_bytes / 2**20:g} MiB limit "
                             "(--max-file-mb)")
        if st.st_size == 0:
            raise Unreadable("empty file")
        data = f.read(st.st_size + 1)  # its size, not the limit: read(n) allocates n bytes first
    if len(data) != st.st_size:
        raise Unreadable("changed while it was read")
    extracted = read_file(Path(name), data)
    sections = [s for s in extracted.sections if s.strip()]
    text = SECTION_BREAK.join(sections)
    if not text.strip():
        raise Unreadable("no text in it")
    if len(text) > max_chars:
        raise Unreadable(f"{len(text):,} characters of text; a document holds at most {max_chars:,}")
    return {"title": extracted.title, "text": text, "encoding": extracted.encoding, "size": st.st_size,
            "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns, "hash": content_hash(data)}


def _answer(request: dict[str, Any], memory_mb: int) -> dict[str, Any]:
    try:
        return {"ok": read_checked(request["path"], request["name"], root=request["root"],
                                   max_bytes=request["max_bytes"], max_chars=request["max_chars"])}
    except Unreadable as e:
        return {"skip": str(e)}
    except MemoryError:
        return {"skip": f"reading it needs more than the reader's {memory_mb:,} MiB of memory"}
    except RecursionError:
        return {"skip": "nested too deeply to read"}
    except Exception as e:  # noqa: BLE001 - a reader's failure on one hostile file is that file's skip
        return {"skip": f"the reader failed: {type(e).__name__}: {str(e)[:160]}"}


def worker_main() -> None:
    """The worker's loop: a JSON request a line on stdin, a JSON answer a line on stdout, written as soon as it is
    ready (the parent times each file from the answer before it; an answer held back would be charged to the next
    file). Requests are read in blocks: the parent sends several at a time."""
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    cpu_s = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    try:
        import resource
    except ImportError:  # pragma: no cover - not a POSIX system: the parent's clock is the only bound
        resource = None  # type: ignore[assignment]
    if memory_mb and resource is not None:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends the workers itself
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    _write_all(fd_out, b'{"ready": true}\n')  # started: the parent's clock for the first file starts now
    pending, at = b"", 0
    while True:
        end = pending.find(b"\n", at)
        if end < 0:
            data = os.read(fd_in, 1 << 16)
            if not data:
                return
            pending, at = pending[at:] + data, 0
            continue
        line, at = pending[at:end], end + 1
        if cpu_s and resource is not None:  # a backstop should the parent die: no file spins on, orphaned
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft = int(used.ru_utime + used.ru_stime) + cpu_s
            resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))
        _write_all(fd_out, json.dumps(_answer(json.loads(line), memory_mb)).encode("ascii") + b"\n")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Job:
    """One file to read (``request``), or one already answered (``result`` set: a cache hit, a skip by name)."""

    key: Any
    request: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


@dataclass
class _Worker:
    proc: subprocess.Popen
    jobs: deque[Job] = field(default_factory=deque)  # sent, answered in this order
    started: float = 0.0  # when the first of ``jobs`` began: its answer is due by started + timeout
    chunks: list[bytes] = field(default_factory=list)
    ready: bool = False  # it said so once its imports were done (a slow start is not charged to a file)


class ReaderPool:
    """Worker processes reading files with a time and memory budget each; see the module docstring.

    A worker holds up to ``depth`` requests at once (it reads them in order): a request a round trip would cost
    two context switches a file, the most of a tiny file's time. The clock of a request starts when the worker
    answered the one before it."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB, depth: int = 16) -> None:
        if workers < 1:
            raise ValueError(f"reader workers must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"the per-file read timeout must be > 0 s, got {timeout_s}")
        if memory_mb and memory_mb < 256:
            raise ValueError(f"the reader memory limit must be >= 256 MiB (0 = none), got {memory_mb}")
        self.size, self.timeout_s, self.memory_mb, self.depth = workers, timeout_s, memory_mb, max(1, depth)
        self.workers: list[_Worker] = []
        self.selector = selectors.DefaultSelector()
        self.started = 0  # processes started (a restart after a kill counts)
        self.retry: deque[Job] = deque()  # sent to a worker that was stopped before it reached them

    # ------------------------------------------------------------------ processes

    def _spawn(self) -> _Worker:
        package_parent = str(Path(__file__).resolve().parents[2])  # the folder holding index_builder/
        code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
                "from index_builder.documents.reader_pool import worker_main; worker_main()")
        cpu_s = int(self.timeout_s * 2 + 10)  # CPU seconds a file may take if the parent is gone (SIGXCPU)
        proc = subprocess.Popen([sys.executable, "-I", "-c", code, str(self.memory_mb), str(cpu_s)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                close_fds=True)
        os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
        w = _Worker(proc, started=time.monotonic())
        self.selector.register(proc.stdout, selectors.EVENT_READ, w)  # type: ignore[arg-type]
        self.started += 1
        return w

    def _end(self, w: _Worker) -> int:
        """Kill and reap a worker; its exit status (negative: the signal)."""
        try:
            self.selector.unregister(w.proc.stdout)  # type: ignore[arg-type]
        except (KeyError, ValueError):
            pass
        if w.proc.poll() is None:
            w.proc.kill()
        for pipe in (w.proc.stdin, w.proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
        return w.proc.wait()

    def _stop(self, w: _Worker, reason: str) -> None:
        """End a worker: its current file is skipped with ``reason`` (``{status}``: how it ended), the files it had
        not reached go to another; a fresh worker takes its place."""
        code = self._end(w)
        if w.jobs:
            how = f"exit status {code}"
            if code < 0:
                try:
                    how = f"signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"signal {-code}"
            w.jobs.popleft().result = {"skip": reason.format(status=how)}
            self.retry.extendleft(reversed(w.jobs))
        self.workers.remove(w)

    def close(self) -> None:
        """End every worker (an idle one reads EOF and exits; a busy one is killed)."""
        for w in self.workers:
            if not w.jobs:
                try:
                    w.proc.stdin.close()  # type: ignore[union-attr]
                    w.proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._end(w)
        self.workers = []
        self.selector.close()

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _send(self, w: _Worker, jobs: list[Job]) -> None:
        data = b"".join(json.dumps(j.request).encode("ascii") + b"\n" for j in jobs)
        if not w.jobs and w.ready:
            w.started = time.monotonic()
        w.jobs.extend(jobs)
        try:
            w.proc.stdin.write(data)  # type: ignore[union-attr]
        except OSError:  # the worker died (killed from outside) before it read them
            self._stop(w, "the reader process ended ({status}) before reading it")

    def _receive(self, w: _Worker) -> None:
        """Read what the worker wrote: each answer completes its next job; EOF means it died."""
        while True:
            try:
                data = os.read(w.proc.stdout.fileno(), 1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                return
            if not data:
                self._stop(w, "the reader process ended ({status}) while reading it")
                return
            now = time.monotonic()
            w.chunks.append(data)
            if b"\n" not in data:
                w.started = max(w.started, now - self.timeout_s + 5.0)  # an answer on its way: time to send it
                continue
            lines = b"".join(w.chunks).split(b"\n")
            rest = lines.pop()  # after the last newline: the start of an answer still coming
            w.chunks = [rest] if rest else []
            for line in lines:
                if not w.ready:
                    w.ready = True
                elif w.jobs:
                    w.jobs.popleft().result = json.loads(line)
                w.started = now

    def _due(self, w: _Worker) -> float:
        return w.started + (self.timeout_s if w.ready else max(self.timeout_s, _START_S))

    def _expire(self, now: float) -> None:
        for w in list(self.workers):
            if w.jobs and now >= self._due(w):
                self._stop(w, f"reading it took over {self.timeout_s:g} s (the per-file budget); the reader was "
                              "stopped" if w.ready else "the reader process did not start")

    def run(self, jobs: Iterable[Job]) -> Iterator[Job]:
        """Every job back with its ``result``, in the order given; the requests are read in parallel."""
        it = iter(jobs)
        pending: deque[Job] = deque()
        queued: deque[Job] = deque()
        exhausted = False
        while True:
            while not exhausted and len(pending) < _READ_AHEAD * self.size:
                try:
                    job = next(it)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(job)
                if job.result is None:
                    queued.append(job)
            if self.retry:
                queued.extendleft(reversed(self.retry))
                self.retry.clear()
            while len(self.workers) < self.size and len(queued) > self.depth * len(self.workers):
                self.workers.append(self._spawn())
            for w in sorted(self.workers, key=lambda w: len(w.jobs)):
                room = self.depth - len(w.jobs)
                if queued and room > 0:
                    self._send(w, [queued.popleft() for _ in range(min(room, len(queued)))])
            yielded = False
            while pending and pending[0].result is not None:
                yield pending.popleft()
                yielded = True
            if not pending and exhausted:
                return
            if yielded or not pending or self.retry:
                continue  # refill and dispatch before waiting
            busy = [self._due(w) for w in self.workers if w.jobs]
            if not busy:
                continue
            wait = max(0.0, min(busy) - time.monotonic())
            for key, _ in self.selector.select(timeout=wait):
                if key.data in self.workers:
                    self._receive(key.data)
            self._expire(time.monotonic())


def read_request(path: Path, rel: str, *, root: str | None, max_bytes: int) -> dict[str, Any]:
    """The request a worker answers with :func:`read_checked`."""
    return {"path": str(path), "name": rel.rpartition("/")[2], "root": root, "max_bytes": max_bytes,
            "max_chars": MAX_TEXT_CHARS}


if __name__ == "__main__":  # pragma: no cover - the workers start through worker_main
    worker_main()
