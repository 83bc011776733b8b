"""Request bodies, read and loaded as JSON, bounded before any work: what the HTTP door parses (the gRPC door gets
protobuf, which has its own bounds). The body's size is bounded before it is read, by the guard
(:mod:`retrieval.serving.http.guard`: ``http.max_body_mb``); :func:`read_body` reads it.

``json.loads`` alone lets through what then fails deep in the service as a 500: nesting 100,000 deep (a
RecursionError in whoever walks it), an integer of 5,000 digits (a ValueError past Python's 4,300-digit limit, or
an int32 overflow when it reaches a proto field), ``1e999`` (inf), a lone surrogate (``"\\ud800"``: a ``str`` that
cannot be encoded to UTF-8, so the tokenizer or protobuf raises). :func:`load_json` refuses each with
:class:`~retrieval.errors.InvalidRequest` naming the field where it sits, in one pass over the parsed value.

Encoding: JSON bodies are UTF-8 (RFC 8259 section 8.1); UTF-16 and UTF-32 bodies, which ``json.loads`` would guess
and accept, are refused, as is a byte-order mark.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request

from retrieval.errors import InvalidRequest
from retrieval.serving.http.errors import BodyTooLarge

MAX_DEPTH = 32  # our deepest body is 4 levels (a chat message's content parts); 32 leaves room for free-form fields
MAX_INT_DIGITS = 19  # int64's range has 19 digits; every integer field of ours is int32 or int64


class _TooLong:
    """An integer literal past :data:`MAX_INT_DIGITS`, kept as found until the walk can name its field."""

    __slots__ = ("digits",)

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))


class _NotFinite:
    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _int(literal: str) -> int | _TooLong:
    return int(literal) if len(literal.lstrip("-")) <= MAX_INT_DIGITS else _TooLong(literal)


def _float(literal: str) -> float | _NotFinite:
    value = float(literal)
    return value if math.isfinite(value) else _NotFinite(literal)


def _constant(literal: str) -> _NotFinite:
    return _NotFinite(literal)  # NaN, Infinity, -Infinity: not JSON


def _where(path: list[str | int]) -> str:
    out = "body"
    for p in path[:8]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out + ("..." if len(path) > 8 else "")


def _check_str(s: str, path: list[str | int], what: str = "") -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequest(f"{_where(path)}{what}: a lone surrogate ({s[e.start]!r}) at character {e.start} is not "
                             "a Unicode character (escapes \\ud800-\\udfff must come in pairs)") from None


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Walk a parsed body once (iteratively: no recursion to exhaust): nesting, integers, numbers and strings within
    bounds, or InvalidRequest naming the first field that is not."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            _check_str(v, path)
            continue
        if isinstance(v, dict | list):
            if len(path) >= max_depth:
                raise InvalidRequest(f"{_where(path)}: the body nests deeper than {max_depth} levels")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, item in items:
                if isinstance(k, str):
                    _check_str(k, path, " (a key)")
                if isinstance(item, str | dict | list | _TooLong | _NotFinite):
                    stack.append((item, [*path, k]))
        elif isinstance(v, _TooLong):
            raise InvalidRequest(f"{_where(path)}: an integer of {v.digits} digits; at most {MAX_INT_DIGITS} are "
                                 "allowed")
        elif isinstance(v, _NotFinite):
            raise InvalidRequest(f"{_where(path)}: {v.literal[:20]} is not a finite number")


def load_json(raw: bytes, *, empty: Any = None) -> Any:
    """The body's JSON value, bounded (see the module docstring); ``empty`` for an empty body."""
    if not raw.strip():
        return empty
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = " (it looks like UTF-16 or UTF-32)" if b"\x00" in raw[:4] else ""
        raise InvalidRequest(f"the body is not UTF-8{hint}: byte {e.start} (0x{raw[e.start]:02x}) cannot be decoded; "
                             "JSON bodies must be UTF-8 (RFC 8259)") from None
    if text.startswith("\ufeff"):
        raise InvalidRequest("the body starts with a byte-order mark; JSON bodies must be UTF-8 without one (RFC 8259)")
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise InvalidRequest(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"the body is not valid JSON: {e}") from None
    check_value(value)
    return value


async def read_body(request: Request) -> bytes:
    """The whole body (cached by Starlette for the route); a client gone mid-body is a 400, a body past the limit
    the guard's 413."""
    try:
        return await request.body()
    except BodyTooLarge:
        raise
    except Exception as e:  # noqa: BLE001  (the client went away mid-body)
        raise InvalidRequest(f"could not read the request body: {e}") from None
