"""A seeded raw-body fuzzer for the HTTP door (``tests/retrieval/serving/test_http_fuzz.py``); a plain module, not
collected. The HTTP twin of :mod:`tests.retrieval.serving.fuzzing` (the gRPC one).

Every case is one request to a route that takes a body (``POST``/``DELETE``), as bytes: the body is written as
JSON text by hand where ``json.dumps`` cannot say it (``NaN``, ``1e999``, 5,000-digit integers, duplicate keys,
lone surrogate escapes, nesting 100,000 deep), then encoded (UTF-8, or UTF-16/32, latin-1, invalid or overlong
UTF-8 on purpose). It goes out over httpx (a keep-alive client, ``content-length``), or over a raw socket where
httpx cannot send it: chunked, truncated (``content-length`` past what is sent, then a close or a half-close), a
declared length over the limit with no body, malformed framing.

Each case has a ``kind`` (``route:category[:detail]``), a short ``note``, and, where the door's rules decide it
whatever the core does, the statuses it must get (``expect``): 401 without a valid key (before the body is looked
at), 415 for a body that is not ``application/json`` in UTF-8, 413 over ``max_body_mb``, 400 for a body the bounded
JSON parser refuses (nesting past 32, integers past 19 digits, non-finite numbers, lone surrogates, not UTF-8).
"""

from __future__ import annotations

import copy
import http.client
import json
import random
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.retrieval.serving.fuzzing import MB

FILL = b"@@FILL@@"
MAX_BODY = 16 * MB  # [http] max_body_mb's default
MAX_DEPTH = 32  # retrieval/serving/http/body.py: deeper bodies are refused
JSON_CT = "application/json"

ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/retrieve"), ("POST", "/v1/generate"), ("POST", "/v1/documents"), ("DELETE", "/v1/documents"),
    ("POST", "/v1/rebuild"), ("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings"), ("POST", "/v1/rerank"))
# Routes that answer from the generator: without one (the fuzz server has none) 503 is their right answer.
GENERATION_PATHS = frozenset({"/v1/generate", "/v1/chat/completions"})
# Routes whose body names a tenant: a key bound to other tenants gets 403.
TENANT_PATHS = frozenset({"/v1/retrieve", "/v1/generate", "/v1/documents", "/v1/chat/completions"})  # both methods

QUERIES = ("how do bees find flowers", "what is a light-year", "great red spot of jupiter", "inflation and interest",
           "how do vaccines work", "photosynthesis in plants", "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e", "\U0001f41d bees")


def route_name(method: str, path: str) -> str:
    return f"{method} {path}"


def base_body(method: str, path: str, rng: random.Random, n: int) -> Any:
    """A valid body for the route (every field it has, so that each one gets its wrong types); ``n`` numbers the
    documents it writes (ids ``fuzz-http-*``: the sample corpus is never deleted)."""
    q = rng.choice(QUERIES)
    retrieve = {"query": q, "top_k": 5, "tenant": "acme", "filters": {"lang": "en"},
                "options": {"stages": ["bm25", "dense"], "candidates": 50, "li_top_k": 10, "ce_top_k": 0},
                "bypass_cache": rng.random() < 0.5}
    if path == "/v1/retrieve":
        return retrieve
    if path == "/v1/generate":
        return {"retrieve": retrieve, "max_tokens": 8}
    if path == "/v1/documents" and method == "POST":
        return {"documents": [{"id": f"fuzz-http-{n % 300}", "title": "Fuzz title", "text": f"bees and pollen {q}",
                               "tenant": "acme", "metadata": {"topic": "biology"}}]}
    if path == "/v1/documents":
        return {"ids": [f"fuzz-http-{n % 300}", "fuzz-http-missing"], "tenant": "acme"}
    if path == "/v1/rebuild":
        return {}
    if path == "/v1/chat/completions":
        return {"model": "hybridrag", "messages": [{"role": "system", "content": "answer briefly"},
                                                   {"role": "user", "content": [{"type": "text", "text": q}]}],
                "stream": rng.random() < 0.3, "max_tokens": 8, "max_completion_tokens": 8, "n": 1,
                "stream_options": {"include_usage": True}, "retrieval": {"tenant": "acme", "top_k": 3}}
    if path == "/v1/embeddings":
        return {"input": [q, "pollen"], "model": "hybridrag", "encoding_format": rng.choice(("float", "base64")),
                "dimensions": 384}
    if path == "/v1/rerank":
        return {"query": q, "documents": ["bees find flowers by scent", {"text": "the red spot is a storm"}],
                "top_n": 2, "return_documents": True, "stage": "late_interaction", "model": ""}
    raise ValueError(path)


# ---------------------------------------------------------------------- cases and outcomes


@dataclass(frozen=True)
class HttpCase:
    """One request. ``wire``: ``httpx`` (content-length, keep-alive), ``raw`` (the same over a raw socket, for
    headers httpx will not send), ``chunked`` (raw socket), ``declared`` (raw:
    headers that declare ``content-length: declared``, no body), ``truncated-close`` / ``truncated-half`` (raw:
    part of the body, then close or shut down the sending half), ``framing`` (raw bytes after the headers as they
    are; uvicorn's parser answers, not the app). ``expect``: the statuses the door's rules allow (None: any but
    5xx)."""

    kind: str
    method: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    wire: str = "httpx"
    expect: frozenset[int] | None = None
    note: str = ""
    declared: int = 0
    raw_tail: bytes = b""
    fill: tuple[bytes, int] = (b"", 0)  # huge bodies: FILL in ``body`` stands for fill[0] * fill[1], made when sent
    query: str = ""  # a raw query string (percent-escapes as they are)

    @property
    def target(self) -> str:
        return self.path + ("?" + self.query if self.query else "")

    @property
    def route(self) -> str:
        return route_name(self.method, self.path)

    def payload(self) -> bytes:
        return self.body.replace(FILL, self.fill[0] * self.fill[1], 1) if self.fill[1] else self.body

    @property
    def size(self) -> int:
        return len(self.body) + (len(self.fill[0]) * self.fill[1] - len(FILL) if self.fill[1] else 0)

    def example(self, limit: int = 160) -> str:
        body = self.body[:limit]
        more = f"...({self.size} bytes)" if self.size > limit else ""
        headers = [(k, v if len(v) <= 60 else v[:60] + "...") for k, v in self.headers]
        extra = f" declared={self.declared}" if self.declared else ""
        target = self.target if len(self.target) <= 200 else self.target[:200] + f"...({len(self.target)} chars)"
        return (f"{self.method} {target} wire={self.wire}{extra} [{self.note[:160]}] headers={headers} "
                f"body={body!r}{more}")


