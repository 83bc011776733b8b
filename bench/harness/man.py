"""Man pages as plain text: the one renderer the benches read them through (``bench.highlights``' questions, the
scale corpus's man pages). man-db renders, ``-P cat`` without a pager, formatting off and any overstrike left
removed; nothing of a page's text is stored in the repository."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

_OVERSTRIKE = re.compile(r".\x08")


def render_man(page: str | Path, width: int = 80, *, justify: bool = True, timeout_s: float = 60.0) -> str | None:
    """The page ``page`` (a name man looks up, or a :class:`~pathlib.Path` to a page file, read with ``-l``) as
    text ``width`` columns wide; None when it is not installed, cannot be rendered or takes over ``timeout_s``.
    ``justify=False``: no hyphenation, no justification (``--nh --nj``): with a wide ``width`` one line per
    paragraph, which is what a passage cutter wants."""
    env = {**os.environ, "MANWIDTH": str(width), "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
    args = ["man", *(() if justify else ("--nh", "--nj")), "-P", "cat"]
    args += ["-l", str(page)] if isinstance(page, Path) else [page]
    try:
        r = subprocess.run(args, capture_output=True, env=env, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout:
        return None
    return _OVERSTRIKE.sub("", r.stdout.decode("utf-8", errors="replace"))
