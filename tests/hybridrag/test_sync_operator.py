"""``hybridrag sync`` as an operator meets it (issue 51, items 8, 9 and 11): a real ``serve --store`` with
tenant-bound keys, folders of real files, the real model. Two folders of one name, API writers who copy a
document's metadata, tenant maps with bound keys, moves between tenants both ways, refusals as one line and exit 2,
the key kept out of the command line, and ``--watch`` through a server restart and a bad file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridrag.cli import main
from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient
from tests.helpers import REPO, ServeProcess, free_port
from tests.index_builder.test_folder import sample_passages

pytestmark = pytest.mark.slow  # spawned servers killed and restarted under a --watch sync (~20-40 s a test)

API_KEYS = {"k-a": ["acme"], "k-b": ["initech"], "k-admin": ["*"]}
SERVE_ENV = {"HYBRIDRAG_API_KEYS": json.dumps(API_KEYS), "HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false",
             "HYBRIDRAG_LIVE__REBUILD_AFTER_WRITES": "0", "HYBRIDRAG_LIVE__REBUILD_AFTER_S": "0"}
PASSAGES = list(sample_passages().values())


def write(root: Path, files: dict[str, int]) -> None:
    """Markdown files, each holding one sample passage (by its index in the sample corpus)."""
    for rel, i in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {PASSAGES[i]['title']}\n\n{PASSAGES[i]['text']}\n", encoding="utf-8")


@pytest.fixture(scope="module")
def server(writable_template, tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("sync-server")
    shutil.copy2(writable_template / "store.db", root / "store.db")
    shutil.copytree(writable_template / "index", root / "index")
    proc = ServeProcess(["--index", str(root / "index"), "--store", str(root / "store.db")], env=SERVE_ENV,
                        clean_env=True)
    try:
        yield proc
    finally:
        proc.stop()


def sync(capsys, *args: str) -> tuple[int | str, str, str]:
    """``hybridrag sync ARGS`` in this process: (exit status, or the exception that escaped; stdout; stderr)."""
    try:
        rc: int | str = main(["sync", *args])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 - a traceback is what the test looks for
        rc = f"traceback: {type(e).__name__}: {e}"
    out = capsys.readouterr()
    return rc, out.out, out.err


def refused(rc, err: str) -> str:
    """The one error line of a refused run (exit 2, no traceback)."""
    errors = [ln for ln in err.splitlines() if ln.startswith("hybridrag sync: error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, (rc, err)
    return errors[0]


def listed(server: ServeProcess, key: str = "k-admin", **filters: str) -> dict[str, tuple[str, dict[str, str]]]:
    """id -> (tenant, metadata) of every document the store holds (seen with ``key``)."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    after = ""
    with RetrieverClient(server.target, ClientOptions(api_key=key, timeout=60)) as c:
        while True:
            page = c.list_documents(filters=filters, after=after)
            out.update({d.id: (d.tenant, dict(d.metadata)) for d in page.documents})
            if not page.next_after:
                return out
            after = page.next_after


