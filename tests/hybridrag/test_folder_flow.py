"""The folder flow as a user runs it: ``hybridrag build --corpus DIR`` twice (the second re-embeds only what
changed), then ``hybridrag serve --store`` kept in step by ``hybridrag sync DIR`` (gRPC: ListDocuments, Upsert,
Delete) and listed over HTTP. Real files, the real model, a real server on loopback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from retrieval.client import ClientOptions, RetrieverClient
from tests.helpers import REPO, ServeProcess
from tests.index_builder.test_folder import make_folder

pytestmark = pytest.mark.slow  # the folder flow end to end: builds, a spawned server, syncs and re-runs (~10 s each)


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    """Each test's sync state (each source's secret) in its own folder, not the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def hybridrag(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "hybridrag", *args], capture_output=True, text=True, cwd=REPO,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def summary(out: subprocess.CompletedProcess) -> dict[str, int]:
    line = next(ln for ln in (out.stdout + out.stderr).splitlines() if "added " in ln and "unchanged" in ln)
    return {k: int(v) for v, k in re.findall(r"(\d+) (?=(added|updated|deleted|unchanged|skipped)\b)", line)
            } | {k: int(v) for k, v in re.findall(r"(added|updated|deleted|unchanged|skipped) (\d+)", line)}


def test_build_a_folder_then_rebuild_re_embeds_only_what_changed(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    p = make_folder(root)
    idx = tmp_path / "idx"
    first = hybridrag("build", "--corpus", str(root), "--out", str(idx), "--quiet")
    assert summary(first) == {"added": 6, "updated": 0, "deleted": 0, "unchanged": 0, "skipped": 7}
    assert "skipped notes/secret.pdf: password-protected PDF" in first.stderr
    assert "0 chunks reused" in first.stdout

    (root / "notes" / "new.md").write_text("# Jupiter\n\n" + p["astro-002"]["text"], encoding="utf-8")
    (root / "notes" / "latin1.txt").unlink()
    (root / "guides" / "page.html").write_text("<h1>Changed</h1><p>A comet's tail points away from the Sun.</p>",
                                               encoding="utf-8")
    second = hybridrag("build", "--corpus", str(root), "--out", str(idx), "--quiet")
    assert summary(second) == {"added": 1, "updated": 1, "deleted": 1, "unchanged": 4, "skipped": 7}
    embedded = int(re.search(r"(\d+) passages embedded", second.stdout).group(1))
    reused = int(re.search(r"(\d+) chunks reused", second.stdout).group(1))
    assert embedded == 2 and reused > embedded  # the new file's and the changed page's chunks only

    found = hybridrag("search", "--index", str(idx), "--json", "which way does a comet's tail point")
    assert '"guides/page.html"' in found.stdout.split("\n")[0]
    strict = subprocess.run([sys.executable, "-m", "hybridrag", "build", "--corpus", str(root), "--out",
                             str(tmp_path / "strict"), "--strict", "--quiet"], capture_output=True, text=True, cwd=REPO)
    assert strict.returncode != 0 and "broken.pdf: corrupt PDF" in strict.stderr and "--strict" in strict.stderr
    assert not (tmp_path / "strict" / "CURRENT").exists()


def test_sync_keeps_a_running_server_in_step_with_a_folder(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    p = make_folder(root)
    store, idx = tmp_path / "store.db", tmp_path / "idx"
    built = hybridrag("build", "--corpus", str(root), "--store", str(store), "--out", str(idx), "--quiet")
    assert summary(built)["added"] == 6
    server = ServeProcess(["--index", str(idx), "--store", str(store), "--http-port", "0"], clean_env=True,
                          env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    try:
        (url,) = re.findall(r"HTTP on (http://\S+)", server.text())
        sync = hybridrag("sync", str(root), "--server", server.target)
        assert summary(sync) == {"added": 0, "updated": 0, "deleted": 0, "unchanged": 6, "skipped": 7}

        (root / "notes" / "new.md").write_text("# Jupiter\n\n" + p["astro-002"]["text"], encoding="utf-8")
        (root / "guides" / "lensing.rst").unlink()
        (root / "guides" / "page.html").write_text("<h1>Changed</h1><p>A comet's tail points away from the Sun.</p>",
                                                   encoding="utf-8")
        sync = hybridrag("sync", str(root), "--server", server.target)
        assert summary(sync) == {"added": 1, "updated": 1, "deleted": 1, "unchanged": 4, "skipped": 7}

        with RetrieverClient(server.target, ClientOptions(timeout=60)) as c:
            top = c.retrieve("which way does a comet's tail point", top_k=3)
            assert top.passages[0].doc_id == "guides/page.html"
            assert top.passages[0].metadata["source"] == "docs"
            ids = [d.id for d in c.list_documents(filters={"source": "docs"}).documents]
            assert ids == ["guides/page.html", "guides/report.pdf", "guides/space/stars.md", "notes/README",
                           "notes/latin1.txt", "notes/new.md"]
            assert "guides/lensing.rst" not in [x.doc_id for x in c.retrieve(p["astro-003"]["text"], top_k=10).passages]
            page = c.list_documents(after="guides/report.pdf", limit=2)
            assert [d.id for d in page.documents] == ["guides/space/stars.md", "notes/README"]
            assert page.next_after == "notes/README"

        watch = subprocess.Popen([sys.executable, "-m", "hybridrag", "sync", str(root), "--server", server.target,
                                  "--watch", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 cwd=REPO)
        try:  # --watch: a file written while it polls is upserted, one deleted is deleted
            (root / "notes" / "watched.md").write_text("# Watched\n\n" + p["astro-006"]["text"], encoding="utf-8")
            (root / "notes" / "new.md").unlink()
            deadline = time.monotonic() + 120
            with RetrieverClient(server.target, ClientOptions(timeout=60)) as c:
                while time.monotonic() < deadline:
                    ids = [d.id for d in c.list_documents(filters={"source": "docs"}).documents]
                    if "notes/watched.md" in ids and "notes/new.md" not in ids:
                        break
                    time.sleep(0.5)
                assert "notes/watched.md" in ids and "notes/new.md" not in ids
        finally:
            watch.send_signal(signal.SIGTERM)  # ends the watch after the round in flight
            assert watch.wait(120) == 0, watch.stdout.read()
        assert "added 1, updated 0, deleted 1" in watch.stdout.read()

        listed = httpx.get(url + "/v1/documents",
                           params={"filter": "ext=pdf", "limit": "10"}, timeout=30).json()
        assert [d["id"] for d in listed["documents"]] == ["guides/report.pdf"]
        assert "text" not in listed["documents"][0] and listed["documents"][0]["metadata"]["content_hash"]
        bad = httpx.get(url + "/v1/documents", params={"limit": "5000"}, timeout=30)
        assert bad.status_code == 400 and "'limit'" in bad.text
        bad = httpx.get(url + "/v1/documents", params={"filter": "nokey"}, timeout=30)
        assert bad.status_code == 400 and "KEY=VALUE" in bad.text
    finally:
        server.stop()
