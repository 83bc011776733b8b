import logging

import numpy as np
import pytest

from index_builder.errors import ModelError
from index_builder.models.encoders import Embedder, resolve_model
from index_builder.settings import EmbedderConfig, RuntimeConfig

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "Quantum chromodynamics describes the strong interaction between quarks and gluons " * 3]


def test_embeddings_are_unit_length_and_semantic(embedder):
    e = embedder.embed(SENTENCES)
    assert e.shape == (4, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sims = e @ e.T
    assert sims[0, 1] > 0.6 > sims[0, 2]  # the bread sentence is nearer than the baby one


def test_batched_equals_unbatched(embedder):
    batched = embedder.embed(SENTENCES)
    single = np.stack([embedder.embed([s])[0] for s in SENTENCES])
    np.testing.assert_allclose(batched, single, atol=2e-3)  # int8 dynamic quantisation: per-batch scales


def test_truncation_to_max_length(embedder):
    ids = embedder.model.tokenize(["word " * 1000])[0].ids
    assert len(ids) == embedder.config.max_length


def test_token_vectors_skip_special_tokens(embedder):
    enc = embedder.encode(["hello world"], with_tokens=True)
    (tv,) = enc.token_vectors
    assert tv.shape == (2, 384) and tv.dtype == np.float16  # "hello", "world": no [CLS]/[SEP]
    np.testing.assert_allclose(np.linalg.norm(tv.astype(np.float32), axis=1), 1.0, atol=1e-2)


def test_unavailable_gpu_provider_falls_back_to_cpu_with_a_log_line(caplog):
    caplog.set_level(logging.WARNING)
    runtime = RuntimeConfig(providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"))
    e = Embedder(EmbedderConfig(runtime=runtime))
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a GPU build of onnxruntime is installed")
    assert e.model.providers == ["CPUExecutionProvider"]
    assert "not available" in caplog.text


def test_model_resolution_errors(tmp_path):
    with pytest.raises(ModelError, match="no model.onnx"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelError, match="neither 'bundled'"):
        resolve_model("./does/not/exist")
    files = resolve_model("bundled")
    assert files.onnx_path.is_file() and files.tokenizer_path.is_file() and len(files.sha256) == 64


@pytest.mark.gpu
def test_cuda_provider_is_used_when_present():
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDA build of onnxruntime here (the gpu extra on a GPU machine)")
    e = Embedder(EmbedderConfig(runtime=RuntimeConfig(providers=("CUDAExecutionProvider",))))
    assert e.model.providers[0] == "CUDAExecutionProvider"
    cpu = Embedder(EmbedderConfig())
    np.testing.assert_allclose(e.embed(SENTENCES), cpu.embed(SENTENCES), atol=2e-2)


@pytest.mark.parametrize("allow", [True, False])
def test_spinning_settings_reach_the_session_and_leave_the_embeddings_alone(embedder, allow):
    """``allow_spinning`` becomes the session's own entry, and the threads always stop spinning when a run returns
    (read back from the session that runs); neither changes what the model computes."""
    e = Embedder(EmbedderConfig(runtime=RuntimeConfig(allow_spinning=allow)))
    opts = e.model.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if allow else "0")
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
    texts = ["a query about heart disease", "mitochondria make energy in the cell"]
    np.testing.assert_allclose(e.embed(texts), embedder.embed(texts), atol=1e-6)