def test_two_folders_of_one_name_and_api_writers_keep_their_documents(server, tmp_path, capsys, monkeypatch):
    team_a, team_b = tmp_path / "teamA" / "docs", tmp_path / "teamB" / "docs"
    write(team_a, {"alpha.md": 0, "beta.md": 1, "shared.md": 2})
    write(team_b, {"gamma.md": 3, "shared.md": 4})
    monkeypatch.setenv("HYBRIDRAG_API_KEY", "k-a")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "host1"))
    rc, out, err = sync(capsys, str(team_a), "--server", server.target, "--tenant", "acme")
    assert rc == 0 and "added 3, updated 0, deleted 0" in out, (rc, out, err)
    before = listed(server, source="docs")
    assert set(before) == {"alpha.md", "beta.md", "shared.md"}

    # An API writer (a key of the same tenant) copies alpha.md's metadata onto its own documents.
    with RetrieverClient(server.target, ClientOptions(api_key="k-a", timeout=120)) as c:
        c.upsert([pb.Document(id="api-copy", title="copy", text=PASSAGES[5]["text"], tenant="acme",
                              metadata=before["alpha.md"][1]),
                  pb.Document(id="api-named", title="named", text=PASSAGES[6]["text"], tenant="acme",
                              metadata={"source": "docs"})])

    # A second folder named "docs" on the same machine: its own source id; its new file is added, its shared.md is
    # not written over team A's, and nothing it did not write is deleted.
    rc, out, err = sync(capsys, str(team_b), "--server", server.target, "--tenant", "acme")
    assert rc == 0 and "added 1, updated 0, deleted 0, unchanged 0, skipped 1" in out, (rc, out, err)
    assert "5 documents of source 'docs' that this sync did not write left alone" in out
    assert f"another folder of source 'docs' is synced from this machine ({team_a})" in err
    assert "skipped shared.md: its id is held by a document this sync did not write" in err
    now = listed(server, source="docs")
    assert set(now) == {"alpha.md", "beta.md", "shared.md", "gamma.md", "api-copy", "api-named"}
    assert now["shared.md"] == before["shared.md"] and now["gamma.md"][1]["source_id"] != before["alpha.md"][1]["source_id"]

    # On another machine (its own state) the same: team B's gamma.md is not its either.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "host2"))
    rc, out, err = sync(capsys, str(team_b), "--server", server.target, "--tenant", "acme")
    assert rc == 0 and "added 0, updated 0, deleted 0, unchanged 0, skipped 2" in out, (rc, out, err)
    assert set(listed(server, source="docs")) == set(now)

    # Team A removes a file: only the document its own sync wrote goes (not the API's copy of its metadata).
    (team_a / "alpha.md").unlink()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "host1"))
    rc, out, err = sync(capsys, str(team_a), "--server", server.target, "--tenant", "acme")
    assert rc == 0 and "added 0, updated 0, deleted 1, unchanged 2" in out, (rc, out, err)
    assert set(listed(server, source="docs")) == {"beta.md", "shared.md", "gamma.md", "api-copy", "api-named"}


def test_tenant_maps_with_bound_keys_and_moves_both_ways(server, tmp_path, capsys, monkeypatch):
    root = tmp_path / "handbook"
    write(root, {"intro.md": 7, "team/plan.md": 8, "pay/salary.md": 9, "taken.md": 14})
    with RetrieverClient(server.target, ClientOptions(api_key="k-b", timeout=120)) as c:  # another tenant's id
        c.upsert([pb.Document(id="taken.md", text=PASSAGES[15]["text"], tenant="initech")])
    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "acme.json").write_text(json.dumps({"team/*": "acme", "*.md": "acme"}))
    (maps / "split.json").write_text(json.dumps({"pay/*": "initech", "*.md": "acme"}))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HYBRIDRAG_API_KEY", "k-a")
    rc, out, err = sync(capsys, str(root), "--server", server.target, "--tenant-map", str(maps / "acme.json"))
    assert rc == 0 and "added 3, updated 0, deleted 0, unchanged 0, skipped 1" in out, (rc, out, err)
    assert "skipped taken.md: the server refused it: document 0 ('taken.md'): this id cannot be written" in err

    # A map that can put a file in a tenant the key may not write: refused, naming that tenant; nothing written.
    rc, out, err = sync(capsys, str(root), "--server", server.target, "--tenant-map", str(maps / "split.json"))
    assert "'initech'" in refused(rc, err)
    assert listed(server, source="handbook")["pay/salary.md"][0] == "acme"

    monkeypatch.setenv("HYBRIDRAG_API_KEY", "k-admin")
    for tenant, args in [("initech", ["--tenant-map", str(maps / "split.json")]), ("acme", ["--tenant", "acme"]),
                         ("initech", ["--tenant-map", str(maps / "split.json")])]:
        rc, out, err = sync(capsys, str(root), "--server", server.target, *args)
        assert rc == 0 and "updated 1, deleted 0, unchanged 2, skipped 1" in out, (tenant, rc, out, err)
        docs = listed(server, source="handbook")
        assert {i: t for i, (t, _) in docs.items()} == {"intro.md": "acme", "team/plan.md": "acme",
                                                        "pay/salary.md": tenant}


