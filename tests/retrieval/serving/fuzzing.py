"""A seeded request generator for the gRPC fuzz tests (``tests/test_fuzz.py``); a plain module, not collected.

Every case is the bytes of one request plus the call's metadata: typed requests (built with the generated
messages, with adversarial field values, then serialised) and raw payloads (random bytes, truncated or corrupted
messages, invalid UTF-8 in string fields, wrong wire types, groups nested past the parser's limit). All of them
go out through a channel without (de)serialisers, so the client never rejects what the server should.

Each case has a ``kind`` (``Method:generator``) and a short ``note`` of the adversarial choices it made, so that a
failing status can be reported as (kind -> code) with one reproducible example.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from retrieval.api import retriever_pb2 as pb
from tests.helpers import ServeProcess

SERVICE_PATH = "/hybridrag.v1.Retriever/"
METHODS = ("Retrieve", "Generate", "Upsert", "Delete", "Rebuild", "GetIndexStatus")
STREAMING = frozenset({"Generate"})

# The keys the fuzz server is started with (FuzzServer writes them to its keys file).
API_KEYS: dict[str, list[str]] = {"key-acme": ["acme"], "key-two": ["globex", "initech"], "key-admin": ["*"]}
TENANT_OF_KEY = {"key-acme": "acme", "key-two": "globex", "key-admin": ""}

# Never an answer to any request, whatever its bytes: a bug in the server, not in the request.
FORBIDDEN = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS})
# The client's own RESOURCE_EXHAUSTED when the server's status details (grpc-message, percent-encoded) pass its
# metadata limits (8 KiB soft, 16 KiB hard): the caller never learns the real code. Details must stay short.
OVERSIZED_DETAILS = "received metadata size exceeds"

QUERIES = ("how do bees find flowers", "what is a light-year", "great red spot of jupiter", "inflation and interest",
           "how do vaccines work", "energy", "photosynthesis in plants", "who wrote the iliad")
STAGES = ("bm25", "dense", "late_interaction", "cross_encoder")
META_PAIRS = (("topic", "astronomy"), ("topic", "biology"), ("lang", "en"), ("source", "wiki"), ("year", "2020"))
LOOKALIKE_TENANTS = ("\u0430cme", "ACME", "Acme", "acme ", " acme", "acme\u200b", "\uff41\uff43\uff4d\uff45",
                     "acme\x00", "\x00acme", "acme\x00globex", "a\u0307cme", "*", "**", "%", "acme,globex")
INTERNAL_KEYS = ("\x00tenant", "\x00", "\x00tenant\x00", "tenant", "_id", "__class__", "\x00" * 8)
TRICKY = ("%s%s%n{0}{__class__}", "'; DROP TABLE documents; --", "../../etc/passwd", "\ufeff", "\uffff",
          "\U0010ffff", "\u202eevil\u202c", "e\u0301" * 50, "\U0001f41d" * 40, "\r\n\r\n", "\\x00", "null",
          "\u0000\u0001\u0002\u001b[31m", "\u2028\u2029", "\ud7ff\ue000", "\u0130\u0131\u00df\ufb00")

KB, MB = 1024, 1024 * 1024
# The unicode ranges strings are drawn from (no surrogates: those cannot be UTF-8; raw payloads cover that).
UNICODE_RANGES = ((0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
                  (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF),
                  (0xFE00, 0xFFFF), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF))


@dataclass(frozen=True)
class FuzzCase:
    """One request: ``payload`` goes to ``method`` as is; ``metadata`` is the call's (API key, ...)."""

    kind: str
    method: str
    payload: bytes
    metadata: tuple[tuple[str, str], ...] = ()
    note: str = ""

    @property
    def streaming(self) -> bool:
        return self.method in STREAMING

    def example(self, limit: int = 96) -> str:
        """A short reproducible description: the note, the metadata and the payload's first bytes (hex)."""
        head = self.payload[:limit].hex()
        more = f"...({len(self.payload)} bytes)" if len(self.payload) > limit else ""
        note = self.note if len(self.note) <= 160 else self.note[:160] + "..."
        metadata = [(k, v if len(v) <= 40 else v[:40] + f"...({len(v)})") for k, v in self.metadata]
        return f"{self.kind} [{note}] metadata={metadata} payload={head}{more}"