@dataclass
class HttpOutcome:
    case: HttpCase
    status: int | None  # None: no answer (the connection closed, as a truncated request should)
    content_type: str = ""
    body: bytes = b""
    seconds: float = 0.0
    error: str = ""


# ---------------------------------------------------------------------- JSON written by hand


class Raw:
    """A JSON literal written as is (``NaN``, ``1e999``, a 5,000-digit integer, an escaped lone surrogate)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dump(value: Any) -> str:
    """``value`` as JSON text, with every :class:`Raw` written as its literal."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(v, dict):
            return {(swap(k) if isinstance(k, Raw) else k): swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=False)
    for i, r in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', r, 1)
    return text


def leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value`` (containers and leaves), the root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield (*prefix, k)
        yield from leaf_paths(v, (*prefix, k))


def set_path(value: Any, path: Sequence[Any], new: Any) -> Any:
    out = copy.deepcopy(value)
    target = out
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = new
    return out


def del_path(value: Any, path: Sequence[Any]) -> Any:
    out = copy.deepcopy(value)
    target = out
    for p in path[:-1]:
        target = target[p]
    del target[path[-1]]
    return out


JSON_TYPES: tuple[Any, ...] = (None, True, 7, "x", [], {})  # one of each JSON type
WRONG_VALUES: tuple[Any, ...] = (None, True, False, 0, -1, 1, 2**31, -(2**31) - 1, 2**63, 1.5, -0.0, 1e308, "",
                                 "x", "5", "\u0000", "true", [], [None], ["x"], [1], [[]], {}, {"a": 1},
                                 {"query": "x"}, {"type": "text", "text": "x"})
# Content parts of every wrong type (and wrong shape) for /v1/chat/completions.
WRONG_PARTS: tuple[Any, ...] = (
    None, True, 1, 1.5, "text", "", [], ["text"], {}, {"type": "text"}, {"type": "text", "text": None},
    {"type": "text", "text": 1}, {"type": "text", "text": ["x"]}, {"type": "text", "text": {"a": "b"}},
    {"type": "text", "text": "x", "extra": 1}, {"type": None, "text": "x"}, {"type": 5, "text": "x"},
    {"type": ["text"], "text": "x"}, {"type": {"text": 1}, "text": "x"}, {"type": "TEXT", "text": "x"},
    {"type": "text ", "text": "x"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, {"type": "file", "file": {}},
    {"type": "refusal", "refusal": "no"}, {"text": "x"}, {"type": "text", "text": Raw('"\\ud800"')},
)
WRONG_CONTENT: tuple[Any, ...] = (1, 1.5, True, {}, {"type": "text", "text": "x"}, [[]], [None], ["x"], [1],
                                  {"a": [1]}, "")
WRONG_ROLES: tuple[Any, ...] = (None, "", "USER", "bot", 1, [], {}, "user ", "system\u0000")

# Numbers: (literal, refused by the bounded parser (400 whatever the field)).
NUMBERS: tuple[tuple[str, bool], ...] = (
    ("1e999", True), ("-1e999", True), ("1E400", True), ("1e99999999999999999999", True),
    ("1" + "0" * 5000 + ".0", True), ("-" + "9" * 5000, True), ("1" + "0" * 30, True), ("9" * 20, True),
    ("-" + "9" * 20, True), ("1" + "0" * 4300, True), ("NaN", True), ("Infinity", True), ("-Infinity", True),
    ("-0", False), ("-0.0", False), ("0e0", False), ("9" * 19, False), ("-" + "9" * 19, False),
    ("9223372036854775807", False), ("9223372036854775808", False), ("-9223372036854775809", False),
    ("2147483647", False), ("2147483648", False), ("-2147483649", False), ("1.5", False), ("1e2", False),
    ("5e-324", False), ("1e-400", False), ("0." + "0" * 5000 + "1", False), ("1.7976931348623157e308", False),
    ("123456789012345678901234567890e-10", False), ("1e308", False), ("4e18", False),
)
# Not JSON at all: the parser refuses them (400).
NOT_JSON_NUMBERS = ("nan", "inf", "-inf", "+1", "01", ".5", "1.", "0x10", "1e", "--1", "Infinity1", "NaNa")

# Escapes: (JSON string literal, has a lone surrogate).
SURROGATES: tuple[tuple[str, bool], ...] = (
    ('"\\ud800"', True), ('"\\udfff"', True), ('"\\uDBFF"', True), ('"\\udc00\\ud800"', True),
    ('"bees \\ud83d"', True), ('"\\ude00 bees"', True), ('"\\ud83dx\\ude00"', True), ('"\\ud83d\\ud83d"', True),
    ('"a\\ud800b\\udc00c"', True), ('"\\ud83d\\ude00"', False), ('"\\uD83D\\uDE00 bees"', False),
    ('"\\udbff\\udfff"', False), ('"\\ud800\\udc00"', False),
)
# Bytes that are not UTF-8 (or not in the form RFC 3629 allows).
BAD_UTF8 = (b"\xff", b"\xfe", b"\xc3", b"\xc3(", b"\x80", b"\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
            b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf8\x88\x80\x80\x80",
            b"\xfc\x84\x80\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x90")
# content-type headers: (value or None for no header, accepted as JSON).
CONTENT_TYPES: tuple[tuple[str | None, bool], ...] = (
    (None, False), ("", False), ("text/plain", False), ("text/plain; charset=utf-8", False),
    ("application/x-www-form-urlencoded", False), ("multipart/form-data; boundary=xyz", False),
    ("application/xml", False), ("text/json", False), ("application/jsonx", False), ("application/json-seq", False),
    ("application/json-patch+json", False), ("application/merge-patch+json", False), ("application/*", False),
    ("*/*", False), ("json", False), ("application/json, text/plain", False), ("application/json;charset=utf-16", False),
    ("application/json; charset=UTF-16LE", False), ("application/json; charset=latin-1", False),
    ("application/json; charset=iso-8859-1", False), ("application/json; charset=utf-32", False),
    ("application/json; charset=", False), ("application/json; charset=ascii", False),
    ("application/json", True), ("APPLICATION/JSON", True), ("Application/Json", True),
    ("application/json; charset=utf-8", True), ("application/json;charset=UTF-8", True),
    ('application/json; charset="utf-8"', True), ("application/json; charset=utf8", True),
    ("application/json; foo=bar", True), ("  application/json  ", True), ("application/json;", True),
)
QUERY_STRINGS = (
    "ids=fuzz-http-1&ids=fuzz-http-2&tenant=acme", "ids=%ff&tenant=acme", "ids=%ed%a0%80&tenant=acme",
    "ids=%c0%af&tenant=acme", "ids=a%00b&tenant=acme", "tenant=%00", "tenant=acme&tenant=globex&ids=x", "foo=1",
    "ids", "ids=&tenant=acme", "%ff=1", "ids=x&tenant=%ed%a0%80", "ids=" + "x" * 5000 + "&tenant=acme", "MANY",
    "tenant=ACME&ids=x", "ids=x&tenant=*", "ids[]=x&tenant=acme", "ids=x;tenant=acme", "ids=%2F..%2F&tenant=acme",
    "ids=x&ids=x&tenant=acme", "=&=&", "&&&", "ids=%&tenant=acme", "ids=%zz&tenant=acme", "tenant=" + "a" * 70)
TIMEOUTS = ("inf", "Infinity", "-inf", "1e308", "1e400", "-0", "0", "1e-300", "nan", "NaN", "-1", " 5", "5e3",
            "9" * 22, "0x10", "1_000", "", "abc", "1e", "60000", "1", "0.5", "30000", "1" * 400)
ENCODINGS = ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-8-sig", "latin-1",
             "cp1252")


