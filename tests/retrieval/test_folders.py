"""The folder flow as a library call (:mod:`retrieval.folders`) against a real document store: who owns a
document, two folders of one name, a folder that moves or changes machine, tenants moved both ways, an id another
tenant holds, and ``build`` from a folder. No argparse, no server (tests/hybridrag/test_sync_operator.py runs the
same through ``hybridrag sync`` and a server)."""

from __future__ import annotations

import json
import shutil

import pytest

from index_builder.documents.folder import FolderOptions
from index_builder.types import Document
from retrieval.folders import FolderSync, SourceState, StoreTarget, SyncError, SyncOptions, folder_build
from retrieval.live.store import DocumentStore
from tests.hybridrag.test_sync_operator import write


@pytest.fixture()
def store(tmp_path):
    s = DocumentStore(tmp_path / "store.db")
    yield s
    s.close()


def held(store: DocumentStore) -> dict[str, str]:
    return {i: t for i, t, _, _, _ in store.list_documents(limit=1000)}


def run(root, store, state, said=None, **options):
    folder = FolderOptions(**{k: options.pop(k) for k in list(options) if k in FolderOptions.__dataclass_fields__})
    sync = FolderSync(root, StoreTarget(store), SyncOptions(state, folder, **options),
                      said.append if said is not None else None)
    return sync.run()


def test_a_sync_deletes_only_what_it_wrote(tmp_path, store):
    root = tmp_path / "docs"
    write(root, {"a.md": 0, "b.md": 1})
    result = run(root, store, tmp_path / "state", tenant="acme")
    assert result.plan.summary() == "added 2, updated 0, deleted 0, unchanged 0, skipped 0"
    meta = store.get("a.md").metadata
    assert meta["source"] == "docs" and len(meta["source_id"]) == 16 and len(meta["source_mark"]) == 32
    # API writers: one copies a.md's metadata onto its own id, one moves a's metadata to another tenant's copy,
    # one names the source
    store.upsert([Document(id="copy", text="x", tenant="acme", metadata=meta),
                  Document(id="other-tenant", text="x", tenant="globex", metadata=meta),
                  Document(id="named", text="x", tenant="acme", metadata={"source": "docs"})])
    (root / "a.md").unlink()
    (root / "b.md").unlink()
    write(root, {"c.md": 2})
    result = run(root, store, tmp_path / "state", tenant="acme")
    assert (len(result.plan.added), result.plan.deleted, result.left_alone) == (1, ["a.md", "b.md"], 2)
    assert held(store) == {"c.md": "acme", "copy": "acme", "other-tenant": "globex", "named": "acme"}


def test_two_folders_of_one_name_a_move_and_another_machine(tmp_path, store):
    team_a, team_b = tmp_path / "a" / "docs", tmp_path / "b" / "docs"
    write(team_a, {"one.md": 0, "shared.md": 1})
    write(team_b, {"two.md": 2, "shared.md": 3})
    run(team_a, store, tmp_path / "host1")
    shared = store.get("shared.md")
    said: list[str] = []
    other = run(team_b, store, tmp_path / "host1", said)  # its own secret: apart, nothing written over
    assert [d.id for d in other.plan.added] == ["two.md"] and other.left_alone == 2
    assert said == [f"another folder of source 'docs' is synced from this machine ({team_a}): this one gets its own "
                    "source id (--source NAME tells them apart by name too)"]
    assert [(s.path, "this sync did not write" in s.reason) for s in other.report.skipped] == [("shared.md", True)]
    assert store.get("shared.md") == shared
    assert store.get("two.md").metadata["source_id"] != shared.metadata["source_id"]
    prefixed = run(team_b, store, tmp_path / "host3", source="docs-b", id_prefix="b/")
    assert sorted(d.id for d in prefixed.plan.added) == ["b/shared.md", "b/two.md"]

    # Team A's folder moves on its machine: the state follows it, nothing is written again.
    moved = tmp_path / "moved" / "docs"
    moved.parent.mkdir()
    shutil.move(team_a, moved)
    said.clear()
    again = run(moved, store, tmp_path / "host1", said)
    assert again.plan.summary() == "added 0, updated 0, deleted 0, unchanged 2, skipped 0"
    assert said == [f"the folder of source 'docs' moved from {team_a} to {moved}"]

    # ... then to a new machine without its state: --adopt takes over its ids (deleting none of the others).
    fresh = run(moved, store, tmp_path / "host4")
    assert fresh.plan.upserts() == [] and len(fresh.report.skipped) == 2
    adopted = run(moved, store, tmp_path / "host4", adopt=True)
    assert sorted(d.id for d in adopted.plan.updated) == ["one.md", "shared.md"] and adopted.plan.deleted == []
    (moved / "one.md").unlink()
    after = run(moved, store, tmp_path / "host4")
    assert after.plan.deleted == ["one.md"] and "two.md" in held(store)


