"""Fuzzing the file readers: seeded inputs built from nested, repeated and unclosed constructs (a line of 50,000
``[``, ``**a `` x 12,500, 100 KB of unclosed ``<!--``, deep nesting, long lines, compressed PDF streams that inflate
past pypdf's limits, page trees that repeat one node). Each input must give text or a skip with its reason
(:class:`Unreadable`), never another exception, within a time and a memory bound per byte of input.

The bounds are generous (5-10x what this machine measures, on two shared cores) and still far below what the former
readers cost: the former markdown rules took 17 s on the 50,000 ``[``, the standard library's HTML parser seconds on
the unclosed ``<!--``. Memory is the process's peak RSS over its RSS before each read (Linux resets the peak through
``/proc/self/clear_refs``), so it counts what the C parsers (lxml, zlib) allocate as well as Python objects.
The inputs are those of :func:`text_inputs` and :func:`pdf_inputs` (counted per reader for the issue's closing
note: ``len(text_inputs(random.Random(SEED)))``).
"""

from __future__ import annotations

import random
import re
import time
import zlib
from pathlib import Path

import pytest

from index_builder.documents.readers import Extracted, Unreadable, read_file

SEED = 51
MiB = 2**20
# reader suffix -> (CPU seconds, CPU seconds per input byte, memory bytes, memory bytes per input byte)
BOUNDS = {
    ".md": (0.5, 60e-6, 64 * MiB, 600),  # markdown-it-py: ~8 us and ~60 bytes a byte here on a line of 50,000 '['
    ".rst": (0.5, 20e-6, 64 * MiB, 200),
    ".html": (0.5, 10e-6, 64 * MiB, 400),  # lxml: microseconds a kilobyte
    ".txt": (0.5, 10e-6, 64 * MiB, 64),  # the charset detection of 100 KB of Latin-1 is the slowest
    # pypdf inflates a stream up to its 75 MB limit before refusing it, whatever the input's size: the base holds that
    ".pdf": (3.0, 40e-6, 320 * MiB, 400),
}


# ---------------------------------------------------------------------- PDF files built byte by byte

