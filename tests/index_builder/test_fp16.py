"""``hybridrag models fp16`` (the GPU's serving precision) and ``bench.gpu_check`` run on the CPU: the fp16 copy
scores like fp32, and a session asked for TensorRT then CUDA falls back to what this build has instead of failing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.gpu_check import main as gpu_check
from hybridrag.cli import main
from index_builder.errors import ModelError
from index_builder.export import fp16_model
from index_builder.models import CrossEncoder, CrossEncoderConfig
from tests.helpers import CE_MODEL

pytestmark = pytest.mark.skipif(not (CE_MODEL / "model.onnx").is_file(),
                                reason="../shared/models/ce-minilm-l6-beir-train is absent")

PAIRS = [("how do bees find nectar", "Honeybees dance to tell their hive where the flowers are."),
         ("how do bees find nectar", "Olympus Mons on Mars is the largest volcano in the solar system."),
         ("what do whales eat", "Blue whales feed almost exclusively on krill."),
         ("what do whales eat", "Basalt is a volcanic rock.")]


@pytest.fixture(scope="module")
def ce_fp16(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "ce-fp16"
    assert main(["models", "fp16", "--model", str(CE_MODEL), "--out", str(out)]) == 0
    return out


def test_fp16_copy_is_half_the_size_and_scores_like_fp32(ce_fp16):
    assert (ce_fp16 / "tokenizer.json").is_file() and (ce_fp16 / "config.json").is_file()
    size, full = (ce_fp16 / "model.onnx").stat().st_size, (CE_MODEL / "model.onnx").stat().st_size
    assert 0.4 * full < size < 0.6 * full
    fp32 = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL))).score(PAIRS)
    fp16 = CrossEncoder(CrossEncoderConfig(model=str(ce_fp16))).score(PAIRS)
    assert fp16.dtype == np.float32  # keep_io_types: callers see fp32 logits
    assert np.abs(fp16 - fp32).max() < 0.05, (fp16, fp32)
    with pytest.raises(ModelError, match="no model.onnx to convert"):
        fp16_model(ce_fp16.parent / "absent", ce_fp16.parent / "x")


def test_gpu_check_on_the_cpu_falls_back_and_times_each_role(tmp_path):
    out = tmp_path / "gpu.json"  # fp32 models: fp16 ones on the CPU provider run through casts, slowly
    assert gpu_check(["--embedder", "", "--cross-encoder", str(CE_MODEL), "--providers",
                      "CPUExecutionProvider,NoSuchExecutionProvider", "--repeats", "2", "--ce-requests", "2",
                      "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["gpu_check"].values()
    fallback = entry["fallback"]
    assert fallback["ok"] is True and "CPUExecutionProvider" in fallback["runs_on"], fallback
    assert [r["provider"] for r in entry["roles"]] == ["CPUExecutionProvider"]  # the unknown one is skipped
    role = entry["roles"][0]
    for key in ("query_encoding_ms", "query_encoding_batch64_per_item_ms", "ce_top5_whole_ms", "ce_top5_window48_ms",
                "ce_10pairs_per_pair_ms"):
        assert role[key] > 0, key