def _content_type_refused(value: str | None, size: int) -> bool:
    """Whether the door must answer 415: no ``content-type`` with a body, or one that is not JSON in UTF-8."""
    if value is None:
        return size > 0
    return not dict(CONTENT_TYPES).get(value, False)


# ---------------------------------------------------------------------- the generator


@dataclass
class _Auth:
    headers: tuple[tuple[str, str], ...]
    ok: bool  # a known key reaches the route
    tenant_ok: bool = True  # the key may act for tenant acme (the bodies' tenant)
    note: str = ""


@dataclass
class HttpFuzzer:
    """Seeded: the same seed gives the same cases. :meth:`cases` mixes ``n`` random cases (:data:`CATEGORIES`,
    weighted) with the fixed sets: every field as every JSON type, bodies at and over the 16 MiB limit (kept as a
    filler and a count until sent: a few hundred MB in all), megabyte values to be named in errors, bad framing."""

    seed: int = 4321
    rng: random.Random = field(init=False)
    n: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ keys

    def auth(self, path: str) -> _Auth:
        rng = self.rng
        r = rng.random()
        admin_ok = path != "/v1/rebuild"  # a rebuild with the all-tenants key really rebuilds: never fuzzed
        if r < 0.58:
            return _Auth((("x-api-key", "key-acme"),), True, note="key-acme")
        if r < 0.70 and admin_ok:
            return _Auth((("x-api-key", "key-admin"),), True, note="key-admin")
        if r < 0.78:
            return _Auth((("authorization", "Bearer key-acme"),), True, note="bearer key-acme")
        if r < 0.83:
            return _Auth((("x-api-key", "key-two"),), True, tenant_ok=False, note="key-two")
        bad = rng.choice(((), (("x-api-key", "nope"),), (("x-api-key", "KEY-ACME"),), (("x-api-key", "key-acme-"),),
                          (("authorization", "key-acme"),), (("authorization", "Basic a2V5LWFjbWU6"),),
                          (("authorization", "Bearer"),), (("authorization", "Bearer nope"),),
                          (("x-api-key", "k" * 5000),), (("x-api-key", "nope"), ("authorization", "Bearer key-acme"))))
        return _Auth(bad, False, note="auth:" + (",".join(f"{k}={v[:12]}" for k, v in bad) or "none"))

    # ------------------------------------------------------------------ one case

    def _case(self, category: str, method: str, path: str, auth: _Auth, body: bytes, *, refused: bool = False,
              content_type: str | None = JSON_CT, note: str = "", expect_ok: frozenset[int] | None = None,
              wire: str | None = None, declared: int = 0, raw_tail: bytes = b"",
              fill: tuple[bytes, int] = (b"", 0), query: str = "", headers_checked: bool = False) -> HttpCase:
        """A case; ``refused``: the bounded parser must refuse this body (400); ``expect_ok``: what a body that
        passes the door's checks must get (None: not decided here); ``headers_checked``: the route may refuse a
        header before it looks at the body (nothing decided past the door's own checks)."""
        rng = self.rng
        headers = auth.headers + ((("content-type", content_type),) if content_type is not None else ())
        if wire is None:
            wire = "chunked" if rng.random() < 0.08 else "httpx"
        size = declared or len(body) + len(fill[0]) * fill[1] - len(FILL) * bool(fill[1])
        if wire == "chunked":  # no content-length: a body is announced by transfer-encoding itself
            ctype_refused = content_type is None or not dict(CONTENT_TYPES).get(content_type, False)
        else:
            ctype_refused = _content_type_refused(content_type, size)
        if not auth.ok:
            expect: frozenset[int] | None = frozenset({401})
        elif ctype_refused:
            expect = frozenset({415})
        elif size > MAX_BODY:
            expect = frozenset({413})
        elif headers_checked:
            expect = None
        elif path == "/v1/rebuild":
            expect = frozenset({403})  # the body is never parsed; only a '*' key may rebuild (and none fuzzes)
        elif refused:
            expect = frozenset({400})
        elif expect_ok is not None:  # 429: admission (writes have a budget of their own), whatever the body
            expect = expect_ok | {429}
            if not auth.tenant_ok and path in TENANT_PATHS:
                expect = frozenset({400, 403, 429})
        else:
            expect = None
        kind = f"{route_name(method, path)}:{category}"
        return HttpCase(kind, method, path, body, headers, wire, expect, f"{auth.note}; {note}", declared, raw_tail,
                        fill, query)

    def _route(self) -> tuple[str, str]:
        return self.rng.choice(ROUTES)

    def _base(self, method: str, path: str) -> Any:
        self.n += 1
        return base_body(method, path, self.rng, self.n)

    @staticmethod
    def _valid_status(path: str) -> frozenset[int]:
        if path in GENERATION_PATHS:
            return frozenset({503})
        if path == "/v1/rebuild":
            return frozenset({403})
        return frozenset({200})

    def valid(self) -> HttpCase:
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        return self._case("valid", method, path, auth, dump(body).encode(), expect_ok=self._valid_status(path))

    def wrong_type(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        paths = list(leaf_paths(body))
        if not paths or rng.random() < 0.12:  # the whole body of a wrong type
            value = rng.choice(WRONG_VALUES)
            return self._case("wrong-type:body", method, path, auth, dump(value).encode(),
                              note=f"body={value!r:.60}")
        where = rng.choice(paths)
        value = rng.choice(WRONG_VALUES)
        return self._case("wrong-type", method, path, auth, dump(set_path(body, where, value)).encode(),
                          note=f"{'.'.join(map(str, where))}={value!r:.60}")

    def fields(self) -> HttpCase:
        """A field missing, unknown, in camelCase, or the body empty."""
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        choice = rng.randrange(5)
        paths = [p for p in leaf_paths(body) if not isinstance(p[-1], int)]
        if choice == 0 and paths:
            where = rng.choice(paths)
            out, note = dump(del_path(body, where)).encode(), f"missing {'.'.join(map(str, where))}"
        elif choice == 1 and isinstance(body, dict):
            key = rng.choice(("unknown", "queryy", "__proto__", "constructor", "", " ", "\u0000", "tenant\u0000",
                              "x" * 5000, "topK", "TOP_K", "documents ", "\u00e9"))
            out, note = dump({**body, key: rng.choice((1, "x", None, {}, []))}).encode(), f"unknown field {key!r:.40}"
        elif choice == 2:
            out, note = rng.choice((b"", b" ", b"\r\n", b"\t \n", b"{}", b"[]", b"null")), "empty-ish"
        elif choice == 3 and path in TENANT_PATHS:
            tenant = rng.choice(("globex", "", "*", "ACME", "acme\u0000", "\u0430cme", "acme ", "a" * 65, "..", "%"))
            out = json.dumps(body).replace('"tenant": "acme"', json.dumps({"tenant": tenant})[1:-1]).encode()
            note = f"tenant={tenant!r:.40}"
        else:
            mangled = json.dumps(body).replace("_", "").replace('"top', '"Top')
            out, note = mangled.encode(), "camel/mangled names"
        return self._case("fields", method, path, auth, out, note=note)

    def deep(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        depth = rng.choice((MAX_DEPTH + 1, MAX_DEPTH + 1, MAX_DEPTH + 2, 40, 64, 100, 1000, 10_000, 100_000,
                            MAX_DEPTH - 1, MAX_DEPTH))
        shape = rng.choice(("list", "object", "mixed", "open-list", "open-object"))
        where = rng.choice(("top", "field"))
        inner = depth - 1 if where == "field" else depth  # the body object itself is one level
        if shape == "list":
            text = "[" * inner + "1" + "]" * inner
        elif shape == "object":
            text = '{"a":' * inner + "1" + "}" * inner
        elif shape == "mixed":
            half = inner // 2
            text = '{"a":[' * half + ("[]" if inner % 2 else "0") + "]}" * half
        elif shape == "open-list":
            text = "[" * inner
        else:
            text = '{"a":' * inner
        if where == "field":
            body = self._base(method, path)
            key = next(iter(body), "query") if isinstance(body, dict) else "query"
            text = "{" + json.dumps(key) + ":" + text + ("}" if not shape.startswith("open") else "")
        # Over the limit (or unbalanced: not JSON) is refused by the parser; at the limit the route decides.
        refused = depth > MAX_DEPTH or shape.startswith("open")
        return self._case("deep", method, path, auth, text.encode(), refused=refused,
                          note=f"{shape} {depth} levels at {where}")

    def number(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        if rng.random() < 0.2:
            literal, refused = rng.choice(NOT_JSON_NUMBERS), True
        else:
            literal, refused = rng.choice(NUMBERS)
        paths = list(leaf_paths(body))
        if not paths:
            out = literal
        else:
            where = rng.choice(paths)
            out = dump(set_path(body, where, Raw(literal)))
        kind = "nonfinite" if literal.lstrip("-") in ("NaN", "Infinity") else "number"
        return self._case(kind, method, path, auth, out.encode(), refused=refused, note=f"literal {literal[:40]}"
                          + (f"...({len(literal)} chars)" if len(literal) > 40 else ""))

    def encoding(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        strings = [p for p in leaf_paths(body) if isinstance(_get(body, p), str)]
        if strings:  # a non-ASCII character, so that latin-1 or cp1252 bytes are not UTF-8 by chance
            p = rng.choice(strings)
            body = set_path(body, p, _get(body, p) + rng.choice(("\u00e9", " caf\u00e9", "\u00ff\u00fe", "\u20ac")))
        text = dump(body) if body else '{"x": "caf\u00e9"}'
        r = rng.random()
        if r < 0.45:
            enc = rng.choice(ENCODINGS)
            out = text.encode(enc, errors="replace")
            try:
                refused = out.decode("utf-8").startswith("\ufeff") or enc.startswith(("utf-16", "utf-32"))
            except UnicodeDecodeError:
                refused = True
            note = f"encoded {enc}"
        elif r < 0.9:
            bad = rng.choice(BAD_UTF8)
            raw = text.encode("utf-8")
            quotes = [i for i, b in enumerate(raw) if b == ord('"')]
            at = rng.choice(quotes[1::2] or [0]) if rng.random() < 0.8 else rng.choice((0, len(raw)))
            out = raw[:at] + bad + raw[at:]
            refused, note = True, f"{bad.hex()} at byte {at}"
        else:
            bom = rng.choice((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"))
            out, refused, note = bom + text.encode("utf-8"), True, f"BOM {bom.hex()} + UTF-8"
        return self._case("encoding", method, path, auth, out, refused=refused, note=note)

    def surrogate(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        literal, lone = rng.choice(SURROGATES)
        where = rng.choice(("value", "key", "nested-key"))
        if where == "value" and (paths := [p for p in leaf_paths(body) if isinstance(_get(body, p), str)]):
            p = rng.choice(paths)
            out = dump(set_path(body, p, Raw(literal)))
            note = f"{'.'.join(map(str, p))}={literal}"
        elif where == "nested-key" and (method, path) in (("POST", "/v1/retrieve"), ("POST", "/v1/documents"),
                                                           ("POST", "/v1/generate"), ("POST", "/v1/chat/completions")):
            text = dump(body)
            key = {"/v1/retrieve": '"lang"', "/v1/generate": '"lang"', "/v1/documents": '"topic"',
                   "/v1/chat/completions": '"tenant"'}[path]
            out, note = text.replace(key, literal, 1), f"key {key} -> {literal}"
        else:
            text = dump(body) if isinstance(body, dict) and body else "{}"
            out = "{" + literal + ": 1" + ("," + text[1:] if len(text) > 2 else "}")
            note = f"top-level key {literal}"
        return self._case("surrogate", method, path, auth, out.encode(), refused=lone, note=note)

    def nul(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        text = dump(body)
        choice = rng.randrange(6)
        if choice == 0:  # an escaped NUL in a value: JSON, the route decides
            paths = [p for p in leaf_paths(body) if isinstance(_get(body, p), str)]
            if paths:
                p = rng.choice(paths)
                return self._case("nul", method, path, auth, dump(set_path(body, p, "a\u0000b")).encode(),
                                  note=f"escaped NUL in {'.'.join(map(str, p))}")
            return self._case("nul", method, path, auth, b'{"\\u0000": "\\u0000"}', note="escaped NUL key")
        if choice == 1:  # a raw NUL inside a string: a control character, not JSON
            i = text.find('"', 1)
            out = (text[:i] + "\x00" + text[i:]).encode() if i > 0 else b'"\x00"'
            return self._case("nul", method, path, auth, out, refused=True, note="raw NUL in a string")
        if choice == 2:
            return self._case("nul", method, path, auth, text.encode() + b"\x00", refused=True, note="NUL after")
        if choice == 3:
            return self._case("nul", method, path, auth, b"\x00" + text.encode(), refused=True, note="NUL before")
        if choice == 4:
            return self._case("nul", method, path, auth, b"\x00" * rng.choice((1, 2, 4, 1000)), refused=True,
                              note="only NULs")
        return self._case("nul", method, path, auth, b"\x00".join(bytes([b]) for b in text.encode()[:400]),
                          refused=True, note="NUL between every byte")

    def duplicate(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        text = dump(body) if isinstance(body, dict) and body else '{"a": 1}'
        key = rng.choice(list(body)) if isinstance(body, dict) and body else "a"
        other = rng.choice(('"x"', "null", "[]", "{}", "1", "-1", '"globex"', "true"))
        if rng.random() < 0.5:
            out = "{" + json.dumps(key) + ": " + other + ", " + text[1:]
        else:
            out = text[:-1] + ", " + json.dumps(key) + ": " + other + "}"
        if rng.random() < 0.2:
            out = out[:-1] + (", " + json.dumps(key) + ": " + other) * rng.choice((10, 1000)) + "}"
        return self._case("duplicate-keys", method, path, auth, out.encode(), note=f"{key} twice (also {other})")

    def content_type(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = self._base(method, path)
        value, _ = rng.choice(CONTENT_TYPES)
        out = dump(body).encode() if rng.random() < 0.85 else b""
        padded = value is not None and value != value.strip()  # h11 (httpx) will not send it: a raw socket does
        return self._case("content-type", method, path, auth, out, content_type=value,
                          expect_ok=self._valid_status(path) if out else None,
                          wire="raw" if padded else None, note=f"content-type {value!r}")

    def chat_parts(self) -> HttpCase:
        rng = self.rng
        method, path = "POST", "/v1/chat/completions"
        auth = self.auth(path)
        body = self._base(method, path)
        r = rng.random()
        refused = True  # every one of these is refused by the request's model (400), but an empty system prompt
        if r < 0.6:
            part = rng.choice(WRONG_PARTS)
            parts = [{"type": "text", "text": "bees"}, part] if rng.random() < 0.4 else [part]
            body["messages"][-1]["content"] = parts
            note = f"content part {part!r:.80}"
        elif r < 0.8:
            content = rng.choice(WRONG_CONTENT)
            i = rng.randrange(len(body["messages"]))
            body["messages"][i]["content"] = content
            refused = content != ""  # "" is a string: the system prompt may be empty; the question may not (400)
            note = f"messages[{i}].content {content!r:.60}"
        elif r < 0.9:
            role = rng.choice(WRONG_ROLES)
            body["messages"][-1]["role"] = role
            note = f"role {role!r:.40}"
        else:
            messages = rng.choice(([], [None], [1], ["user"], [[]], [{}], {"role": "user"}, None, "bees",
                                   [{"role": "user", "content": "bees"}] * 1025))
            body["messages"] = messages
            note = f"messages {str(messages)[:60]}"
        return self._case("chat-parts", method, path, auth, dump(body).encode(), refused=refused, note=note)

    def query(self) -> HttpCase:
        """A query string (``DELETE /v1/documents`` reads ``ids`` and ``tenant`` from it; other routes ignore it):
        percent-escapes that are not UTF-8, NULs, repeated and unknown parameters, thousands of ids."""
        rng = self.rng
        method, path = ("DELETE", "/v1/documents") if rng.random() < 0.7 else self._route()
        auth = self.auth(path)
        query = rng.choice(QUERY_STRINGS)
        if query == "MANY":
            query = "&".join(f"ids=fuzz-http-{i}" for i in range(rng.choice((1000, 1001, 3000)))) + "&tenant=acme"
        body = rng.choice((b"", b"", b"", dump(self._base(method, path)).encode(), b'{"ids": ["fuzz-http-q"]}'))
        return self._case("query", method, path, auth, body, content_type=JSON_CT if body else None,
                          query=query, note=f"?{query[:80]}" + (f"...({len(query)} chars)" if len(query) > 80 else ""))

    def timeout_header(self) -> HttpCase:
        """The caller's deadline (``x-timeout-ms``): numbers and not; 0 or a tiny one may rightly get 504."""
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        value = rng.choice(TIMEOUTS)
        auth = _Auth(auth.headers + (("x-timeout-ms", value),), auth.ok, auth.tenant_ok, auth.note)
        padded = value != value.strip()  # h11 (httpx) will not send it: a raw socket does
        return self._case("timeout-header", method, path, auth, dump(self._base(method, path)).encode(),
                          wire="raw" if padded else None, headers_checked=True, note=f"x-timeout-ms {value!r}")

    def truncated(self) -> HttpCase:
        rng = self.rng
        method, path = self._route()
        auth = self.auth(path)
        body = dump(self._base(method, path)).encode()
        cut = rng.randrange(0, max(1, len(body)))
        wire = rng.choice(("truncated-close", "truncated-half"))
        declared = len(body) + rng.choice((0, 1, 100, 10_000))
        case = self._case("truncated", method, path, auth, body[:cut], wire=wire, declared=declared,
                          note=f"{cut} of {declared} declared bytes, then {wire.split('-')[1]}")
        return case

    # ------------------------------------------------------------------ fixed sets

    def huge(self) -> list[HttpCase]:
        """Bodies near (and just over) the 16 MiB limit: a huge string in each route's main field, 4 KiB under the
        limit (ASCII) and exactly at it (2-byte characters); then just over it, declared with no body (413 unread)
        and chunked (413 once counted past the limit)."""
        out = []
        acme = _Auth((("x-api-key", "key-acme"),), True, note="key-acme")
        for method, path in ROUTES:
            base = self._base(method, path)
            huge = Raw('"' + FILL.decode() + '"')
            if path == "/v1/retrieve":
                body = {**base, "query": huge}
            elif path == "/v1/generate":
                body = {**base, "retrieve": {**base["retrieve"], "query": huge}}
            elif path == "/v1/documents" and method == "POST":
                body = {"documents": [{**base["documents"][0], "text": huge}]}
            elif path == "/v1/documents":
                body = {**base, "ids": [huge]}
            elif path == "/v1/chat/completions":
                body = {**base, "messages": [{"role": "user", "content": huge}]}
            elif path == "/v1/embeddings":
                body = {**base, "input": huge}
            elif path == "/v1/rerank":
                body = {**base, "documents": [huge]}
            else:
                body = {"padding": huge}
            text = dump(body).encode()
            for target, filler in ((MAX_BODY - 4096, b"a"), (MAX_BODY, "\u00e9".encode())):
                room = target - (len(text) - len(FILL))
                count, spare = divmod(room, len(filler))
                case_body = text + b" " * spare  # whitespace after the value: the body is exactly ``target`` bytes
                # at the limit: not 413 (the route answers: 400 for a field past its own bound)
                out.append(self._case("huge", method, path, acme, case_body, wire="httpx", fill=(filler, count),
                                      expect_ok=frozenset({200, 400, 503}),
                                      note=f"{target} bytes, a string of {count} x {filler!r}"))
            out.append(self._case("over-limit", method, path, acme, b"", wire="declared", declared=MAX_BODY + 1,
                                  note="content-length: limit + 1, no body"))
            out.append(self._case("over-limit", method, path, acme, text, wire="chunked", fill=(b"o", MAX_BODY),
                                  note=f"{MAX_BODY + len(text)} bytes chunked"))
        return out

    def every_field(self) -> list[HttpCase]:
        """Each field of each route's body (and the body itself) as each JSON type: null, bool, number, string,
        list, object (under key-acme: past auth and content-type, to the route's own checks)."""
        out = []
        acme = _Auth((("x-api-key", "key-acme"),), True, note="key-acme")
        for method, path in ROUTES:
            body = self._base(method, path)
            for value in JSON_TYPES:
                out.append(self._case("every-field:body", method, path, acme, dump(value).encode(),
                                      wire="httpx", note=f"body={value!r}"))
            for where in leaf_paths(body):
                for value in JSON_TYPES:
                    out.append(self._case("every-field", method, path, acme, dump(set_path(body, where, value)).encode(),
                                          wire="httpx", note=f"{'.'.join(map(str, where))}={value!r}"))
        return out

    def echo(self) -> list[HttpCase]:
        """A 1 MiB value where the route refuses it by name (a wrong type, an unknown field or stage): the 400 must
        say so without echoing the megabyte (see :data:`MAX_MESSAGE`)."""
        acme = _Auth((("x-api-key", "key-acme"),), True, note="key-acme")
        big = "x" * MB
        digits = "9" * MB
        bodies: tuple[tuple[str, str, Any, str], ...] = (
            ("DELETE", "/v1/documents", {"ids": big, "tenant": "acme"}, "ids: a 1 MiB string"),
            ("DELETE", "/v1/documents", {"ids": ["fuzz-http-e"], "tenant": "acme", big: 1}, "a 1 MiB unknown field"),
            ("POST", "/v1/retrieve", {"query": "bees", "tenant": "acme", "top_k": digits}, "top_k: 1 MiB of digits"),
            ("POST", "/v1/retrieve", {"query": "bees", "tenant": "acme", "options": {"stages": big}},
             "options.stages: a 1 MiB string"),
            ("POST", "/v1/retrieve", {"query": "bees", "tenant": "acme", big: 1}, "a 1 MiB unknown field"),
            ("POST", "/v1/generate", {"retrieve": {"query": "bees", "tenant": "acme", "top_k": digits}},
             "retrieve.top_k: 1 MiB of digits"),
            ("POST", "/v1/documents", {"documents": [{"id": "fuzz-http-e", "text": "t", "tenant": "acme",
                                                      "metadata": big}]}, "metadata: a 1 MiB string"),
            ("POST", "/v1/rerank", {"query": "bees", "documents": ["bees"], "stage": big}, "stage: 1 MiB"),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "bees"}],
                                              "retrieval": {"tenant": "acme", "top_k": digits}},
             "retrieval.top_k: 1 MiB of digits"),
            ("POST", "/v1/embeddings", {"input": {big: 1}}, "input: an object with a 1 MiB key"),
        )
        return [self._case("echo", method, path, acme, dump(body).encode(), wire="httpx", expect_ok=frozenset({400}),
                           note=note) for method, path, body, note in bodies]

    def framing(self) -> list[HttpCase]:
        """Malformed HTTP framing: the door's protocol refuses these before any route runs (a 400 in the service's
        error shape, or a closed connection). The sending half is shut after them, so that none waits for a body timeout."""
        acme = _Auth((("x-api-key", "key-acme"),), True, note="key-acme")
        tails = (b"zz\r\n{}\r\n0\r\n\r\n", b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", b"-1\r\n{}\r\n0\r\n\r\n",
                 b"2\r\n{}XX0\r\n\r\n", b"2;ext=\x00\r\n{}\r\n0\r\n\r\n")
        out = []
        for i, (method, path) in enumerate(ROUTES):
            out.append(HttpCase(f"{route_name(method, path)}:framing", method, path, b"",
                                acme.headers + (("content-type", JSON_CT), ("transfer-encoding", "chunked")),
                                "framing", None, f"bad chunk {tails[i % len(tails)][:24]!r}",
                                raw_tail=tails[i % len(tails)]))
            for bad_length in ("-1", "12abc", "1" * 30, "5, 6"):
                out.append(HttpCase(f"{route_name(method, path)}:framing", method, path, b"",
                                    acme.headers + (("content-type", JSON_CT), ("content-length", bad_length)),
                                    "framing", None, f"content-length {bad_length!r}", raw_tail=b"{}"))
        return out

    # ------------------------------------------------------------------ the stream

    CATEGORIES = (("valid", 8), ("wrong_type", 20), ("fields", 5), ("deep", 9), ("number", 12), ("encoding", 9),
                  ("surrogate", 8), ("nul", 5), ("duplicate", 4), ("content_type", 8), ("chat_parts", 7),
                  ("truncated", 3), ("query", 3), ("timeout_header", 3))

    def case(self) -> HttpCase:
        names, weights = zip(*self.CATEGORIES, strict=True)
        return getattr(self, self.rng.choices(names, weights=weights)[0])()

    def cases(self, n: int) -> list[HttpCase]:
        out = [self.case() for _ in range(n)] + self.every_field() + self.huge() + self.echo() + self.framing()
        self.rng.shuffle(out)
        return out


def _get(value: Any, path: Sequence[Any]) -> Any:
    for p in path:
        value = value[p]
    return value


# ---------------------------------------------------------------------- sending


def _request_head(case: HttpCase, host: str, extra: Sequence[tuple[str, str]]) -> bytes:
    lines = [f"{case.method} {case.target} HTTP/1.1", f"host: {host}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in (*case.headers, *extra)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out, i = bytearray(), 0
    while i < len(body):
        n = rng.choice((1, 7, 100, 4096, 65536, 1 << 20))
        piece = body[i:i + n]
        out += f"{len(piece):x}".encode() + (b";ext=1" if rng.random() < 0.05 else b"") + b"\r\n" + piece + b"\r\n"
        i += n
    return bytes(out) + b"0\r\n" + (b"x-trailer: 1\r\n" if rng.random() < 0.1 else b"") + b"\r\n"


def send_raw(case: HttpCase, host: str, port: int, timeout: float) -> HttpOutcome:
    """One case over its own socket (chunked, truncated, declared, framing)."""
    rng = random.Random(zlib.crc32(f"{case.kind} {case.note} {case.size}".encode()))
    t0 = time.perf_counter()
    if case.wire == "chunked":
        data = _request_head(case, f"{host}:{port}", (("transfer-encoding", "chunked"),)) + _chunked(case.payload(), rng)
    elif case.wire in ("declared", "truncated-close", "truncated-half"):
        data = _request_head(case, f"{host}:{port}", (("content-length", str(case.declared)),)) + case.payload()
    elif case.wire == "raw":
        body = case.payload()
        data = _request_head(case, f"{host}:{port}", (("content-length", str(len(body))),)) + body
    else:  # framing: the headers are in the case, the tail as is
        data = _request_head(case, f"{host}:{port}", ()) + case.raw_tail
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sent_error = ""
        try:
            sock.sendall(data)
        except OSError as e:  # the server answered (413) and closed before reading it all: read the answer
            sent_error = f"send: {e!r}"
        del data
        if case.wire == "truncated-close":
            return HttpOutcome(case, None, seconds=time.perf_counter() - t0, error="closed by the client")
        if case.wire in ("truncated-half", "framing") and not sent_error:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method=case.method)
        try:
            response.begin()
            body = response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.IncompleteRead,
                BrokenPipeError) as e:
            return HttpOutcome(case, None, seconds=time.perf_counter() - t0, error=f"{sent_error} {e!r}".strip())
        return HttpOutcome(case, response.status, response.getheader("content-type") or "", body,
                           time.perf_counter() - t0, sent_error)
    except TimeoutError as e:
        return HttpOutcome(case, None, seconds=time.perf_counter() - t0, error=f"timeout: {e!r}")
    finally:
        sock.close()


class _Clients(threading.local):
    client: httpx.Client | None = None


def run_cases(base_url: str, cases: Sequence[HttpCase], *, workers: int = 4, timeout: float = 60.0) -> list[HttpOutcome]:
    """Send ``cases`` from ``workers`` threads (httpx keep-alive clients, or raw sockets); outcomes in case order."""
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    assert port is not None
    local = _Clients()
    made: list[httpx.Client] = []
    lock = threading.Lock()

    def one(case: HttpCase) -> HttpOutcome:
        if case.wire != "httpx":
            return send_raw(case, host, port, timeout)
        if local.client is None:
            local.client = httpx.Client(base_url=base_url, timeout=timeout)
            with lock:
                made.append(local.client)
        t0 = time.perf_counter()
        try:
            url = httpx.URL(base_url + case.path, query=case.query.encode("latin-1")) if case.query else case.path
            r = local.client.request(case.method, url, content=case.payload(), headers=list(case.headers))
        except httpx.HTTPError as e:
            return HttpOutcome(case, None, seconds=time.perf_counter() - t0, error=repr(e))
        return HttpOutcome(case, r.status_code, r.headers.get("content-type", ""), r.content,
                           time.perf_counter() - t0)

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, cases))
    finally:
        for c in made:
            c.close()


# ---------------------------------------------------------------------- judging


# The longest error message an answer may carry. The gRPC door's status details stay under the client's 8 KiB
# metadata limit (tests/retrieval/serving/test_fuzz.py); the HTTP door's, from the same core and from its JSON
# parsers, should too: an error never echoes megabytes of the request back.
MAX_MESSAGE = 8 * 1024


def message_length(o: HttpOutcome) -> int:
    """The length of an error answer's ``error.message`` (0 when it has none)."""
    if o.status is None or o.status < 400 or not o.body.startswith(b"{"):
        return 0
    try:
        message = json.loads(o.body).get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        return 0
    return len(message) if isinstance(message, str) else 0


def error_shape_problem(status: int, content_type: str, body: bytes) -> str:
    """'' when ``body`` is the service's error shape for ``status`` (``{"error": {"code", "status", "message",
    "type"}, "request_id"}``), else what is wrong."""
    if not content_type.startswith("application/json"):
        return f"content-type {content_type!r}, not application/json"
    try:
        doc = json.loads(body)
    except ValueError as e:
        return f"not JSON: {e}"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
        return "no 'error' object"
    err = doc["error"]
    missing = [k for k in ("code", "status", "message", "type") if k not in err]
    if missing:
        return f"error lacks {missing}"
    if err["code"] != status:
        return f"error.code {err['code']!r} != HTTP status {status}"
    if not all(isinstance(err[k], str) and err[k] for k in ("status", "message", "type")):
        return "error.status/message/type not non-empty strings"
    if not isinstance(doc.get("request_id"), str) or not doc["request_id"]:
        return "no request_id"
    return ""


@dataclass
class Problem:
    kind: str
    reason: str
    outcome: HttpOutcome

    def describe(self) -> str:
        o = self.outcome
        return (f"{self.kind}: {self.reason} -> status {o.status} {o.error} body={o.body[:300]!r}\n"
                f"        {o.case.example()}")


def judge(o: HttpOutcome) -> str:
    """'' when the outcome is acceptable, else why not."""
    case = o.case
    if o.status is None:
        if case.wire in ("truncated-close", "truncated-half", "framing"):
            return ""  # no answer to half a request, or to broken framing: right
        return f"no answer: {o.error}"
    deadline = any(k == "x-timeout-ms" for k, _ in case.headers)  # 504: the caller's own deadline passed
    if o.status >= 500 and not (o.status == 503 and case.path in GENERATION_PATHS) and not (o.status == 504 and deadline):
        return f"server error {o.status}"
    if case.expect is not None and o.status not in case.expect:
        return f"status {o.status}, expected {sorted(case.expect)}"
    if 400 <= o.status < 500 or o.status == 503:
        if o.status == 499:
            return "499 (the client did not go away)"
        shape = error_shape_problem(o.status, o.content_type, o.body)
        if shape:
            return f"error shape: {shape}"
    return ""


def problems(outcomes: Sequence[HttpOutcome]) -> dict[tuple[str, str], Problem]:
    """One example per (kind, reason)."""
    out: dict[tuple[str, str], Problem] = {}
    for o in outcomes:
        reason = judge(o)
        if reason:
            key = (o.case.kind, reason.split(" -> ")[0][:80])
            out.setdefault(key, Problem(o.case.kind, reason, o))
    return out


def per_route(outcomes: Sequence[HttpOutcome]) -> dict[str, Counter[str]]:
    """route -> status (or 'closed') -> count."""
    out: dict[str, Counter[str]] = {}
    for o in outcomes:
        out.setdefault(o.case.route, Counter())[str(o.status) if o.status is not None else "closed"] += 1
    return out


def per_category(outcomes: Sequence[HttpOutcome]) -> Counter[str]:
    return Counter(o.case.kind.split(":", 1)[1].split(":")[0] for o in outcomes)
