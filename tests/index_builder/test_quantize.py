"""``hybridrag models quantize``: a dynamic int8 copy of the shared cross-encoder that serves, and agrees with fp32."""

from __future__ import annotations

import numpy as np
import pytest

from hybridrag.cli import main
from index_builder.errors import ModelError
from index_builder.models.encoders import CrossEncoder
from index_builder.models.export import quantize_model
from index_builder.models.int8 import cpu_int8_dot
from index_builder.settings import CrossEncoderConfig
from tests.helpers import CE_MODEL

pytestmark = pytest.mark.skipif(not (CE_MODEL / "model.onnx").is_file(),
                                reason="../shared/models/ce-minilm-l6-beir-train is absent")

PAIRS = [("how do bees find nectar", "Honeybees dance to tell their hive where the flowers are."),
         ("how do bees find nectar", "Olympus Mons on Mars is the largest volcano in the solar system."),
         ("largest volcano", "Olympus Mons on Mars is the largest volcano in the solar system."),
         ("largest volcano", "The waggle dance encodes distance and direction to food."),
         ("what do whales eat", "Blue whales feed almost exclusively on krill."),
         ("what do whales eat", "Basalt is a volcanic rock.")]


def test_int8_copy_serves_and_ranks_like_fp32(tmp_path):
    out = tmp_path / "ce-int8"
    rc = main(["models", "quantize", "--model", str(CE_MODEL), "--out", str(out), "--force"])
    assert rc == 0 and (out / "model.onnx").is_file() and (out / "tokenizer.json").is_file()
    assert (out / "model.onnx").stat().st_size < (CE_MODEL / "model.onnx").stat().st_size / 2
    fp32 = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32")).score(PAIRS)
    int8 = CrossEncoder(CrossEncoderConfig(model=str(out))).score(PAIRS)
    assert np.corrcoef(fp32, int8)[0, 1] > 0.9
    for i in range(0, len(PAIRS), 2):  # the relevant passage of each query stays first
        assert (fp32[i] > fp32[i + 1]) == (int8[i] > int8[i + 1])


def test_quantize_refuses_a_folder_without_a_model_and_a_cpu_without_int8_dot(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="no model.onnx to quantise"):
        quantize_model(tmp_path, tmp_path / "out")
    import index_builder.models.export as export

    monkeypatch.setattr(export, "cpu_int8_dot", lambda: "")
    with pytest.raises(ModelError, match="no int8 dot-product instructions"):
        quantize_model(CE_MODEL, tmp_path / "out")
    assert cpu_int8_dot() in ("", "amx_int8", "avx512_vnni", "avx_vnni")
