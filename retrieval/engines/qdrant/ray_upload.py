"""A snapshot written into the Qdrant engine by Ray tasks in parallel (``hybridrag build --ray ADDRESS --config F``
with ``[backend] kind = "qdrant"`` and an engine server URL): the collection is created here, then each task opens
the same snapshot (memory-mapped; the index root must be visible to every node, as for the build's segments) and
upserts its range of chunks, ``[backend] upload_batch`` points a call. Point ids come from document ids and chunk
positions, so a task Ray retries after a worker dies writes the same points again (idempotent). A folder engine
(qdrant-client's local mode) is one process's: there the driver writes alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from index_builder.build.ray_build import connect, disconnect
from index_builder.snapshot.format import load_snapshot
from retrieval.engines.qdrant.engine import QdrantEngine
from retrieval.engines.settings import EngineConfig

TASK_BATCHES = 8  # a task upserts this many calls' worth of chunks (8 x [backend] upload_batch)


def _upload(snapshot: str, engine_config: EngineConfig, plan: dict[str, Any], start: int, stop: int) -> int:
    snap = load_snapshot(Path(snapshot), checksums=False)
    engine = QdrantEngine(engine_config)
    try:
        return engine.upload(snap, plan, start, stop)
    finally:
        engine.close()


def migrate_on_ray(index_dir: Path, engine_config: EngineConfig, address: str, *, replace: bool,
                   task_cpus: float = 1.0) -> dict[str, Any]:
    """Create the collection, upsert the snapshot's chunks from Ray tasks (:data:`TASK_BATCHES` upserts each), check
    the count; what :meth:`QdrantEngine.migrate` reports, plus ``tasks``."""
    import ray

    started = connect(address)
    engine = QdrantEngine(engine_config)
    try:
        snap = load_snapshot(Path(index_dir), checksums=False)
        t0 = time.perf_counter()
        plan = engine.start_migration(snap, replace=replace)
        n = len(snap.chunks)
        task = ray.remote(_upload).options(num_cpus=task_cpus, max_retries=3)
        size = TASK_BATCHES * engine_config.upload_batch
        refs = [task.remote(str(snap.path), engine_config, plan, a, min(n, a + size)) for a in range(0, n, size)]
        written = sum(ray.get(refs))
        if written != n or engine.points() != n:
            raise RuntimeError(f"the engine holds {engine.points()} points after writing {written} of {n} chunks")
        return {**engine.migrated(snap, t0), "tasks": len(refs)}
    finally:
        engine.close()
        disconnect(started)  # leaves the cluster, and stops the local one this call started (--ray local)
