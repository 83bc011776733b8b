"""The fp32 ONNX export of the bundled model: loads as a model folder and embeds like the bundled int8 model."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from index_builder.models.encoders import Embedder  # noqa: E402
from index_builder.models.export import export_fp32  # noqa: E402
from index_builder.settings import EmbedderConfig  # noqa: E402

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "Quantum chromodynamics describes the strong interaction between quarks and gluons " * 3,
             "Hello"]


def test_fp32_export_loads_and_matches_the_bundled_model(tmp_path):
    out = tmp_path / "minilm-fp32"
    report = export_fp32(out)
    assert json.loads((out / "export.json").read_text()) == report
    assert report["max_abs_diff"] < 1e-3 and report["min_cosine"] > 0.9999
    assert report["opset"] == 17 and len(report["sha256"]) == 64
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                 "config.json"):
        assert (out / name).is_file(), name

    fp32 = Embedder(EmbedderConfig(model=str(out)))
    assert fp32.files.onnx_path == out / "model.onnx" and fp32.dim == 384
    int8 = Embedder(EmbedderConfig())
    a, b = fp32.embed(SENTENCES), int8.embed(SENTENCES)
    assert a.shape == b.shape == (5, 384)
    cos = (a * b).sum(axis=1)  # both unit length
    assert cos.min() > 0.99, cos
