"""The build's batches on a Ray cluster (``hybridrag build --ray ADDRESS``): the only module that imports Ray.

What runs where:

- **The driver** (the ``hybridrag build`` process) reads the corpus as a stream, in order (the document order
  defines the snapshot, so a Ray build and a local build of one corpus make the same snapshot), writes the
  documents, keeps the BM25 postings and looks each chunk key up in the sources (:mod:`index_builder.build.encodings`),
  as a local build does; then it assembles the snapshot from the segments, block by block, and builds the dense
  index. It never holds the model output: it sees keys and segment names.
- **Prepare tasks** (``@ray.remote`` functions) chunk, key and analyse each batch of 512 documents
  (:class:`index_builder.build.builder.Preparer`), a window of them ahead of the driver, their results taken in order.
- **Encoder actors** (``[build.ray] actors``, each with ``actor_cpus`` CPUs or ``actor_gpus`` GPUs) load the
  models once and encode the batches of new passages (``[build] embed_batch`` at a time: the same batches a local
  build makes), writing each as a checkpoint segment under the index root's ``.build-work`` folder, named by a
  hash of its keys (a retried batch writes the same segment). The folder must be one every node sees (the same
  machine, or a shared filesystem).

Faults: actors are restarted by Ray (``max_restarts=-1``) and their calls retried (``max_task_retries=-1``), so a
worker killed mid-batch (kill -9) costs that batch again; a call that still fails is resubmitted to another actor
(``RESUBMITS`` times). A node that leaves the cluster takes its actors with it, and Ray would wait for room to
restart them; so while no batch completes the driver checks the nodes every ``NODE_CHECK_S`` seconds and retires the
actors of a node that is gone, their batches going to the others. A driver that dies leaves the segments written
so far: the next build into the same root (local or Ray) embeds only the rest, and the previous generation serves
meanwhile (``CURRENT`` moves last).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.build.encodings import BuildWork, Source, load_segment, segment_name, write_segment
from index_builder.build.workers import Prepared, Preparer, encode_passages, identity_of, store_groups
from index_builder.errors import SnapshotError
from index_builder.settings import BuildConfig
from index_builder.types import Document

log = logging.getLogger(__name__)

RESUBMITS = 3  # a batch whose call fails after Ray's own retries goes to another actor this many times
NODE_CHECK_S = 5.0  # while no batch completes, the cluster's nodes are checked this often


LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": this machine only, node address 127.0.0.1
LOCAL_START_S = 180.0  # the local cluster's start, at most (a cold start on 2 busy cores takes 5-10 s)
LOCAL_STOP_S = 2.0  # a Ray process that has not left this long after SIGTERM gets SIGKILL (the GCS takes ~10 s)


def connect(address: str) -> bool:
    """Join (``auto``, ``ray://...``, ``HOST:PORT``) or start (``local``) a cluster; True when this call started
    Ray in this process (end it with :func:`disconnect`, which also stops a local cluster)."""
    imported = "ray" in sys.modules
    cluster = None
    if address == "local" and not (imported and sys.modules["ray"].is_initialized()):
        cluster = LocalCluster.start()
        # Read by Ray when it is imported: the switch keeps 127.0.0.1 as the GCS address (else ray.init rewrites it
        # to the machine's address, where the cluster does not listen); the token is the cluster's own.
        cluster.saved = {k: os.environ.get(k) for k in (LOOPBACK_SWITCH, *cluster.env)}
        os.environ.update({LOOPBACK_SWITCH: "0", **cluster.env})
    import ray

    if cluster is not None and imported:  # Ray was imported before this call: it read the environment then
        from ray._private import ray_constants
        from ray._raylet import Config  # type: ignore[attr-defined]  # (Ray itself imports it so)

        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    # the workers import this package as the driver does
    root = str(Path(__file__).resolve().parents[2])  # the repository root, above index_builder/
    kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}}
    ray.init(address=address if cluster is None else cluster.address, **kwargs)
    return True


def disconnect(started: bool) -> None:
    """Leave the cluster if :func:`connect` joined it, and stop the local cluster this process started."""
    if started:
        import ray

        ray.shutdown()
    if LocalCluster.current is not None:
        LocalCluster.current.stop()


class LocalCluster:
    """The cluster of ``--ray local``: one Ray node on this machine, for this build only.

    Why not ``ray.init()``: a cluster it starts binds every service on all interfaces (the GCS, the raylet, each
    worker's gRPC port: ``*``; the runtime-env agent on the machine's address; the autoscaler's Prometheus metrics
    on 0.0.0.0:44217, which answer without Ray's token), and when the driver is killed Ray's reaper ends the GCS and
    the raylet but two agents (the dashboard and runtime-env agents, the raylet's children) live on until their
    own check notices, 30-60 s. So:

    - **Loopback only.** ``ray start --head --node-ip-address 127.0.0.1`` with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
      (Ray's switch for "this machine only": without it Ray replaces a loopback node address with the machine's
      own). Ray's servers bind 127.0.0.1 when the node's address is 127.0.0.1, the driver's too (it reaches the GCS
      over loopback); Ray's client server gets a free port (its default, 10001, would be shared by two builds). No
      dashboard, no autoscaler monitor (``--no-monitor``: its metrics were the port without a token), no log
      monitor.
    - **A token of its own**: ``RAY_AUTH_MODE=token`` with a fresh token in the cluster's temporary folder (0600),
      which the driver presents; nothing falls back to ``~/.ray/auth_token``.
    - **Gone when the build ends, killed or not.** The cluster is started by a watchdog (:func:`_watchdog`), a
      small process in a session of its own whose stdin is a pipe from the driver. Every Ray process it starts
      stays in that session (Ray changes process groups but never sessions). When the pipe closes (the driver
      stopped the cluster, exited, or was killed with SIGKILL: the kernel closes its end), the watchdog sends
      SIGTERM to every process of the session, SIGKILL to what is left after :data:`LOCAL_STOP_S`, removes the
      temporary folder and exits. Ctrl-C in a terminal reaches the driver only (another session), which then exits.
    """

    current: LocalCluster | None = None

    def __init__(self, proc: subprocess.Popen, folder: Path, address: str) -> None:
        self.proc, self.folder, self.address = proc, folder, address
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder / "token")}
        self.saved: dict[str, str | None] = {}  # the driver's environment before connect() set the cluster's

    @classmethod
    def start(cls) -> LocalCluster:
        if cls.current is not None:
            cls.current.stop()
        folder = Path(tempfile.mkdtemp(prefix="hr-ray-", dir="/tmp"))  # short: Ray's socket paths fit 107 bytes
        fd = os.open(folder / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        ports = []
        for _ in range(2):  # the GCS and Ray's client server (whose default, 10001, a second build would share)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(str(s.getsockname()[1]))
        root = str(Path(__file__).resolve().parents[2])  # the repository root, above index_builder/
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
        proc = subprocess.Popen([sys.executable, "-c", "from index_builder.build.ray_build import _watchdog; _watchdog()",
                                 str(folder), *ports], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=root, env=env, start_new_session=True)
        cluster = cls(proc, folder, f"127.0.0.1:{ports[0]}")
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], LOCAL_START_S)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if not line.startswith("ready"):
            cluster.stop()
            why = line.removeprefix("error ") or f"no answer within {LOCAL_START_S:.0f} s"
            raise SnapshotError(f"the local Ray cluster did not start: {why}")
        log.info("local Ray cluster at %s (loopback only; its processes in session %d, folder %s)", cluster.address,
                 proc.pid, folder)
        cls.current = cluster
        atexit.register(cluster.stop)
        return cluster

    def stop(self) -> None:
        """Close the watchdog's pipe and wait for it: when this returns, no process of the cluster is left."""
        if LocalCluster.current is self:
            LocalCluster.current = None
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2 * LOCAL_STOP_S + 10)
        except subprocess.TimeoutExpired:
            log.warning("the local Ray cluster's watchdog (pid %d) did not finish stopping it", self.proc.pid)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.saved = {}


def _session_pids(sid: int, but: int) -> list[int]:
    """The live processes of session ``sid`` but ``but`` (Linux: /proc; a zombie has ended, only its parent can
    reap it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != but:
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != b"Z":
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def _watchdog() -> None:
    """The local cluster's watchdog (see :class:`LocalCluster`); ``argv``: the folder, the GCS and client server
    ports. Prints ``ready`` or ``error MESSAGE`` once, then waits for its stdin to close and ends every process of
    its session."""
    folder, port, client_port = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    me = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = {**os.environ, LOOPBACK_SWITCH: "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(folder / "token"), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address", "127.0.0.1",
           "--port", port, "--ray-client-server-port", client_port, "--include-dashboard=false",
           "--include-log-monitor=false", "--no-monitor", "--disable-usage-stats", "--temp-dir", str(folder / "r")]
    try:
        with open(folder / "start.log", "wb") as out:
            code = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=LOCAL_START_S).returncode
        if code == 0:
            answer = "ready"
        else:
            tail = (folder / "start.log").read_text(errors="replace").strip().splitlines()[-3:]
            answer = f"error ray start exited {code}: {' / '.join(tail)[-500:]}"
    except (OSError, subprocess.SubprocessError) as e:
        answer = f"error {type(e).__name__}: {e}"
    with contextlib.suppress(OSError):  # a driver that died meanwhile: nothing to tell, the cluster still ends
        print(answer, flush=True)
    try:
        while sys.stdin.buffer.read(65536):  # until the driver closes the pipe or dies
            pass
    except OSError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline, sig = time.monotonic() + LOCAL_STOP_S, signal.SIGTERM
    while (pids := _session_pids(me, me)) and time.monotonic() < deadline + LOCAL_STOP_S:
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)


class _Encoder:
    """One encoder actor: the models loaded once, each batch encoded and written as a segment."""

    def __init__(self, config: BuildConfig, threads: int) -> None:
        from index_builder.models.encoders import Embedder
        from index_builder.models.token_encoders import make_token_encoder

        runtime = dataclasses.replace(config.embedder.runtime, intra_op_threads=threads)
        self.embedder = Embedder(dataclasses.replace(config.embedder, runtime=runtime))
        self.token_encoder = None
        if config.token_vectors:
            tc = dataclasses.replace(config.token_encoder, runtime=dataclasses.replace(
                config.token_encoder.runtime, intra_op_threads=threads))
            self.token_encoder = make_token_encoder(tc, self.embedder)
        self.storage = config.token_encoder.storage
        self.encode_s = 0.0

    def identity(self) -> tuple[bytes, str, int]:
        """The encoders' identity (the driver checks it equals its own: the same model files), node id, pid."""
        import ray

        return identity_of(self.embedder, self.token_encoder), ray.get_runtime_context().get_node_id(), os.getpid()

    def encode(self, folder: str, keys: np.ndarray, passages: list[str]) -> tuple[str, float]:
        """Encode ``passages`` and write their segment under ``folder``; its name and the seconds it took."""
        t = time.perf_counter()
        name = segment_name(keys)
        if not (Path(folder) / name / "done").is_file():  # a retry after the segment was written
            vectors, store = encode_passages(self.embedder, self.token_encoder, self.storage, passages)
            write_segment(Path(folder), name, keys, vectors, None if store is None else store.vectors,
                          None if store is None else store.offsets, None if store is None else store.scales,
                          store_groups(store))
        return name, time.perf_counter() - t


def _prepare(preparer: Preparer, batch: list[Document]) -> Prepared:
    return preparer(batch)


class RayWorkers:
    """:class:`index_builder.build.builder.BuildWorkers` on a Ray cluster (see the module docstring)."""

    def __init__(self, address: str, config: BuildConfig, preparer: Preparer, identity: bytes, work: BuildWork,
                 dim: int) -> None:
        try:
            import ray
        except ImportError:
            raise SnapshotError("hybridrag build --ray needs Ray: pip install '.[ray]' (or setup.sh --ray)") from None
        self.ray = ray
        self.config, self.work, self.dim = config, work, dim
        self.storage = config.token_encoder.storage
        self.started = connect(address)
        rc = config.ray
        resources = ray.cluster_resources()
        n = rc.actors
        if n == 0:
            n = int(resources.get("GPU", 0) // rc.actor_gpus) if rc.actor_gpus > 0 \
                else int(resources.get("CPU", 1) // rc.actor_cpus)
        n = max(1, n)
        threads = max(1, int(rc.actor_cpus))
        actor = ray.remote(_Encoder).options(num_cpus=rc.actor_cpus, num_gpus=rc.actor_gpus, max_restarts=-1,
                                             max_task_retries=-1, max_concurrency=1)
        self.actors: list[Any] = [actor.remote(config, threads) for _ in range(n)]
        self._prepare = ray.remote(_prepare).options(num_cpus=rc.prepare_cpus, max_retries=3)
        self._preparer = ray.put(preparer)
        self.window = max(2, 2 * n)  # prepare tasks ahead of the driver
        self.cap = n * rc.in_flight  # encoder batches in flight
        self.pending: dict[Any, tuple[int, np.ndarray, list[str], int]] = {}  # ref -> actor, keys, passages, tries
        self.load = [0] * n
        self.encode_s = 0.0
        self.batches = 0
        self._done: list[tuple[np.ndarray, Source]] = []
        seen = ray.get([a.identity.remote() for a in self.actors])
        self.nodes = [node for _, node, _ in seen]
        self.retired: set[int] = set()
        for ident, node, pid in seen:
            if ident != identity:
                raise SnapshotError(f"an encoder actor on node {node} (pid {pid}) has other models than this driver "
                                    f"(identity {ident.hex()} against {identity.hex()}): install the same model "
                                    f"files on every node")
        nodes = collections.Counter(node for _, node, _ in seen)
        log.info("Ray build: %d encoder actors on %d nodes (pids %s), %s CPUs / %s GPUs in the cluster", n,
                 len(nodes), ",".join(str(pid) for _, _, pid in seen), resources.get("CPU", 0),
                 resources.get("GPU", 0))
        self.folder = str(work.folder)

    def prepared(self, batches: Iterable[list[Document]]) -> Iterator[tuple[list[Document], Prepared]]:
        ahead: collections.deque[tuple[list[Document], Any]] = collections.deque()
        for batch in batches:
            ahead.append((batch, self._prepare.remote(self._preparer, batch)))
            if len(ahead) >= self.window:
                done, ref = ahead.popleft()
                yield done, self.ray.get(ref)
        while ahead:
            done, ref = ahead.popleft()
            yield done, self.ray.get(ref)

    def _send(self, keys: np.ndarray, passages: list[str], tries: int) -> None:
        live = [i for i in range(len(self.actors)) if i not in self.retired]
        i = min(live, key=self.load.__getitem__)
        ref = self.actors[i].encode.remote(self.folder, keys, passages)
        self.pending[ref] = (i, keys, passages, tries)
        self.load[i] += 1

    def submit(self, keys: np.ndarray, passages: list[str]) -> None:
        while len(self.pending) >= self.cap:
            self._take(self._wait(1))
        self._send(keys, passages, 0)
        self.batches += 1

    def _wait(self, n: int, timeout: float | None = None) -> list[Any]:
        while True:
            ready, _ = self.ray.wait(list(self.pending), num_returns=min(n, len(self.pending)),
                                     timeout=NODE_CHECK_S if timeout is None else timeout)
            if ready or timeout is not None:
                return ready
            self._retire_lost_nodes()

    def _retire_lost_nodes(self) -> None:
        """Retire the actors of nodes no longer alive (their pending calls then fail and are resubmitted)."""
        alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        for i, node in enumerate(self.nodes):
            if i not in self.retired and node not in alive:
                log.warning("node %s left the cluster: its encoder actor is retired, its batches go to the others",
                            node)
                self.retired.add(i)
                self.ray.kill(self.actors[i], no_restart=True)
        if len(self.retired) == len(self.actors):
            raise SnapshotError("every encoder actor's node left the Ray cluster; the segments written so far are "
                                "kept: run the same build again to resume")

    def _take(self, ready: list[Any]) -> None:
        for ref in ready:
            i, keys, passages, tries = self.pending.pop(ref)
            self.load[i] -= 1
            try:
                name, seconds = self.ray.get(ref)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.RayTaskError) as e:
                if tries >= RESUBMITS:
                    raise SnapshotError(f"a batch of {len(keys)} passages failed {tries + 1} times on the Ray "
                                        f"cluster: {e}") from e
                log.warning("an encoder batch failed (%s); sent to another actor", type(e).__name__)
                self._send(keys, passages, tries + 1)
                continue
            self.encode_s += seconds
            self._done.append((keys, load_segment(Path(self.folder) / name)))

    def finished(self, wait: bool = False) -> list[tuple[np.ndarray, Source]]:
        if wait:
            while self.pending:
                self._take(self._wait(len(self.pending)))
        elif self.pending:
            self._take(self._wait(len(self.pending), timeout=0))
        done, self._done = self._done, []
        for _, seg in done:
            seg.storage = self.storage
        return done

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        disconnect(self.started)
