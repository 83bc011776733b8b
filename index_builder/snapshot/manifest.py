"""The manifest contract: what a snapshot records about how it was built, and what a server checks before it
serves one (:func:`expected_settings` against the manifest, :func:`check_settings`; the files against their
recorded sizes and checksums, :func:`verify_files`). Servers import this module, never the build."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from index_builder.documents.analysis import Analyzer
from index_builder.errors import SnapshotError
from index_builder.models.encoders import Embedder, sha256_file
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import BuildConfig

FORMAT = "hybridrag-snapshot"
FORMAT_VERSION = 1


def read_manifest(snapshot: Path) -> dict[str, Any]:
    try:
        with open(Path(snapshot) / "manifest.json", encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise SnapshotError(f"{snapshot} has no manifest.json: not a snapshot, or an incomplete one") from None
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{snapshot}/manifest.json is not valid JSON: {e}") from None
    if manifest.get("format") != FORMAT:
        raise SnapshotError(f"{snapshot} is not a {FORMAT} folder (format={manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(
            f"{snapshot} has format version {manifest.get('format_version')}, this build reads version "
            f"{FORMAT_VERSION}: rebuild the index with 'hybridrag build'"
        )
    return manifest


def verify_files(snapshot: Path, manifest: dict[str, Any], *, checksums: bool = True) -> dict[str, str]:
    """Problems with the snapshot's files, by file name: missing, wrong size, wrong sha256 (empty when sound)."""
    problems = {}
    for name, meta in manifest["files"].items():
        p = Path(snapshot) / name
        if not p.is_file():
            problems[name] = "missing"
        elif p.stat().st_size != meta["bytes"]:
            problems[name] = f"{p.stat().st_size} bytes, manifest says {meta['bytes']}"
        elif checksums and sha256_file(p) != meta["sha256"]:
            problems[name] = "sha256 differs from the manifest (file changed or corrupt)"
    return problems


def check_settings(manifest: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse a snapshot whose recorded settings differ from the configured ones, naming each difference.

    ``expected`` maps a dotted manifest key (``models.embedder.sha256``) to the configured value.
    """
    diffs = []
    for key, want in expected.items():
        have: Any = manifest
        for part in key.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if have != want:
            diffs.append(f"{key}: snapshot has {have!r}, configuration has {want!r}")
    if diffs:
        raise SnapshotError("snapshot does not match the configuration (rebuild it, or configure what it was "
                            "built with): " + "; ".join(diffs))



def token_settings(encoder: TokenEncoder, storage: str) -> dict[str, Any]:
    return {**encoder.describe(), "dtype": storage}


def index_settings(config: BuildConfig, embedder: Embedder, token_encoder: TokenEncoder | None = None) -> dict[str, Any]:
    """What a snapshot records about how it was built (and what loading checks against the configuration)."""
    tokens = None
    if config.token_vectors:
        tokens = token_settings(token_encoder or EmbedderTokens(embedder), config.token_encoder.storage)
    return {
        "models": {"embedder": embedder.describe(), "token_encoder": tokens},
        "analyzer": Analyzer(config.analyzer).settings(),
        "bm25": {"library": "bm25s", "method": "lucene", **asdict(config.bm25)},
        "hnsw": {"metric": "inner_product", **asdict(config.hnsw)},
        "chunking": asdict(config.chunking),
    }


def with_avgdl(settings: dict[str, Any], avgdl: float) -> dict[str, Any]:
    """Record the mean analysed passage length: with the index's document frequencies it lets the live index
    score passages outside the index on the same scale (retrieval.search.bm25.BM25Stats)."""
    return {**settings, "bm25": {**settings["bm25"], "avgdl": avgdl}}


def expected_settings(config: BuildConfig, embedder: Embedder) -> dict[str, Any]:
    """Dotted manifest keys that must equal the configuration for a snapshot to be served with it."""
    analyzer = Analyzer(config.analyzer).settings()
    return {
        "models.embedder.sha256": embedder.files.sha256,
        "models.embedder.max_length": embedder.config.max_length,
        "dim": embedder.dim,
        # the tokenizer (identifiers kept whole or not) is served as the snapshot records it: queries are analysed
        # with the manifest's analyzer, so an index built before [analyzer] identifiers still serves (see below)
        **{f"analyzer.{k}": v for k, v in analyzer.items() if k != "tokenizer"},
    }


def analysis_note(manifest: dict[str, Any], config: BuildConfig) -> str | None:
    """A line for the log when the snapshot's tokenizer is not the configured one (served as the snapshot was
    built; the next build or rebuild applies the configuration), else None."""
    have = manifest.get("analyzer", {}).get("tokenizer")
    want = Analyzer(config.analyzer).settings()["tokenizer"]
    if have == want:
        return None
    return (f"the snapshot was analysed with tokenizer {have!r}, the configuration asks for {want!r}: its queries "
            "are analysed as it was built until the next build or rebuild")
