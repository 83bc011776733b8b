"""PDF files by pypdf (pure Python, no system libraries, reports encryption; its decompression and page-tree limits
are caught as skips), the text counted page by page against the document limit."""

from __future__ import annotations

from pathlib import Path

from index_builder.documents.sections import MAX_TEXT_CHARS, Extracted, Unreadable, clean_text


def read_pdf(data: bytes | Path, max_chars: int = MAX_TEXT_CHARS) -> Extracted:
    """A PDF's text layer, a section per page; encrypted (password), corrupt and bomb files are :class:`Unreadable`.

    The text is counted while pages are extracted: past ``max_chars`` the file is refused at once, before the rest
    is read. Every error pypdf raises (its resource limits, ``LimitReachedError``, included) is a reason, never a
    traceback."""
    try:
        import pypdf
    except ImportError:  # pragma: no cover - a declared dependency
        raise Unreadable("reading PDF needs pypdf (pip install pypdf)") from None
    import io
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd-but-readable files are noise here
    source = io.BytesIO(data) if isinstance(data, bytes) else str(data)
    pages: list[str] = []
    total = 0
    try:
        reader = pypdf.PdfReader(source, strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception as e:  # noqa: BLE001 - pypdf raises several types for ciphers it cannot do
                raise Unreadable(f"encrypted PDF that could not be opened ({str(e)[:160]})") from None
            if not opened:
                raise Unreadable("password-protected PDF")
        for page in reader.pages:
            text = clean_text(page.extract_text() or "")
            total += len(text)
            if total > max_chars:
                raise Unreadable(f"over {max_chars:,} characters of text by page {len(pages) + 1}; a document "
                                 f"holds at most {max_chars:,}")
            pages.append(text)
        meta = reader.metadata
        title = str(meta.title).strip() if meta is not None and meta.title else ""
    except (Unreadable, MemoryError):
        raise
    except pypdf.errors.LimitReachedError as e:
        raise Unreadable(f"PDF over a safety limit: {str(e)[:160]}") from None
    except Exception as e:  # noqa: BLE001 - any failure inside pypdf on a hostile file is a skip, never a crash
        raise Unreadable(f"corrupt PDF: {type(e).__name__}: {str(e)[:160]}") from None
    pages = [p for p in pages if p]
    if not pages:
        raise Unreadable("PDF has no text layer (a scan? no OCR is done)")
    return Extracted(" ".join(title.split())[:300], pages)
