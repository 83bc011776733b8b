"""Token encoders for late interaction: per-token vectors of queries and passages, and how they are stored.

Two sources:

* ``model = ""`` (default): the dense embedder's own last-layer token states (all-MiniLM-L6-v2 when bundled),
  L2-normalised, without special and padding tokens. Free at query time (the dense stage's encoder pass yields
  them) and at build time (same pass as the embeddings), but the model was never trained for MaxSim.
* a ColBERT model: an ONNX graph that already contains the linear projection and the L2 normalisation
  (``token_embeddings`` [batch, seq, dim]), with ``colbert_config.json`` beside it giving the conventions:
  ``[CLS] [Q] query [SEP]`` padded with ``[MASK]`` to exactly ``query_maxlen`` ids (query augmentation: the mask
  positions are scored too), ``[CLS] [D] passage [SEP]`` cut at ``doc_maxlen`` ids with punctuation skipped.
  Missing keys take Stanford ColBERT's defaults ([unused0]/[unused1] markers, 32 query ids).

Storage (``storage``): ``int8`` with one float32 scale per vector (``v ~= q * scale``, ``scale = max|v| / 127``),
``float16``, or a compact codec of :mod:`index_builder.snapshot.token_codes` (``pool3+bins``: each passage's
tokens pooled three to one, each pooled vector kept as its 384 signs and one float16 scale, 50 bytes against int8's
388; scored on the codes). The choice, with every option's bytes and quality: docs/results/token-codes.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from index_builder.errors import ModelError
from index_builder.models.encoders import Embedder, ModelFiles, resolve_model
from index_builder.models.runner import Batch, OnnxModel
from index_builder.settings import RuntimeConfig, TokenEncoderConfig  # noqa: F401  (re-exported)


class TokenEncoder(Protocol):
    dim: int

    def describe(self) -> dict[str, Any]:
        """What the snapshot's manifest records; a snapshot serves late interaction only with an equal encoder."""
        ...

    def encode_queries(self, queries: Sequence[str]) -> list[np.ndarray]:
        """Per query, float32 [q, dim] unit rows."""
        ...

    def encode_documents(self, passages: Sequence[str], *, progress: bool = False) -> list[np.ndarray]:
        """Per passage, float16 [t, dim] unit rows (the kept tokens only)."""
        ...


def identity(described: dict[str, Any]) -> dict[str, Any]:
    """The part of :meth:`TokenEncoder.describe` that must match between a snapshot and the serving config.

    For the embedder's own token vectors, source and dimension suffice: loading a snapshot already checks that
    the configured embedder (file hash, max length) is the one it was built with."""
    keys = ("source", "dim") if described.get("source") == "embedder" else (
        "source", "sha256", "dim", "query_maxlen", "doc_maxlen")
    return {k: described.get(k) for k in keys}