def raw_pdf(objects: list[bytes]) -> bytes:
    """A PDF whose object ``i + 1`` is ``objects[i]`` (object 1 the catalog), with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def stream(data: bytes, deflated: bool = True) -> bytes:
    head = b"<< /Length %d /Filter /FlateDecode >>" % len(data) if deflated else b"<< /Length %d >>" % len(data)
    return head + b"\nstream\n" + data + b"\nendstream"


def deflate(prefix: bytes, fill: bytes, size: int, suffix: bytes = b"") -> bytes:
    """``prefix + fill * (size // len(fill)) + suffix`` deflated without holding it: 1 GiB of zeros deflates to 1 MiB."""
    c = zlib.compressobj(6)
    parts = [c.compress(prefix)]
    block = fill * max(1, (1 << 20) // len(fill))
    done = 0
    while done < size:
        part = block[:size - done]
        parts.append(c.compress(part))
        done += len(part)
    parts += [c.compress(suffix), c.flush()]
    return b"".join(parts)


FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def pages_pdf(contents: list[bytes], deflated: bool = True) -> bytes:
    """A PDF of one page per content stream (given deflated when ``deflated``), Helvetica as /F1."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", FONT]
    kids = []
    for c in contents:
        page = len(objs) + 1
        kids.append(b"%d 0 R" % page)
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                    b"/Contents %d 0 R >>" % (page + 1))
        objs.append(stream(c, deflated))
    objs[1] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(contents)
    return raw_pdf(objs)


def text_page(text: str) -> bytes:
    return b"BT /F1 12 Tf 72 700 Td (" + text.encode("latin-1") + b") Tj ET"


def zip_bomb_pdf(inflated: int) -> bytes:
    """One page whose content stream is ``inflated`` bytes of zeros, deflated (1 GiB -> ~1 MiB)."""
    return pages_pdf([deflate(b"", b"\0", inflated)])


def text_bomb_pdf(pages: int, chars: int) -> bytes:
    """``pages`` pages each showing ``chars`` letters from a deflated stream (a few KB a page)."""
    return pages_pdf([deflate(b"BT /F1 12 Tf 72 700 Td (", b"a", chars, b") Tj ET") for _ in range(pages)])


def page_tree_bomb_pdf(fanout: int = 10, depth: int = 6) -> bytes:
    """A 1 KB page tree whose every level lists the next one ``fanout`` times: fanout**depth pages of one node."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    for level in range(depth):
        kid = len(objs) + 2
        objs.append(b"<< /Type /Pages /Kids [" + b" ".join([b"%d 0 R" % kid] * fanout) + b"] /Count %d >>"
                    % fanout ** (depth - level))
    leaf = len(objs) + 1
    objs.append(b"<< /Type /Page /MediaBox [0 0 612 792] /Contents %d 0 R >>" % (leaf + 1))
    objs.append(stream(b"BT /F1 12 Tf (x) Tj ET", deflated=False))
    return raw_pdf(objs)


# ---------------------------------------------------------------------- the inputs

def _soup(rng: random.Random, alphabet: list[str], low: int, high: int) -> str:
    n = rng.randint(low, high)
    out: list[str] = []
    size = 0
    while size < n:
        piece = rng.choice(alphabet) * (rng.randint(1, 40) if rng.random() < 0.1 else 1)
        out.append(piece)
        size += len(piece)
    return "".join(out)


_MD = ["[", "]", "(", ")", "![", "*", "**", "_", "__", "`", "```", "~~", "<", ">", "<!--", "-->", "<a href='", "</a>",
       "&amp;", "&#", "\\", "#", "# ", "- ", "1. ", "> ", "|", "|-", "\n", "\n\n", "    ", "  ", " ", "a", "word", "é",
       "[a]: ", "<div>", "\t", "=", "---", "<https://", "\r\n"]
_RST = [":", "`", "``", "*", "**", "_", "__", "<", ">", ":a:", "`a <", ">`_", ".. ", "..", "|", "=", "-", "~", "\n",
        "\n\n", "   ", " ", "a", "word", "::", ".. _x:", ".. note::", "é", "\t"]
_HTML = ["<", ">", "</", "<!--", "-->", "<a", "<div>", "</div>", "<p>", "<b>", "<i>", "<h1>", "</h1>", "<h2>",
         "<table>", "<tr>", "<td>", "<script>", "</script>", "<style>", "<title>", "<pre>", "&amp;", "&#", "&#x",
         "<![CDATA[", "]]>", "<?", "?>", "=", "'", '"', " ", "\n", "a", "word", "é", "<br/>", "<svg>", "<head>"]


def text_inputs(rng: random.Random) -> list[tuple[str, str, bytes]]:
    """(suffix, name, bytes) of the markup and text readers' inputs."""
    md = {
        "[ x 50,000": "[" * 50_000, "**a x 12,500": "**a " * 12_500, "![[ x 10,000": "![[" * 10_000,
        "[a]( x 8,000": "[a](" * 8_000, "*_ x 15,000": "*_" * 15_000, "` x 30,000": "`" * 30_000,
        "``a x 10,000": "``a" * 10_000, "unclosed <!-- x 8,000": "<!--" * 8_000, "<a x 10,000": "<a " * 10_000,
        "> x 10,000 nested quotes": "> " * 10_000 + "a", "- x 10,000 nested items": "- " * 10_000 + "a",
        "300 indented list levels": "".join("  " * i + "- a\n" for i in range(300)),
        "unclosed fence": "```\n" + "a\n" * 10_000, "# x 30,000": "# " + "#" * 30_000,
        "table of 5,000 columns": "|a" * 5_000 + "\n" + "|-" * 5_000 + "\n" + "|b" * 5_000,
        "&#x x 10,000": "&#x" * 10_000, "\\ x 30,000": "\\" * 30_000, "link definitions": "[a]: b\n" * 5_000,
        "_a x 10,000": "_a " * 10_000, "~~a x 10,000": "~~a " * 10_000, "< x 30,000": "<" * 30_000,
        "setext = x 30,000": "a\n" + "=" * 30_000, "front matter only": "---\n" + "title: x\n" * 5_000,
        "1 MB-class long line": "word " * 12_000,
    }
    rst = {
        ":a x 20,000": ":a" * 20_000, "`a< x 15,000": "`a<" * 15_000, "*a x 15,000": "*a " * 15_000,
        "``a x 10,000": "``a " * 10_000, "adornment x 30,000": "Title\n" + "=" * 30_000,
        "directive name": ".. " + "a:" * 20_000, "label": ".. _" + "a" * 30_000, "substitution": ".. |" + "a" * 30_000,
        "`a < x 10,000 then >": "`a <" * 10_000 + ">", "** x 20,000": "**" * 20_000,
        "roles x 8,000": ":py:func:`a` " * 8_000, "comment body": "..\n" + "   a\n" * 10_000,
    }
    html = {
        "unclosed <!-- 100 KB": "<!--" * 25_000, "<a x 50,000": "<a" * 50_000, "<div> x 20,000": "<div>" * 20_000,
        "<b><i> x 15,000": "<b><i>" * 15_000, "<table><tr><td> x 6,000": "<table><tr><td>" * 6_000,
        "unclosed <title>": "<title>" + "a" * 50_000, "unclosed <script>": "<script>" + "<" * 50_000,
        "&# x 25,000": "&#" * 25_000, "attributes x 12,000": "<p " + "a=b " * 12_000, "CDATA x 8,000": "<![CDATA[" * 8_000,
        "</ x 25,000": "</" * 25_000, "<h1> x 20,000": "<h1>" * 20_000, "<pre> x 10,000": "<pre>a" * 10_000,
        "xml declaration": '<?xml version="1.0" encoding="latin-1"?><html><body><p>é</p></body></html>',
    }
    text = {
        "900,000 spaces": " " * 900_000 + "a", "a line of 200,000": "a" * 200_000, "200,000 newlines": "\n" * 200_000,
        "control characters": "".join(chr(c) for c in range(1, 32) if c != 0) * 2_000,
        "\\r x 100,000": "\r" * 100_000, "form feeds": "\f a" * 30_000,
    }
    out = [(".md", k, v.encode()) for k, v in md.items()]
    out += [(".rst", k, v.encode()) for k, v in rst.items()]
    out += [(".html", k, v.encode()) for k, v in html.items()]
    out += [(".txt", k, v.encode()) for k, v in text.items()]
    out += [(".txt", "Latin-1, 100 KB", ("Café au lait, naïve façade. " * 3_600).encode("latin-1")),
            (".txt", "UTF-16 with BOM", "ü words ".encode("utf-16") * 2_000),
            (".txt", "a UTF-16 BOM then a lone surrogate", b"\xff\xfe\x00\xd8" * 1_000),
            (".md", "binary", bytes(range(256)) * 200)]
    for i in range(120):
        out.append((".md", f"random markdown {i}", _soup(rng, _MD, 50, 3_000).encode()))
    for i in range(80):
        out.append((".rst", f"random rst {i}", _soup(rng, _RST, 50, 3_000).encode()))
    for i in range(80):
        out.append((".html", f"random html {i}", _soup(rng, _HTML, 50, 5_000).encode()))
    for i in range(40):
        out.append((".txt", f"random bytes {i}", bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4_000)))))
    return out


