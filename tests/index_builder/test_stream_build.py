"""The build as a stream (issue 41): it embeds only what no source holds, a killed build resumes from its last
checkpoint to the same snapshot, a full disk or an unwritable folder fails naming the file and leaves ``CURRENT``
and the previous generation serving. Real model, real sample corpus, real subprocesses for the kills."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents.corpus import read_corpus
from index_builder.errors import SnapshotError
from index_builder.snapshot.format import current_snapshot_dir, load_snapshot
from index_builder.types import Document
from tests.helpers import REPO

SAMPLE = REPO / "data" / "sample"


def _arrays(root: Path) -> dict[str, np.ndarray]:
    snap = current_snapshot_dir(root)
    out = {p.stem: np.load(p) for p in snap.glob("*.npy")}
    for p in (snap / "bm25").glob("*.npy"):
        out[f"bm25/{p.stem}"] = np.load(p)
    return out


def _changed(docs: list[Document]) -> list[Document]:
    """Three documents edited, one removed, two added."""
    out = [dataclasses.replace(d, text=d.text + " Edited to change its passages.") if i in (3, 40, 77) else d
           for i, d in enumerate(docs) if i != 10]
    out += [Document(id="added-1", text="Axolotls regrow whole limbs from a blastema of dedifferentiated cells."),
            Document(id="added-2", text="Tardigrades survive the vacuum of space by entering a state called tun.")]
    return out


def test_a_second_build_embeds_only_the_chunks_that_changed(tmp_path, config, embedder):
    docs, _ = read_corpus(SAMPLE)
    build = config.build_config()
    first = build_snapshot(docs, tmp_path / "idx", build, embedder)
    assert first.embedded == first.chunks - first.reused and first.embedded > 0
    changed = _changed(docs)
    second = build_snapshot(changed, tmp_path / "idx", build, embedder)
    fresh = build_snapshot(changed, tmp_path / "fresh", build, embedder)
    new_passages = sum(1 for d in changed if d.id.startswith("added") or "Edited to change" in d.text)
    assert 0 < second.embedded <= 3 * new_passages and second.embedded < fresh.embedded / 10
    assert second.reused + second.embedded >= second.chunks and not (tmp_path / "idx" / ".build-work").exists()
    a, b = _arrays(tmp_path / "idx"), _arrays(tmp_path / "fresh")
    assert set(a) == set(b)
    for name in ("chunks", "chunk_keys", "token_offsets", "bm25/data.csc.index", "bm25/indices.csc.index",
                 "bm25/indptr.csc.index"):
        assert np.array_equal(a[name], b[name]), name
    np.testing.assert_allclose(a["vectors"], b["vectors"], atol=2e-6)  # reused rows: embedded in other batches
    assert np.abs(a["token_vectors"].astype(int) - b["token_vectors"].astype(int)).max() <= 1
    snap = load_snapshot(tmp_path / "idx")  # verified: checksums, counts
    assert snap.generation == 2 and len(snap.documents) == len(changed)


def _build_cmd(out: Path, corpus: Path = SAMPLE) -> list[str]:
    return [sys.executable, "-m", "hybridrag", "build", "--corpus", str(corpus), "--out", str(out), "--quiet",
            "--threads", "1"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HYBRIDRAG_BUILD__EMBED_BATCH": "24", "HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false",
            **extra}


@pytest.mark.slow  # ~20 s: three builds in child processes (one killed, resumed, one whole)
def test_a_killed_build_resumes_from_its_last_checkpoint_to_the_same_snapshot(tmp_path):
    """kill -9 once the build has written three checkpoints (24 passages each); the same command again embeds only
    the rest and writes the snapshot an uninterrupted build writes (every array, byte for byte)."""
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_build_cmd(killed), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (killed / ".build-work" / "seg-000003" / "done").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no third checkpoint within 120 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (killed / "CURRENT").exists()  # nothing was published
    done = len(list((killed / ".build-work").glob("seg-*")))
    assert done >= 3
    resumed = subprocess.run(_build_cmd(killed), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run(_build_cmd(tmp_path / "whole"), cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert whole.returncode == 0, whole.stderr
    embedded = int(resumed.stdout.split(" passages embedded")[0].rsplit(" ", 1)[1])
    total = int(whole.stdout.split(" passages embedded")[0].rsplit(" ", 1)[1])
    assert embedded <= total - 24 * done  # the killed build's checkpoints were not embedded again
    a, b = _arrays(killed), _arrays(tmp_path / "whole")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a), [k for k in a if not np.array_equal(a[k], b[k])]
    da = (current_snapshot_dir(killed) / "documents.jsonl").read_bytes()
    assert da == (current_snapshot_dir(tmp_path / "whole") / "documents.jsonl").read_bytes()
    assert not (killed / ".build-work").exists()
    print(f"\n[resume] killed after {done} checkpoints; the resumed build embedded {embedded} of {total} passages")


def _limit_file_size(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.slow  # two builds, the second in a child process under a 256 KiB file-size limit
def test_a_full_disk_fails_naming_the_file_and_current_keeps_serving(tmp_path, config, embedder):
    docs, _ = read_corpus(SAMPLE)
    root = tmp_path / "idx"
    build_snapshot(docs, root, config.build_config(), embedder)
    before = (root / "CURRENT").read_text()
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text, "tenant": d.tenant,
                                           "metadata": d.metadata}) + "\n" for d in _changed(docs)))
    r = subprocess.run(_build_cmd(root, changed), cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=600, preexec_fn=_limit_file_size(2**18))  # 256 KiB
    assert r.returncode != 0
    assert "File too large" in r.stderr and str(root) in r.stderr and "CURRENT still points at" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert (root / "CURRENT").read_text() == before
    snap = load_snapshot(root)  # the previous generation, verified
    assert snap.generation == 1 and len(snap.documents) == len(docs)
    assert not list((root / "snapshots").glob(".tmp-gen-*"))


def test_an_unwritable_folder_is_refused_before_any_work(tmp_path, config, embedder):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(SnapshotError, match="cannot write an index under .*a-file/idx"):
        build_snapshot([Document(id="x", text="some text")], blocker / "idx", config.build_config(), embedder)
