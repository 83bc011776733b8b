import json
import os

import numpy as np
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.errors import SnapshotError
from index_builder.snapshot.format import current_snapshot_dir, list_generations, load_snapshot
from index_builder.snapshot.manifest import read_manifest
from retrieval.config import load_config
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline


@pytest.fixture()
def small_index(tmp_path, sample_docs, config, embedder):
    root = tmp_path / "idx"
    build_snapshot(sample_docs[:40], root, config.build_config(), embedder)
    return root


def test_manifest_records_every_file_and_current_points_at_it(small_index, embedder):
    snap = current_snapshot_dir(small_index)
    manifest = read_manifest(snap)
    on_disk = {p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    assert {"documents.jsonl", "chunks.npy", "vectors.npy", "hnsw.faiss", "token_vectors.npy"} <= on_disk
    assert manifest["counts"]["documents"] == 40 and manifest["dim"] == 384
    assert manifest["models"]["embedder"]["sha256"] == embedder.files.sha256
    assert manifest["analyzer"]["stemmer"] and manifest["bm25"]["k1"] == 0.9
    assert (small_index / "CURRENT").read_text().strip() == "snapshots/gen-000001"


def test_new_generation_replaces_current_and_old_ones_are_pruned(small_index, sample_docs, config, embedder):
    for _ in range(4):
        build_snapshot(sample_docs[:10], small_index, config.build_config(), embedder)
    assert list_generations(small_index) == [3, 4, 5]  # keep_snapshots = 3
    assert current_snapshot_dir(small_index).name == "gen-000005"
    assert not [p for p in (small_index / "snapshots").iterdir() if p.name.startswith(".tmp")]


def test_model_mismatch_is_refused_with_what_differs(small_index):
    with pytest.raises(SnapshotError, match=r"models.embedder.sha256: snapshot has '[0-9a-f]{64}', configuration has 'x"):
        load_snapshot(small_index, expected={"models.embedder.sha256": "x" * 64})


def test_analyzer_mismatch_is_refused(small_index, embedder):
    other = load_config(environ={}, overrides={"analyzer": {"stemmer": "english"}})
    with pytest.raises(SnapshotError, match="analyzer.stemmer: snapshot has 'porter', configuration has 'english'"):
        SearchIndex.load(small_index, other, embedder)


def test_corrupt_file_is_refused(small_index):
    snap = current_snapshot_dir(small_index)
    target = snap / "documents.jsonl"
    os.chmod(target, 0o644)
    data = bytearray(target.read_bytes())
    data[10] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="documents.jsonl: sha256 differs"):
        load_snapshot(small_index)


def test_format_version_mismatch_is_refused(small_index):
    snap = current_snapshot_dir(small_index)
    m = snap / "manifest.json"
    os.chmod(m, 0o644)
    manifest = json.loads(m.read_text())
    manifest["format_version"] = 99
    m.write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match="format version 99"):
        load_snapshot(small_index)


def test_not_an_index(tmp_path):
    with pytest.raises(SnapshotError, match="has no CURRENT"):
        load_snapshot(tmp_path)


def test_missing_hnsw_degrades_to_bm25_alone(small_index, config, embedder):
    snap = current_snapshot_dir(small_index)
    (snap / "hnsw.faiss").unlink()
    index = SearchIndex.load(small_index, config, embedder)
    assert index.dense is None and "hnsw.faiss: missing" in index.dense_error
    p = Pipeline(index, embedder, config)
    res = p.search("telescope mirror", k=3)
    p.close()
    assert res.degraded and "dense" in res.skipped and "bm25" in res.stages and len(res.hits) > 0
    with pytest.raises(SnapshotError):
        load_snapshot(small_index, dense_required=True)


def _mapped_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def test_released_pages_leave_the_process_but_keep_their_data(tmp_path):
    """What the build calls after each block: a mapped array's pages, read or written, stop counting in the
    process's RSS, and what was written is still there."""
    from index_builder.snapshot.row_file import release_pages

    path = tmp_path / "rows.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1 << 20,))
    out[:] = np.arange(1 << 20, dtype=np.float32)  # 4 MiB written through the map
    assert _mapped_kib(path) >= 4000
    release_pages(out, np.zeros(3))  # (an array in memory is skipped)
    assert _mapped_kib(path) < 100
    out.flush()
    del out
    back = np.load(path, mmap_mode="r")
    assert float(back.sum()) == float(np.arange(1 << 20, dtype=np.float64).sum())  # read: resident again
    assert _mapped_kib(path) >= 4000
    release_pages(back[10:20])  # a view releases its whole map
    assert _mapped_kib(path) < 100