def test_refusals_are_one_line_and_the_key_stays_off_the_command_line(server, tmp_path, capsys, monkeypatch):
    root = tmp_path / "keys"
    write(root, {"key-note.md": 10})
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("HYBRIDRAG_API_KEY", raising=False)
    args = [str(root), "--server", server.target, "--tenant", "acme"]
    assert "HYBRIDRAG_API_KEY" in refused(*sync(capsys, *args)[::2])
    key_file = tmp_path / "key"
    key_file.write_text("k-b\n")
    assert "'acme'" in refused(*sync(capsys, *args, "--api-key-file", str(key_file))[::2])
    assert "no-such-file" in refused(*sync(capsys, *args, "--api-key-file", str(tmp_path / "no-such-file"))[::2])
    assert "unknown API key" in refused(*sync(capsys, *args, "--api-key", "wrong")[::2])
    rc, out, err = sync(capsys, *args, "--api-key", "k-a")
    assert rc == 0 and "added 1" in out and "visible" in err and "ps" in err, (rc, out, err)
    key_file.write_text("k-a\n")
    rc, out, err = sync(capsys, *args, "--api-key-file", str(key_file))
    assert rc == 0 and "unchanged 1" in out and "visible" not in err, (rc, out, err)
    nobody = f"127.0.0.1:{free_port()}"
    t = time.monotonic()
    line = refused(*sync(capsys, str(root), "--server", nobody, "--tenant", "acme", "--api-key-file", str(key_file),
                         "--retry-for", "2")[::2])
    assert "unavailable" in line and time.monotonic() - t < 60
    assert "not a folder" in refused(*sync(capsys, str(tmp_path / "missing"), "--server", server.target)[::2])


def page_tree_bomb(kids: int) -> bytes:
    """A PDF whose page tree lists one page ``kids`` times (1.2 MB for 150,000): pypdf stops at its array limit
    with ``LimitReachedError``."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [" + b"3 0 R " * kids + b"] /Count %d >>" % kids,
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] >>"]
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, o)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)


def test_watch_outlives_its_server_and_a_bad_file(writable, tmp_path):
    """Started while the server is down, through a kill -9 and a restart on the same port, and past a PDF that
    ends pypdf at its limits: the watch keeps going, says so once per outage, and syncs what changed meanwhile."""
    root = tmp_path / "watched"
    write(root, {"first.md": 11})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDRAG_")}
    env |= {"HYBRIDRAG_API_KEY": "k-a", "XDG_STATE_HOME": str(tmp_path / "state")}
    watch = subprocess.Popen([sys.executable, "-m", "hybridrag", "sync", str(root), "--server", f"127.0.0.1:{port}",
                              "--tenant", "acme", "--watch", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=REPO, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True).start()
    serve_args = ["--index", str(writable / "index"), "--store", str(writable / "store.db")]
    server = None

    def synced(name: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and watch.poll() is None:
            if name in listed(server, source="watched"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{name} was not synced (watch exit {watch.poll()}):\n{''.join(lines)}")

    try:
        time.sleep(4)
        assert watch.poll() is None, "".join(lines)
        server = ServeProcess(serve_args, env=SERVE_ENV, clean_env=True, port=port)
        synced("first.md")
        server.kill()
        write(root, {"meanwhile.md": 12})
        time.sleep(4)
        assert watch.poll() is None, "".join(lines)
        server = ServeProcess(serve_args, env=SERVE_ENV, clean_env=True, port=port)
        synced("meanwhile.md")

        bomb = root / "bomb.pdf"
        bomb.write_bytes(page_tree_bomb(150_000))
        time.sleep(4)
        assert watch.poll() is None, "".join(lines)
        bomb.unlink()
        write(root, {"later.md": 13})
        synced("later.md")
        assert watch.poll() is None
        text = "".join(lines)
        assert "Traceback" not in text
        assert sum("unavailable" in ln for ln in lines) == 2, text  # once per outage: at the start, after the kill
        assert sum(" is back after " in ln for ln in lines) == 2, text
    finally:
        watch.send_signal(signal.SIGTERM)
        try:
            rc = watch.wait(120)
        finally:
            if server is not None:
                server.stop()
    assert rc == 0, "".join(lines)
