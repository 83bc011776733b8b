"""A folder of traps built with the real command line (``hybridrag build --corpus DIR --out IDX``): links out of
the folder (a file and a folder: /etc/passwd and /etc), a Latin-1 name, names with control and bidirectional
characters, a PDF zip bomb and a page-tree bomb, a text-bomb PDF, 50 KB of unclosed HTML comments, a markdown line
of 50,000 ``[``, 900,000 characters of mostly spaces. The build succeeds; each trap is skipped with its reason (or
read within its bounds); nothing of /etc/passwd is searchable; no raw escape or bidi character reaches the
terminal; and it all takes bounded time (before issue 51 the build ended with a traceback on the first bomb, and
the markdown line alone took 17 s to read).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO
from tests.index_builder.test_folder import sample_passages
from tests.index_builder.test_readers_fuzz import page_tree_bomb_pdf, text_bomb_pdf, zip_bomb_pdf

MiB = 2**20


def hybridrag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridrag", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, errors="surrogateescape")


def make_traps(root: Path) -> dict[str, str]:
    """The trap folder; returns the text of the one ordinary file, for a search."""
    p = sample_passages()
    a = p["astro-001"]
    (root / "ok.md").write_text(f"# {a['title']}\n\n{a['text']}\n", encoding="utf-8")
    os.symlink("/etc/passwd", root / "passwd.txt")
    os.symlink("/etc", root / "etc")
    with open(os.fsencode(root) + b"/caf\xe9.md", "wb") as f:
        f.write(b"# Cafe\n\nAn espresso with crema, pulled for nine seconds.\n")
    for name in ("evil\u202etxt.md", "new\nline.md", "esc\x1b]0;pwned\x07.md"):
        (root / name).write_text("# Trap\n\nA name that displays as another.", encoding="utf-8")
    (root / "zip-bomb.pdf").write_bytes(zip_bomb_pdf(100 * MiB))
    (root / "tree-bomb.pdf").write_bytes(page_tree_bomb_pdf())
    (root / "text-bomb.pdf").write_bytes(text_bomb_pdf(1, 2_000_000))
    (root / "comments.html").write_text("<!--" * 12_800, encoding="utf-8")
    (root / "brackets.md").write_text("[" * 50_000, encoding="utf-8")
    (root / "spaces.txt").write_text("".join(f"spacious{i}" + " " * 2_990 for i in range(300)), encoding="utf-8")
    return {"ok": a["text"]}


def test_a_folder_of_traps_builds_with_each_trap_skipped_and_nothing_outside_it_searchable(tmp_path):
    root, idx = tmp_path / "traps", tmp_path / "idx"
    root.mkdir()
    make_traps(root)
    t = time.monotonic()
    built = hybridrag("build", "--corpus", str(root), "--out", str(idx), "--quiet")
    took = time.monotonic() - t
    assert built.returncode == 0, built.stderr[-3000:]
    err = built.stderr
    for line in ("skipped etc: a symbolic link to /etc, outside the folder (--follow-links-outside reads it)",
                 "skipped passwd.txt: a symbolic link to /etc/passwd, outside the folder",
                 "skipped evil\\u202etxt.md: its name holds a control or bidirectional-override character (U+202E)",
                 "skipped new\\nline.md: its name holds a control or bidirectional-override character (U+000A)",
                 "skipped esc\\x1b]0;pwned\\x07.md: its name holds a control or bidirectional-override character",
                 "skipped zip-bomb.pdf: PDF over a safety limit: Limit reached while decompressing",
                 "skipped tree-bomb.pdf: PDF over a safety limit: Maximum page tree",
                 "skipped text-bomb.pdf: over 1,000,000 characters of text by page 1",
                 "skipped comments.html: no text in it"):
        assert line in err, (line, err[-3000:])
    out = built.stdout + built.stderr
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069\ud800-\udfff]", out)  # nothing raw
    assert "2 links out of the folder not followed" in out and "skipped 9;" in out
    assert took < 300, took  # ~20 s here; the markdown line alone took 17 s to read before

    found = hybridrag("search", "--index", str(idx), "--json", "-k", "20", "root bin bash nologin daemon")
    assert found.returncode == 0, found.stderr[-2000:]
    answer = json.loads(found.stdout.splitlines()[0])
    text = json.dumps(answer)
    assert "root:x:0" not in text and "/usr/sbin/nologin" not in text and "passwd" not in text

    cafe = hybridrag("search", "--index", str(idx), "--json", "espresso crema")
    assert '"caf%E9.md"' in cafe.stdout.splitlines()[0]  # the Latin-1 name, escaped: served without an error
    spaces = hybridrag("search", "--index", str(idx), "--json", "-k", "50", "spacious7")
    passages = [h for h in json.loads(spaces.stdout.splitlines()[0])["hits"] if h["id"] == "spaces.txt"]
    assert passages and all(len(h["text"]) <= 224 * 16 for h in passages)  # 900 KB in one passage before
