"""``hybridrag models fp16`` (the GPU's serving precision) run on the CPU: the fp16 copy scores like fp32. (The
provider fallback, TensorRT then CUDA asked on a build without them, is checked by ``bench.gpu_check``'s smoke test
in tests/bench.)"""

from __future__ import annotations

import numpy as np
import pytest

from hybridrag.cli import main
from index_builder.errors import ModelError
from index_builder.models.encoders import CrossEncoder
from index_builder.models.export import fp16_model
from index_builder.settings import CrossEncoderConfig
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
    fp32 = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32")).score(PAIRS)
    fp16 = CrossEncoder(CrossEncoderConfig(model=str(ce_fp16))).score(PAIRS)
    assert fp16.dtype == np.float32  # keep_io_types: callers see fp32 logits
    assert np.abs(fp16 - fp32).max() < 0.05, (fp16, fp32)
    with pytest.raises(ModelError, match="no model.onnx to convert"):
        fp16_model(ce_fp16.parent / "absent", ce_fp16.parent / "x")
