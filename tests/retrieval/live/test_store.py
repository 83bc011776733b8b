"""The document store (SQLite, WAL, synchronous FULL): sequence numbers, replace/delete semantics, all-or-nothing
batches with errors naming the bad document, tenant ownership, and durability across kill -9 of a real writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from index_builder.types import Document
from retrieval.errors import InvalidRequest, PermissionDenied
from retrieval.live.store import DocumentStore
from tests.helpers import REPO


def doc(i, tenant="acme", text=None, **meta):
    return Document(id=f"d{i}", text=text or f"text of document {i}", title=f"T{i}", tenant=tenant, metadata=meta)


def test_sequence_numbers_replace_delete_and_changes(tmp_path):
    s = DocumentStore(tmp_path / "store.db")
    assert s.pragma("journal_mode") == "wal" and s.pragma("synchronous") == 2  # 2 = FULL
    assert s.upsert([doc(1), doc(2, colour="red")]).seq == 2
    assert s.get("d2").metadata == {"colour": "red"}
    r = s.upsert([doc(1, text="new text")])
    assert (r.seq, r.count) == (3, 1)
    assert s.get("d1").text == "new text" and s.count() == 2
    assert (s.delete(["d2", "missing"]).seq, s.delete(["d2"]).count) == (4, 0)
    changes = s.changes_since(1)
    assert [(c.seq, c.op, c.id) for c in changes] == [(2, "upsert", "d2"), (3, "upsert", "d1"), (4, "delete", "d2")]
    assert changes[0].document is None  # d2 was deleted later: only its delete carries meaning
    assert changes[1].document.text == "new text"
    seq, docs = s.snapshot()
    assert seq == 4 and [d.id for d in docs] == ["d1"]
    s.close()
    reopened = DocumentStore(tmp_path / "store.db")
    assert reopened.last_seq() == 4 and reopened.get("d1").text == "new text"


@pytest.mark.parametrize(("bad", "message"), [
    ({"_id": "", "text": "x"}, r"document 1.*'_id' must be a non-empty string"),
    ({"_id": "ok", "text": "  "}, r"document 1 \('ok'\).*'text' is empty"),
    ({"_id": "ok", "text": "x", "tenant": "no spaces!"}, r"'tenant' must be up to 64"),
    ({"_id": "ok", "text": "x", "metadata": {"k": [1]}}, r"metadata value for key 'k'"),
    ({"_id": "ok", "text": "x" * 1_000_001}, r"at most 1000000 are allowed"),
    ({"_id": "d0", "text": "dup"}, r"the id appears twice"),
])
def test_a_bad_document_refuses_the_whole_batch(tmp_path, bad, message):
    s = DocumentStore(tmp_path / "store.db")
    s.upsert([doc(9)])
    with pytest.raises(InvalidRequest, match=message):
        s.upsert([{"_id": "d0", "text": "fine", "tenant": "acme"}, bad])
    assert s.last_seq() == 1 and s.get("d0") is None  # nothing of the refused batch was written


def test_ids_belong_to_one_tenant(tmp_path):
    s = DocumentStore(tmp_path / "store.db")
    s.upsert([doc(1, tenant="acme")])
    with pytest.raises(PermissionDenied, match="cannot be written under tenant 'globex'") as e:
        s.upsert([doc(2, tenant="globex"), doc(1, tenant="globex")])
    assert "acme" not in str(e.value)  # the refusal does not name the tenant that holds the id
    assert s.get("d2") is None and s.get("d1").tenant == "acme"
    with pytest.raises(InvalidRequest, match="not the caller's tenant"):
        s.upsert([doc(3, tenant="acme")], tenant="globex")
    assert s.delete(["d1"], tenant="globex").count == 0 and s.get("d1") is not None  # not globex's to delete
    assert s.delete(["d1"], tenant="acme").count == 1


WRITER = textwrap.dedent("""
    import sys
    from index_builder.types import Document
    from retrieval.live.store import DocumentStore
    s = DocumentStore(sys.argv[1])
    i = 0
    while True:
        r = s.upsert([Document(id=f"b{i}-{j}", text=f"batch {i} doc {j}", tenant="t") for j in range(5)])
        print(f"ACK {i} {r.seq}", flush=True)
        i += 1
""")


def test_acknowledged_writes_survive_kill_9(tmp_path):
    db = tmp_path / "store.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    acked = []
    try:
        for line in proc.stdout:
            _, batch, seq = line.split()
            acked.append((int(batch), int(seq)))
            if len(acked) >= 40:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the next batch may be half-way through its transaction
        proc.wait()
    s = DocumentStore(db)
    assert s.last_seq() >= acked[-1][1]
    for batch, _ in acked:
        assert all(s.get(f"b{batch}-{j}") is not None for j in range(5)), batch
    seq, docs = s.snapshot()
    batches: dict[str, int] = {}
    for d in docs:
        batches[d.id.split("-")[0]] = batches.get(d.id.split("-")[0], 0) + 1
    assert set(batches.values()) == {5}  # no batch is half-present
    assert seq == 5 * len(batches)