def pdf_inputs(rng: random.Random) -> list[tuple[str, str, bytes]]:
    good = pages_pdf([text_page(f"Page {i} of a small report about stars.") for i in range(3)], deflated=False)
    out = [
        ("zip bomb: 100 MiB of zeros from 100 KB", zip_bomb_pdf(100 * MiB)),
        ("text bomb: 2,000,000 letters on one page from 3 KB", text_bomb_pdf(1, 2_000_000)),
        ("text bomb: 40 pages of 30,000 letters", text_bomb_pdf(40, 30_000)),
        ("page tree of one node a million times", page_tree_bomb_pdf()),
        ("nested arrays x 50,000 in a content stream", pages_pdf([b"[" * 50_000], deflated=False)),
        ("unbalanced ( x 50,000", pages_pdf([b"BT (" + b"(" * 50_000 + b" Tj ET"], deflated=False)),
        ("2,000 tiny pages", pages_pdf([text_page("x")] * 2_000, deflated=False)),
        ("a stream's /Length past the end", good.replace(b"/Length ", b"/Length 9", 1)),
        ("no cross-reference table", good[:good.index(b"xref")]),
        ("a good small PDF", good),
    ]
    for i in range(25):  # truncated anywhere
        out.append((f"truncated at a random byte {i}", good[:rng.randint(5, len(good) - 1)]))
    for i in range(25):  # bytes flipped anywhere
        b = bytearray(good)
        for _ in range(rng.randint(1, 20)):
            b[rng.randrange(len(b))] = rng.getrandbits(8)
        out.append((f"random bytes flipped {i}", bytes(b)))
    for i in range(10):
        out.append((f"random bytes after the header {i}",
                    b"%PDF-1.7\n" + bytes(rng.getrandbits(8) for _ in range(rng.randint(10, 5_000)))))
    return [(".pdf", k, v) for k, v in out]