@dataclass
class Outcome:
    case: FuzzCase
    code: grpc.StatusCode
    details: str
    seconds: float
    hung: bool = False  # the call outlived its own deadline (plus slack): a hang


@dataclass
class _Picks:
    """The adversarial choices made while building one typed request (its ``note``)."""

    tags: list[str] = field(default_factory=list)

    def add(self, tag: str) -> None:
        if tag and tag not in self.tags:
            self.tags.append(tag)

    def __str__(self) -> str:
        return ",".join(self.tags) or "plain"


class RequestFuzzer:
    """Seeded: the same seed gives the same sequence of cases. ``big_every``: about one in this many adversarial
    strings is 1-4 MiB (all others stay small, so thousands of calls stay fast). ``max_rebuilds``: how many
    Rebuild calls may carry the all-tenants key (each one really rebuilds the index: seconds, and hundreds of MB
    of RSS the first times); the others are refused (wrong key, undecodable)."""

    def __init__(self, seed: int = 1234, *, big_every: int = 600, max_rebuilds: int = 0,
                 queries: Sequence[str] = QUERIES) -> None:
        self.rng = random.Random(seed)
        self.big_every = big_every
        self.rebuilds_left = max_rebuilds
        self.queries = tuple(queries)
        self.seen_ids: list[str] = ["astro-001", "fuzz-0"]

    # ------------------------------------------------------------------ strings and numbers

    def _big(self) -> bool:
        return self.rng.randrange(self.big_every) == 0

    def _unicode(self, n: int) -> str:
        rng = self.rng
        out = []
        for _ in range(n):
            lo, hi = rng.choice(UNICODE_RANGES)
            out.append(chr(rng.randint(lo, hi)))
        return "".join(out)

    def string(self, picks: _Picks, *, normal: Callable[[], str], name: str, long_ok: bool = True) -> str:
        """A string for field ``name``: usually ``normal()``, otherwise an adversarial one (tagged in ``picks``)."""
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            return normal()
        choice = rng.randrange(11)
        picks.add(f"{name}:" + ("empty", "blank", "unicode", "nul", "control", "tricky", "lookalike", "long",
                                "huge", "mixed", "repeat")[choice])
        if choice == 0:
            return ""
        if choice == 1:
            return rng.choice((" ", "\t\n ", "\u00a0\u3000", "\u200b\u200c\u200d"))
        if choice == 2:
            return self._unicode(rng.randint(1, 200))
        if choice == 3:
            s = normal()
            i = rng.randint(0, len(s))
            return s[:i] + "\x00" * rng.randint(1, 3) + s[i:]
        if choice == 4:
            return "".join(chr(rng.randrange(0, 32)) for _ in range(rng.randint(1, 40))) + normal()
        if choice == 5:
            return rng.choice(TRICKY)
        if choice == 6:
            return rng.choice(LOOKALIKE_TENANTS)
        if choice == 7:
            return rng.choice("xé🐝") * rng.choice((257, 1001, 2049, 4097))
        if choice == 8:
            if long_ok and self._big():
                picks.add(f"{name}:MiB")
                return "y" * rng.randint(1 * MB, 4 * MB)
            if long_ok and rng.random() < 0.2:
                return "z" * rng.randint(64 * KB, 256 * KB)
            return "z" * rng.randint(8 * KB, 20 * KB)
        if choice == 9:
            return normal() + self._unicode(rng.randint(1, 30)) + normal()
        return normal() * rng.randint(2, 50)

    def integer(self, picks: _Picks, name: str, normal: Sequence[int]) -> int:
        rng = self.rng
        if rng.random() < 0.6:
            return rng.choice(normal)
        v = rng.choice((-1, -2**31, 2**31 - 1, 101, 1001, 10**6, -(10**6), rng.randint(-2**31, 2**31 - 1)))
        picks.add(f"{name}={v}")
        return v

    # ------------------------------------------------------------------ metadata

    def metadata(self, picks: _Picks, *, admin: bool = False, allow_admin: bool = True) -> tuple[tuple[str, str], ...]:
        """The call's credentials; ``admin``: the all-tenants key; ``allow_admin``: it may be picked at random."""
        rng = self.rng
        r = rng.random()
        if admin:
            return (("x-api-key", "key-admin"),)
        keys = ("key-acme", "key-acme", "key-two") + (("key-admin",) if allow_admin else ())
        if r < 0.55:
            return (("x-api-key", rng.choice(keys)),)
        if r < 0.62:
            return (("authorization", "Bearer " + rng.choice(keys[1:] + ("nope", ""))),)
        choice = rng.randrange(7)
        picks.add("auth:" + ("none", "unknown", "empty", "long", "case", "space", "both")[choice])
        if choice == 0:
            return ()
        if choice == 1:
            return (("x-api-key", "nope-" + str(rng.randrange(10**6))),)
        if choice == 2:
            return (("x-api-key", ""),)
        if choice == 3:
            return (("x-api-key", "k" * rng.choice((256, 2048, 4000))),)
        if choice == 4:
            return (("x-api-key", "KEY-ACME"),)
        if choice == 5:
            return (("x-api-key", " key-acme "),)
        return (("x-api-key", "nope"), ("authorization", "Bearer " + keys[-1]))

    def tenant(self, picks: _Picks, metadata: tuple[tuple[str, str], ...]) -> str:
        key = dict(metadata).get("x-api-key", "")
        rng = self.rng
        if rng.random() < 0.5:
            return TENANT_OF_KEY.get(key, rng.choice(("acme", "globex", "initech", "")))
        return self.string(picks, name="tenant",
                           normal=lambda: rng.choice(("", "acme", "globex", "initech", "*", "\x00tenant")))

    # ------------------------------------------------------------------ typed requests

    def filters(self, picks: _Picks) -> dict[str, str]:
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            return {}
        if r < 0.7:
            return dict(rng.sample(META_PAIRS, rng.randint(1, 2)))
        n = rng.choice((1, 3, 16, 17, 40, 200))
        if n > 16:
            picks.add(f"filters:{n}")
        long_ok = n <= 3  # many filters: each one short, so the payload stays small
        out: dict[str, str] = {}
        for _ in range(n):
            k = rng.random()
            if k < 0.3:
                key = rng.choice(INTERNAL_KEYS)
                picks.add("filters:internal-key")
            else:
                key = self.string(picks, name="filter-key", normal=lambda: rng.choice(("topic", "lang", "source")),
                                  long_ok=long_ok)
            out[key] = self.string(picks, name="filter-value", long_ok=long_ok,
                                   normal=lambda: rng.choice(("astronomy", "en", "wiki", "acme")))
        return out

    def stage_options(self, picks: _Picks) -> pb.StageOptions:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            stages: list[str] = []
        elif r < 0.8:
            stages = rng.sample(STAGES, rng.randint(1, 4))
        elif r < 0.97:
            stages = [rng.choice(STAGES + ("splade", "BM25", "bm25\x00", "", "fused", "dense " * 3))
                      for _ in range(rng.randint(1, 12))]
            picks.add("stages:odd")
        else:
            n = rng.choice((1000, 10_000, 100_000))
            stages = [rng.choice(STAGES) if rng.random() < 0.5 else f"stage-{i}" for i in range(n)]
            picks.add(f"stages:{n}")
        return pb.StageOptions(stages=stages, candidates=self.integer(picks, "candidates", (0, 0, 10, 100, 1000)),
                               li_top_k=self.integer(picks, "li_top_k", (0, 0, 5, 50, 100)),
                               ce_top_k=self.integer(picks, "ce_top_k", (0, 0, 0, 5)))

    def retrieve_request(self, picks: _Picks, metadata: tuple[tuple[str, str], ...]) -> pb.RetrieveRequest:
        rng = self.rng
        return pb.RetrieveRequest(
            query=self.string(picks, name="query", normal=lambda: rng.choice(self.queries)),
            top_k=self.integer(picks, "top_k", (0, 1, 5, 10, 100)), tenant=self.tenant(picks, metadata),
            filters=self.filters(picks), options=self.stage_options(picks) if rng.random() < 0.6 else None,
            bypass_cache=rng.random() < 0.3)

    def document(self, picks: _Picks, tenant: str) -> pb.Document:
        rng = self.rng

        def new_id() -> str:
            i = f"fuzz-{rng.randrange(400)}"
            self.seen_ids.append(i)
            return i

        def text() -> str:
            return " ".join(rng.choice(("bees", "pollen", "stars", "orbit", "tax", "law", "rain", "protein"))
                            for _ in range(rng.randint(3, 40)))

        meta: dict[str, str] = {}
        if rng.random() < 0.4:
            meta = {self.string(picks, name="meta-key", normal=lambda: rng.choice(("topic", "lang")), long_ok=False):
                    self.string(picks, name="meta-value", normal=lambda: "fuzz", long_ok=False)
                    for _ in range(rng.choice((1, 2, 65, 100)))}
        body = text()
        r = rng.random()
        if r < 0.08:
            body = rng.choice(("", " ", "\x00", "\t\n"))
            picks.add("text:empty")
        elif r < 0.15:
            body = self._unicode(rng.randint(1, 300))
            picks.add("text:unicode")
        elif r < 0.155:
            body = "w " * 500_001  # over the store's 1,000,000 characters: refused before any encoding
            picks.add("text:over-limit")
        return pb.Document(id=self.string(picks, name="id", normal=new_id, long_ok=False),
                           title=self.string(picks, name="title", normal=lambda: "Fuzz title", long_ok=False),
                           text=body, tenant=tenant if rng.random() < 0.8 else self.tenant(picks, ()),
                           metadata=meta)

    def typed(self, method: str) -> FuzzCase:
        rng = self.rng
        picks = _Picks()
        admin = method == "Rebuild" and self.rebuilds_left > 0 and rng.random() < 0.5
        if admin:
            self.rebuilds_left -= 1
            picks.add("rebuild:admin")
        metadata = self.metadata(picks, admin=admin, allow_admin=method != "Rebuild")
        msg: object
        if method == "Retrieve":
            msg = self.retrieve_request(picks, metadata)
        elif method == "Generate":
            msg = pb.GenerateRequest(retrieve=self.retrieve_request(picks, metadata),
                                     max_tokens=self.integer(picks, "max_tokens", (0, 1, 16, 64)))
        elif method == "Upsert":
            tenant = TENANT_OF_KEY.get(dict(metadata).get("x-api-key", ""), "acme") or "acme"
            n = rng.choice((0, 1, 1, 1, 2, 3, 5, 8)) if rng.random() < 0.95 else rng.choice((30, 1001))
            if n < 30:
                docs = [self.document(picks, tenant) for _ in range(n)]
            else:  # many documents, each tiny (a valid batch is embedded, which takes time)
                picks.add(f"documents:{n}")
                docs = [pb.Document(id=f"fuzz-many-{i}", text="tiny", tenant=tenant) for i in range(n)]
            if docs and rng.random() < 0.15:
                docs.append(pb.Document(id=docs[0].id, text="duplicate id", tenant=docs[0].tenant))
                picks.add("documents:duplicate-id")
            msg = pb.UpsertRequest(documents=docs)
        elif method == "Delete":
            n = rng.choice((0, 1, 1, 2, 5)) if rng.random() < 0.95 else rng.choice((1000, 1001, 5000))
            if n > 5:
                picks.add(f"ids:{n}")
            ids = [self.string(picks, name="id", normal=lambda: rng.choice(self.seen_ids), long_ok=False)
                   for _ in range(min(n, 20))]
            ids += [f"fuzz-missing-{i}" for i in range(n - len(ids))]
            if ids and rng.random() < 0.2:
                ids += ids[:3]
                picks.add("ids:duplicated")
            msg = pb.DeleteRequest(ids=ids, tenant=self.tenant(picks, metadata))
        elif method == "Rebuild":
            msg = pb.RebuildRequest()
        else:
            msg = pb.GetIndexStatusRequest()
        payload = msg.SerializeToString()  # type: ignore[attr-defined]
        kind = f"{method}:typed"
        if rng.random() < 0.1:  # unknown fields (every wire type) must be skipped, not refused
            payload += rng.choice((b"\xf8\x06\x01", b"\xfa\x06\x03abc", b"\xfd\x06\x00\x00\x80\x3f",
                                   b"\xf9\x06" + b"\x00" * 8, b"\xa0\x1f\x96\x01"))
            kind += "+unknown-field"
        return FuzzCase(kind, method, payload, metadata, str(picks))

    # ------------------------------------------------------------------ raw payloads

    def _valid_bytes(self, method: str) -> bytes:
        """A small, valid serialised request for ``method`` (the base that raw cases corrupt)."""
        rng = self.rng
        retrieve = pb.RetrieveRequest(query=rng.choice(self.queries), top_k=5, tenant="acme", filters={"lang": "en"},
                                      options=pb.StageOptions(stages=["bm25", "dense"], candidates=50))
        msg = {"Retrieve": retrieve, "Generate": pb.GenerateRequest(retrieve=retrieve, max_tokens=8),
               "Upsert": pb.UpsertRequest(documents=[pb.Document(id="fuzz-raw", text="raw bees", tenant="acme",
                                                                 metadata={"topic": "biology"})]),
               "Delete": pb.DeleteRequest(ids=["fuzz-raw", "fuzz-1"], tenant="acme"),
               "Rebuild": pb.RebuildRequest(), "GetIndexStatus": pb.GetIndexStatusRequest()}[method]
        return msg.SerializeToString()  # type: ignore[attr-defined]

    def raw(self, method: str) -> FuzzCase:
        rng = self.rng
        choice = rng.randrange(12)
        if choice == 0:
            name, payload = "random", rng.randbytes(rng.randint(0, 64))
        elif choice == 1:
            base = self._valid_bytes(method) or b"\x0a\x05hello"
            name, payload = "truncated", base[:rng.randint(0, max(0, len(base) - 1))]
        elif choice == 2:
            base = bytearray(self._valid_bytes(method) or b"\x0a\x05hello")
            for _ in range(rng.randint(1, 4)):
                base[rng.randrange(len(base))] = rng.randrange(256)
            name, payload = "bit-flipped", bytes(base)
        elif choice == 3:
            name, payload = "invalid-utf8", self._invalid_utf8(method)
        elif choice == 4:  # a known field with the wrong wire type (a string sent as a varint, a fixed64, ...)
            name = "wrong-wire-type"
            payload = rng.choice((b"\x08\x01", b"\x09" + b"\x00" * 8, b"\x0d\x00\x00\x00\x00", b"\x10\x05\x12\x01x",
                                  b"\x1a\x02\x08\x01", b"\x20\xff\xff\xff\xff\x0f", b"\x22\x02\x08\x01",
                                  b"\x2a\x02\x0a\x80", b"\x0a\x02\x08\x96"))
        elif choice == 5:  # a length prefix past the end, or an over-long varint
            name = "bad-length"
            payload = rng.choice((b"\x0a\xff\xff\xff\xff\x07abc", b"\x0a\x10abc", b"\x10" + b"\xff" * 11,
                                  b"\x0a", b"\x12\x80", b"\x22\x7f" + b"\x0a\x01",
                                  b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
        elif choice == 6:  # groups nested past the parser's recursion limit, and an unmatched end-group
            name = "deep-nesting"
            depth = rng.choice((50, 101, 1000, 20_000))
            payload = rng.choice((b"\x0b" * depth, b"\x2a\x00" + b"\x0c", b"\xfb\x06" * depth + b"\xfc\x06" * depth))
        elif choice == 7:  # a tag with field number 0, or one past the largest field number
            name = "bad-tag"
            payload = rng.choice((b"\x00", b"\x00\x00", b"\x02\x00", b"\xf8\xff\xff\xff\x7f\x01",
                                  b"\xff\xff\xff\xff\xff\x01", b"\x07"))
        elif choice == 8:  # valid bytes for another method's message
            other = rng.choice(METHODS)
            name, payload = f"as-{other}", self._valid_bytes(other)
        elif choice == 9:  # a packed/repeated field abused: thousands of empty stage strings, map entries
            name = "many-small-fields"
            n = rng.choice((100, 5000, 50_000))
            payload = rng.choice((b"\x2a" + _varint(2 * n) + b"\x0a\x00" * n,
                                  b"\x22\x04\x0a\x00\x12\x00" * n, b"\x0a\x00" * n))
        elif choice == 10 and self._big():
            name, payload = "random-MiB", rng.randbytes(rng.randint(1 * MB, 3 * MB))
        else:
            name, payload = "valid", self._valid_bytes(method)
        picks = _Picks()
        admin = method == "Rebuild" and name in ("valid", "random") and self.rebuilds_left > 0 and rng.random() < 0.3
        if admin:
            self.rebuilds_left -= 1
        metadata = self.metadata(picks, admin=admin, allow_admin=method != "Rebuild")
        return FuzzCase(f"{method}:raw:{name}", method, payload, metadata, str(picks))

    def _invalid_utf8(self, method: str) -> bytes:
        """A request whose string field (top level, nested, in a map key or value) is not UTF-8."""
        rng = self.rng
        bad = rng.choice((b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"ok\x80",
                          b"\xe2\x82", b"\xf8\x88\x80\x80\x80"))

        def string(field_number: int, value: bytes) -> bytes:
            return _tag(field_number, 2) + _varint(len(value)) + value

        retrieve = rng.choice((
            string(1, bad),  # query
            string(1, b"bees") + string(3, bad),  # tenant
            string(1, b"bees") + string(4, string(1, bad) + string(2, b"x")),  # a filter key
            string(1, b"bees") + string(4, string(1, b"lang") + string(2, bad)),  # a filter value
            string(1, b"bees") + string(5, string(1, bad)),  # a stage name
        ))
        if method == "Generate":
            return string(1, retrieve)
        if method == "Upsert":
            doc = rng.choice((string(1, bad), string(1, b"fuzz-u") + string(3, bad), string(1, b"fuzz-u") + string(
                4, bad), string(1, b"fuzz-u") + string(5, string(1, b"k") + string(2, bad))))
            return string(1, doc)
        if method == "Delete":
            return rng.choice((string(1, bad), string(1, b"fuzz-1") + string(2, bad)))
        if method in ("Rebuild", "GetIndexStatus"):
            return string(1, bad)  # an unknown field: skipped
        return retrieve

    # ------------------------------------------------------------------ the stream of cases

    def case(self) -> FuzzCase:
        rng = self.rng
        method = rng.choices(METHODS, weights=(50, 8, 14, 10, 0.6, 6))[0]
        return self.raw(method) if rng.random() < 0.35 else self.typed(method)

    def cases(self, n: int) -> Iterator[FuzzCase]:
        for _ in range(n):
            yield self.case()


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field_number: int, wire_type: int) -> bytes:
    return _varint(field_number << 3 | wire_type)


# ---------------------------------------------------------------------- sending

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 32 * MB), ("grpc.max_receive_message_length", 32 * MB),
                   ("grpc.enable_retries", 0)]


