"""Every ``slow`` marker says why, on its own line (a comment: what makes the test long), so that the fast run
(``-m "not slow"``) tells what it leaves out; docs/development.md lists the slowest tests and how to list them."""

import re

from tests.helpers import REPO

MARKER = re.compile(r"pytest\.mark\.slow\b")


def test_every_slow_marker_gives_its_reason():
    bare = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code, _, comment = line.partition("#")
            if MARKER.search(code) and not comment.strip():
                bare.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not bare, "slow markers without a reason (a comment on the line):\n" + "\n".join(bare)
