"""ONNX Runtime model runner: one tokenizer + one session, batched, padded to the longest item of each batch.

Execution providers come from config (TensorRT, CUDA, CPU, ...). A provider this onnxruntime build lacks, or one
that fails to initialise, is dropped with a log line and the session falls back to CPU: never a crash.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from index_builder.errors import ModelError
from index_builder.settings import CPU, GPU_PROVIDERS, RuntimeConfig  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def choose_providers(requested: Sequence[str], available: Sequence[str]) -> list[str]:
    """Keep the requested providers this build has, in order, and end with CPU.

    >>> choose_providers(["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"])
    ['CPUExecutionProvider']
    >>> choose_providers(["TensorrtExecutionProvider", "CUDAExecutionProvider"],
    ...                  ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    ['TensorrtExecutionProvider', 'CUDAExecutionProvider', 'CPUExecutionProvider']
    """
    chosen = [p for p in requested if p in available and p != CPU]
    missing = [p for p in requested if p not in available]
    if missing:
        log.warning("onnxruntime providers %s are not available in this build (it has %s); using %s",
                    missing, list(available), chosen + [CPU])
    return chosen + [CPU]


@dataclass
class Batch:
    """Padded model inputs for one batch plus what pooling needs. Arrays are int64 [batch, seq]."""

    feed: dict[str, np.ndarray]
    attention_mask: np.ndarray
    special_mask: np.ndarray  # 1 where the token is [CLS]/[SEP]/..., from the tokenizer
    input_ids: np.ndarray
    lengths: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


class OnnxModel:
    """A tokenizer and an inference session for one model file.

    Thread-safe: ``InferenceSession.run`` and the tokenizer's encode calls may be used from many threads.
    """

    def __init__(self, onnx_path: Path, tokenizer_path: Path, runtime: RuntimeConfig, max_length: int,
                 truncation: str = "longest_first") -> None:
        if max_length < 8:
            raise ModelError(f"max_length must be at least 8, got {max_length}")
        if not Path(onnx_path).is_file():
            raise ModelError(f"model file not found: {onnx_path}")
        if not Path(tokenizer_path).is_file():
            raise ModelError(f"tokenizer file not found: {tokenizer_path}")
        self.max_length = max_length
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # Tokenizer files often carry a fixed padding/truncation (MiniLM's pads every input to 128): we pad per
        # batch ourselves and truncate to the configured length.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length, strategy=truncation)
        self.pad_id = self._token_id("[PAD]", default=0)
        self.session, self.providers = self._make_session(Path(onnx_path), runtime)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _token_id(self, token: str, default: int) -> int:
        tid = self.tokenizer.token_to_id(token)
        return default if tid is None else tid

    @staticmethod
    def _make_session(path: Path, runtime: RuntimeConfig) -> tuple[ort.InferenceSession, list[str]]:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = runtime.intra_op_threads
        opts.inter_op_num_threads = runtime.inter_op_threads
        opts.graph_optimization_level = _OPT_LEVELS[runtime.graph_optimization]
        opts.enable_cpu_mem_arena = runtime.cpu_mem_arena
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if runtime.allow_spinning else "0")
        opts.add_session_config_entry("session.force_spinning_stop", "1")  # see RuntimeConfig
        providers = choose_providers(runtime.providers, ort.get_available_providers())
        provider_args: list[str | tuple[str, dict[str, object]]] = []
        for p in providers:
            if p == "TensorrtExecutionProvider":
                trt_opts: dict[str, object] = {"trt_fp16_enable": runtime.trt_fp16}
                if runtime.trt_cache_dir:
                    os.makedirs(runtime.trt_cache_dir, exist_ok=True)
                    trt_opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=runtime.trt_cache_dir)
                provider_args.append((p, trt_opts))
            else:
                provider_args.append(p)
        try:
            session = ort.InferenceSession(str(path), sess_options=opts, providers=provider_args)
        except Exception as e:  # a GPU provider that fails to initialise must not take the service down
            if providers == [CPU]:
                raise ModelError(f"cannot load ONNX model {path}: {e}") from e
            log.warning("creating an ONNX session with %s failed (%s); falling back to CPU", providers, e)
            session = ort.InferenceSession(str(path), sess_options=opts, providers=[CPU])
        actual = session.get_providers()
        if actual[0] != providers[0]:
            log.warning("onnxruntime runs %s on %s (asked for %s)", path.name, actual, providers)
        return session, actual

    def tokenize(self, texts: Sequence[str] | Sequence[tuple[str, str]]) -> list[Encoding]:
        """Truncated, unpadded encodings (pairs are truncated on the longer side first)."""
        return self.tokenizer.encode_batch(list(texts))

    def pad(self, encodings: Sequence[Encoding]) -> Batch:
        """Pad a batch to its longest item."""
        n = len(encodings)
        width = max((len(e.ids) for e in encodings), default=0)
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        special = np.zeros((n, width), dtype=np.int64)
        lengths = np.empty(n, dtype=np.int64)
        for i, e in enumerate(encodings):
            m = len(e.ids)
            lengths[i] = m
            ids[i, :m] = e.ids
            mask[i, :m] = e.attention_mask
            types[i, :m] = e.type_ids
            special[i, :m] = e.special_tokens_mask
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feed = {k: v for k, v in feed.items() if k in self.input_names}
        return Batch(feed=feed, attention_mask=mask, special_mask=special, input_ids=ids, lengths=lengths)

    def run(self, batch: Batch, output: str | None = None) -> np.ndarray:
        """Run the session on one padded batch; returns the named output (the first by default)."""
        name = output or self.output_names[0]
        return self.session.run([name], batch.feed)[0]