async def send(channel: grpc.aio.Channel, case: FuzzCase, timeout: float) -> Outcome:
    """Send one case as raw bytes; the outcome's code (OK or the error's), never an exception."""
    path = SERVICE_PATH + case.method
    t0 = time.perf_counter()
    slack = timeout + 10.0  # past the call's own deadline: the client gave up waiting, a hang
    try:
        if case.streaming:
            call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)(
                case.payload, timeout=timeout, metadata=case.metadata)

            async def drain() -> None:
                async for _ in call:
                    pass

            await asyncio.wait_for(drain(), slack)
        else:
            call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            await asyncio.wait_for(call(case.payload, timeout=timeout, metadata=case.metadata), slack)
        return Outcome(case, grpc.StatusCode.OK, "", time.perf_counter() - t0)
    except grpc.aio.AioRpcError as e:
        return Outcome(case, e.code(), e.details() or "", time.perf_counter() - t0)
    except TimeoutError:
        return Outcome(case, grpc.StatusCode.DEADLINE_EXCEEDED, "client-side wait_for expired",
                       time.perf_counter() - t0, hung=True)


async def run_cases(target: str, cases: Sequence[FuzzCase], *, clients: int = 4, per_client: int = 2,
                    timeout: float = 20.0, rebuild_timeout: float = 90.0) -> list[Outcome]:
    """Send ``cases`` from ``clients`` channels, ``per_client`` calls in flight on each; outcomes in case order.
    Each call has a deadline: ``timeout`` seconds (``rebuild_timeout`` for Rebuild)."""
    channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(clients)]
    results: list[Outcome | None] = [None] * len(cases)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(cases)):
        queue.put_nowait(i)

    async def worker(channel: grpc.aio.Channel) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results[i] = await send(channel, cases[i], rebuild_timeout if cases[i].method == "Rebuild" else timeout)

    try:
        await asyncio.gather(*(worker(ch) for ch in channels for _ in range(per_client)))
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    return [r for r in results if r is not None]


