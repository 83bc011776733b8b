"""A snapshot's documents read where they lie (index_builder/snapshot/documents_file.py): by index and in order they equal the
documents built, the file is never mapped (its pages would count in a serving process's RSS), a snapshot without
the offsets file is scanned once, and a truncated file is an error naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from index_builder.snapshot import documents_file as doc_store
from index_builder.snapshot.documents_file import DocumentFile
from index_builder.snapshot.format import current_snapshot_dir


def test_documents_by_index_and_in_order_equal_the_built_ones(sample_index_dir, sample_docs, monkeypatch):
    snap = current_snapshot_dir(sample_index_dir)
    docs = DocumentFile(snap / "documents.jsonl", np.load(snap / "documents.offsets.npy"))
    assert len(docs) == len(sample_docs)
    assert [docs[i] for i in (0, 17, -1)] == [sample_docs[0], sample_docs[17], sample_docs[-1]]
    monkeypatch.setattr(doc_store, "BLOCK", 3000)  # many blocks, lines across their edges
    assert list(docs) == list(sample_docs)
    assert "documents.jsonl" not in Path("/proc/self/maps").read_text()
    assert list(DocumentFile(snap / "documents.jsonl")) == list(sample_docs)  # offsets found by one scan
    docs.close()


def test_a_truncated_documents_file_is_an_error_naming_it(sample_index_dir, tmp_path):
    snap = current_snapshot_dir(sample_index_dir)
    cut = tmp_path / "documents.jsonl"
    cut.write_bytes((snap / "documents.jsonl").read_bytes()[:-500])
    docs = DocumentFile(cut, np.load(snap / "documents.offsets.npy"))
    assert docs[0].id
    with pytest.raises(OSError, match="documents.jsonl: truncated"):
        docs[len(docs) - 1]