class EmbedderTokens:
    """The dense embedder's token states (see the module docstring)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.dim = embedder.dim

    def describe(self) -> dict[str, Any]:
        return {"source": "embedder", "name": self.embedder.files.name, "sha256": self.embedder.files.sha256,
                "dim": self.dim, "normalized": True, "skips_special_tokens": True,
                "query_maxlen": None, "doc_maxlen": self.embedder.config.max_length}

    def encode_queries(self, queries: Sequence[str]) -> list[np.ndarray]:
        tokens = self.embedder.encode(queries, with_tokens=True).token_vectors
        assert tokens is not None
        return [t.astype(np.float32) for t in tokens]

    def encode_documents(self, passages: Sequence[str], *, progress: bool = False) -> list[np.ndarray]:
        tokens = self.embedder.encode(passages, with_tokens=True, progress=progress).token_vectors
        assert tokens is not None
        return tokens


@dataclass(frozen=True)
class ColbertConventions:
    """``colbert_config.json``; defaults are Stanford ColBERT's."""

    dim: int = 128
    query_marker_id: int = 1  # [unused0]
    doc_marker_id: int = 2  # [unused1]
    cls_token_id: int = 101
    sep_token_id: int = 102
    pad_token_id: int = 0
    mask_token_id: int = 103
    query_maxlen: int = 32
    doc_maxlen: int = 180
    attend_to_mask_tokens: bool = False
    skiplist_punctuation_ids: tuple[int, ...] = ()
    normalised_in_graph: bool = True
    onnx_output: str = "token_embeddings"

    @classmethod
    def load(cls, folder: Path) -> ColbertConventions:
        path = folder / "colbert_config.json"
        if not path.is_file():
            return cls()
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        if "skiplist_punctuation_ids" in known:
            known["skiplist_punctuation_ids"] = tuple(int(i) for i in known["skiplist_punctuation_ids"])
        return cls(**known)

    def query_ids(self, contents: Sequence[Sequence[int]], maxlen: int) -> tuple[np.ndarray, np.ndarray]:
        """``[CLS] [Q] tokens [SEP] [MASK]...`` ids and attention mask, both int64 [n, maxlen]; ``contents``: the
        queries' word-piece ids without special tokens (cut here to ``maxlen - 3``)."""
        ids = np.full((len(contents), maxlen), self.mask_token_id, dtype=np.int64)
        mask = np.full((len(contents), maxlen), 1 if self.attend_to_mask_tokens else 0, dtype=np.int64)
        for i, toks in enumerate(contents):
            row = [self.cls_token_id, self.query_marker_id, *list(toks)[:maxlen - 3], self.sep_token_id]
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return ids, mask

    def doc_row(self, content: Sequence[int], maxlen: int) -> list[int]:
        """``[CLS] [D] tokens [SEP]``, at most ``maxlen`` ids."""
        return [self.cls_token_id, self.doc_marker_id, *list(content)[:maxlen - 3], self.sep_token_id]

    def doc_batch(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows padded into (ids, attention mask, keep mask): keep = attended and not punctuation."""
        width = max((len(r) for r in rows), default=1)
        ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, r in enumerate(rows):
            ids[j, :len(r)] = r
            mask[j, :len(r)] = 1
        keep = (mask == 1) & ~np.isin(ids, np.array(self.skiplist_punctuation_ids, dtype=np.int64))
        return ids, mask, keep


class ColbertEncoder:
    """A ColBERT model on ONNX Runtime (see the module docstring for the conventions)."""

    def __init__(self, config: TokenEncoderConfig, files: ModelFiles | None = None) -> None:
        if not config.model and files is None:
            raise ModelError("no ColBERT model configured ([late_interaction] model)")
        self.config = config
        self.files = files or resolve_model(config.model, hf_offline=config.hf_offline, cache_dir=config.cache_dir or None)
        self.conv = ColbertConventions.load(self.files.folder)
        self.query_maxlen = config.query_maxlen or self.conv.query_maxlen
        self.doc_maxlen = config.doc_maxlen or self.conv.doc_maxlen
        if self.query_maxlen < 4 or self.doc_maxlen < 4:
            raise ModelError(f"ColBERT query_maxlen and doc_maxlen must be >= 4, got {self.query_maxlen}, {self.doc_maxlen}")
        self.model = OnnxModel(self.files.onnx_path, self.files.tokenizer_path, config.runtime, max(self.doc_maxlen, 8))
        self.tokenizer = self.model.tokenizer
        self.tokenizer.no_truncation()  # we cut the content ourselves, leaving room for [CLS] [marker] ... [SEP]
        out = self.conv.onnx_output if self.conv.onnx_output in self.model.output_names else self.model.output_names[0]
        self._output = out
        probe = self.encode_queries(["probe"])[0]
        self.dim = int(probe.shape[-1])

    def describe(self) -> dict[str, Any]:
        return {"source": "colbert", "name": self.files.name, "sha256": self.files.sha256, "dim": self.dim,
                "normalized": True, "query_maxlen": self.query_maxlen, "doc_maxlen": self.doc_maxlen,
                "providers": self.model.providers}

    def _content(self, texts: Sequence[str], room: int) -> list[list[int]]:
        return [e.ids[:room] for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feed = {k: v for k, v in feed.items() if k in self.model.input_names}
        batch = Batch(feed=feed, attention_mask=mask, special_mask=np.zeros_like(ids), input_ids=ids)
        out = np.asarray(self.model.run(batch, self._output), dtype=np.float32)
        if not self.conv.normalised_in_graph:
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out

    def query_ids(self, queries: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``[CLS] [Q] tokens [SEP] [MASK]...`` ids and attention mask, both int64 [n, query_maxlen]."""
        return self.conv.query_ids(self._content(queries, self.query_maxlen - 3), self.query_maxlen)

    def encode_queries(self, queries: Sequence[str]) -> list[np.ndarray]:
        if not queries:
            return []
        ids, mask = self.query_ids(queries)
        out = self._run(ids, mask)
        return [out[i] for i in range(len(queries))]  # every position, [MASK] augmentation included

    def doc_ids(self, passages: Sequence[str]) -> list[list[int]]:
        return [self.conv.doc_row(toks, self.doc_maxlen) for toks in self._content(passages, self.doc_maxlen - 3)]

    def encode_documents(self, passages: Sequence[str], *, progress: bool = False) -> list[np.ndarray]:
        rows = self.doc_ids(passages)
        out: list[np.ndarray] = [np.empty(0)] * len(rows)
        order = np.argsort([-len(r) for r in rows], kind="stable")  # similar lengths together: less padding
        bs = self.config.batch_size
        bar = tqdm(total=len(rows), desc="token vectors", unit="text", disable=not progress, leave=False)
        for start in range(0, len(rows), bs):
            idx = order[start:start + bs]
            ids, mask, keep = self.conv.doc_batch([rows[i] for i in idx])
            states = self._run(ids, mask)
            for j, i in enumerate(idx):
                out[i] = states[j][keep[j]].astype(np.float16)
            bar.update(len(idx))
        bar.close()
        return out


def make_token_encoder(config: TokenEncoderConfig, embedder: Embedder) -> TokenEncoder:
    return EmbedderTokens(embedder) if not config.model else ColbertEncoder(config)