def summarize(outcomes: Sequence[Outcome]) -> Counter[tuple[str, str]]:
    """(kind, code name) -> count."""
    return Counter((o.case.kind, o.code.name) for o in outcomes)


def forbidden(outcomes: Sequence[Outcome]) -> dict[tuple[str, str], Outcome]:
    """One example outcome per (kind, code) whose code is never acceptable, whose call hung, or whose status
    details were too long for the client to receive."""
    out: dict[tuple[str, str], Outcome] = {}
    for o in outcomes:
        if o.code in FORBIDDEN or o.hung or OVERSIZED_DETAILS in o.details:
            flag = " (hung)" if o.hung else " (details too long)" if OVERSIZED_DETAILS in o.details else ""
            out.setdefault((o.case.kind, o.code.name + flag), o)
    return out


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (``VmRSS`` in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class FuzzServer(ServeProcess):
    """The target both fuzzers share (one a session: ``fuzz_server`` in tests/conftest.py), ``hybridrag serve`` as
    users run it: a copy of the writable template's store and snapshot, ``--store --config --http-port 0``, the
    keys of :data:`API_KEYS` bound to tenants, no generator (Generate answers UNAVAILABLE, the HTTP generation
    routes 503), no background rebuilds (only the fuzzers' Rebuild calls). Every allocation of 128 KiB or more gets
    its own mapping, returned to the OS when freed (glibc raises this threshold by itself as large blocks are freed,
    and then keeps them in the heap): RSS measures what is held, not the high-water mark of the 1-16 MiB requests."""

    def __init__(self, root: Path, template: Path) -> None:
        shutil.copy2(template / "store.db", root / "store.db")
        shutil.copytree(template / "index", root / "index")
        keys = root / "keys.json"
        keys.write_text(json.dumps(API_KEYS))
        config = root / "fuzz.toml"
        config.write_text(f"[server]\napi_keys_file = {json.dumps(str(keys))}\n\n"
                          "[live]\nrebuild_after_writes = 0\nrebuild_after_s = 0\n\n"
                          "[generation.embedded]\nenabled = false\n")
        super().__init__(["--index", str(root / "index"), "--store", str(root / "store.db"), "--config", str(config),
                          "--http-port", "0"], env={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}, clean_env=True)
        m = re.search(r"HTTP on (http://[\w.:\[\]]+)", self.text())
        if not m:
            self.kill()
            raise AssertionError("no HTTP door in the log:\n" + self.text())
        self.http_url = m.group(1)

    @property
    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def warm(self) -> None:
        """One query through each door: the models loaded, the first calls' lazy initialisation done."""
        import httpx

        with grpc.insecure_channel(self.target) as ch:
            ch.unary_unary(SERVICE_PATH + "Retrieve")(
                pb.RetrieveRequest(query=QUERIES[0], top_k=5, tenant="acme").SerializeToString(),
                metadata=(("x-api-key", "key-acme"),), timeout=60)
        r = httpx.post(self.http_url + "/v1/retrieve", headers={"x-api-key": "key-acme"}, timeout=60,
                       json={"query": QUERIES[0], "top_k": 5, "tenant": "acme"})
        assert r.status_code == 200, (r.status_code, r.text[:500])
