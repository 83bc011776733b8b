"""A file's bytes as text: UTF-8 (with or without BOM) and UTF-16/32 with a BOM decoded directly; anything else
detected by ``charset-normalizer`` and refused, with the reason, when it cannot be recognised."""

from __future__ import annotations

from index_builder.documents.sections import Unreadable

_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def decode(data: bytes) -> tuple[str, str]:
    r"""The text of a file's bytes and the encoding used; :class:`Unreadable` for binary or unrecognised bytes.

    >>> decode("naïve".encode("utf-8"))
    ('naïve', 'utf-8')
    >>> decode("\ufeffhello".encode("utf-16"))[0]
    'hello'
    >>> decode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    Traceback (most recent call last):
    ...
    index_builder.documents.sections.Unreadable: binary content (NUL bytes): not a text file
    """
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc).lstrip("\ufeff"), enc.replace("-sig", "")
            except UnicodeDecodeError as e:
                raise Unreadable(f"starts with a {enc} byte-order mark but is not valid {enc} ({e.reason} at byte "
                                 f"{e.start})") from None
    if b"\x00" in data[:8192]:
        raise Unreadable("binary content (NUL bytes): not a text file")
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        from charset_normalizer import from_bytes
    except ImportError:  # pragma: no cover - a declared dependency
        raise Unreadable("not UTF-8, and charset-normalizer is not installed to detect its encoding") from None
    matches = list(from_bytes(data[:1 << 20]))
    if not matches:
        raise Unreadable("not UTF-8 and no text encoding recognised")
    best = matches[0]
    # A short Western text fits several code pages equally well (cp1250 and cp1252 differ in a few letters);
    # among the least chaotic readings, Windows-1252 (a superset of Latin-1) is by far the likeliest.
    for m in matches:
        if m.chaos <= best.chaos and "cp1252" in (m.could_be_from_charset or [m.encoding]):
            best = m
            best_encoding = "cp1252"
            break
    else:
        best_encoding = best.encoding
    try:
        return data.decode(best_encoding), best_encoding
    except (UnicodeDecodeError, LookupError):
        raise Unreadable(f"not UTF-8; looks like {best.encoding} but does not decode as it") from None