def test_tenants_moved_both_ways_and_an_id_another_tenant_holds(tmp_path, store):
    root = tmp_path / "handbook"
    write(root, {"intro.md": 0, "pay/salary.md": 1, "taken.md": 2})
    store.upsert([Document(id="taken.md", text="an API writer's", tenant="globex")])
    split = (("pay/*", "initech"), ("*", "acme"))
    first = run(root, store, tmp_path / "state", tenant_map=split)
    assert sorted(d.id for d in first.plan.added) == ["intro.md", "pay/salary.md"]
    assert [s.path for s in first.report.skipped] == ["taken.md"]
    assert "held by a document this sync did not write" in first.report.skipped[0].reason
    assert held(store) == {"intro.md": "acme", "pay/salary.md": "initech", "taken.md": "globex"}
    for tenant, options in [("acme", {"tenant": "acme"}), ("initech", {"tenant_map": split}),
                            ("acme", {"tenant": "acme"})]:
        result = run(root, store, tmp_path / "state", **options)
        assert result.plan.moved == ["pay/salary.md"] and result.plan.deleted == []
        assert held(store)["pay/salary.md"] == tenant
    state = json.loads(next((tmp_path / "state").glob("handbook-*.json")).read_text())
    assert list(state["folders"]) == [str(root)] and state["folders"][str(root)]["tenants"] == ["acme"]
    assert (next((tmp_path / "state").glob("handbook-*.json")).stat().st_mode & 0o777) == 0o600


def test_build_from_a_folder_through_a_store_keeps_api_documents(tmp_path, store):
    root = tmp_path / "docs"
    write(root, {"a.md": 0, "b.md": 1})
    options = SyncOptions(tmp_path / "state", FolderOptions(tenant="acme"))
    build = folder_build(root, options, tmp_path / "idx", store)
    assert sorted(d.id for d in build.documents) == ["a.md", "b.md"] and build.covered_seq == 2
    store.upsert([Document(id="api", text="x", tenant="acme", metadata={"source": "docs"})])
    (root / "a.md").unlink()
    build = folder_build(root, options, tmp_path / "idx", store)
    assert sorted(d.id for d in build.documents) == ["api", "b.md"]
    assert "deleted 1" in build.summary() and "1 documents of source 'docs' that this sync did not write" in build.summary()
    streamed = folder_build(root, options, tmp_path / "idx")  # no store: the folder itself, streamed, no marks
    assert [(d.id, "source_mark" in d.metadata) for d in streamed.documents] == [("b.md", False)]


def test_the_state_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(SyncError, match="id prefix"):
        SyncOptions(tmp_path, id_prefix="a\x1b[2Jb/")
    SourceState.open(tmp_path / "state", "docs", tmp_path)
    path = next((tmp_path / "state").glob("docs-*.json"))
    path.write_text("{not json")
    with pytest.raises(SyncError, match="cannot read the sync state"):
        SourceState.open(tmp_path / "state", "docs", tmp_path)
    path.write_text(json.dumps({"folders": {str(tmp_path): {"secret": "zz"}}}))
    with pytest.raises(SyncError, match="is damaged"):
        SourceState.open(tmp_path / "state", "docs", tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(SyncError, match="cannot use the sync state folder"):
        SourceState.open(tmp_path / "file" / "state", "docs", tmp_path)