def _peak_kb() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _rss_kb() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def fuzz(inputs: list[tuple[str, str, bytes]]) -> tuple[list[str], dict[str, str]]:
    """Read every input: the failures (an exception other than a skip, a bound exceeded) as lines, and the skip
    reason of each input skipped."""
    failures: list[str] = []
    reasons: dict[str, str] = {}
    for suffix, name, data in inputs:
        base_s, per_byte_s, base_mem, per_byte_mem = BOUNDS[suffix]
        memory = _reset_peak()
        before = _rss_kb()
        t = time.process_time()  # CPU seconds: the reader's work, not the shared box's load (wall time is 2-3x at load 15)
        try:
            out = read_file(Path("fuzz" + suffix), data)
            assert isinstance(out, Extracted) and all(isinstance(s, str) for s in out.sections)
            assert isinstance(out.title, str)
        except Unreadable as e:
            reasons[name] = str(e)
            assert reasons[name], name
        except Exception as e:  # noqa: BLE001 - the failure this test looks for
            failures.append(f"{suffix} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        took = time.process_time() - t
        if took > base_s + per_byte_s * len(data):
            failures.append(f"{suffix} {name}: {took:.2f} CPU s for {len(data):,} bytes")
        grown = (_peak_kb() - before) * 1024
        if memory and grown > base_mem + per_byte_mem * len(data):
            failures.append(f"{suffix} {name}: {grown / MiB:.0f} MiB for {len(data):,} bytes")
    return failures, reasons


@pytest.mark.parametrize("suffix", [".md", ".rst", ".html", ".txt"])
def test_markup_and_text_readers_answer_text_or_a_skip_in_bounded_time_and_memory(suffix):
    inputs = [x for x in text_inputs(random.Random(SEED)) if x[0] == suffix]
    assert len(inputs) >= 40
    failures, _ = fuzz(inputs)
    assert not failures, "\n".join(failures)


def test_pdf_reader_answers_text_or_a_skip_on_bombs_and_broken_files_in_bounded_time_and_memory():
    inputs = pdf_inputs(random.Random(SEED))
    failures, reasons = fuzz(inputs)
    assert not failures, "\n".join(failures)
    zip_bomb, one_page, forty_pages, tree = (reasons[name] for _, name, _ in inputs[:4])
    assert zip_bomb.startswith("PDF over a safety limit: Limit reached while decompressing")
    assert tree.startswith("PDF over a safety limit: Maximum page tree")
    assert one_page.startswith("over 1,000,000 characters of text by page 1;")  # counted before page 2 is read
    assert forty_pages.startswith("over 1,000,000 characters of text by page 34;")
