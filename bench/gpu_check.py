"""The GPU paths, checked and timed in process (issue #26, run by ``bench/gpu_run.sh`` on a lent GPU).

1. Which execution providers this onnxruntime build has, and what a session asked for TensorRT then CUDA really
   runs on (TensorRT's libraries are absent on most machines: the session must fall back with a log line, not fail).
2. Each model role on each provider it can run on: the query encoder (one query, with its token vectors, as the
   default path calls it), a ColBERT query encoder (``--late-interaction DIR``) and the cross-encoder (the top 5 of
   a request, whole 128-piece pairs and 48-piece windows), at batch 1 and at the batch sizes cross-request batching
   forms (``--batches``); median ms per call and per item, items per second per batch size and the gain of the
   largest batch over batch 1: what a bigger batch saves at all on that provider, the ceiling of what cross-request
   batching can give (``bench.batching`` measures what it gives). On a GPU the per-item cost falls with the batch,
   which is why the batcher stays.

Usage::

    python -m bench.gpu_check --models models [--providers CUDAExecutionProvider] [--json F]
    python -m bench.gpu_check --embedder "" --cross-encoder DIR --providers CPUExecutionProvider   # the CPU check
    python -m bench.gpu_check --embedder "" --cross-encoder DIR --providers CPUExecutionProvider --batches 1,4,16
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import ints, median, ratio, write_result

QUERIES = [
    "0-dimensional biomaterials show inductive properties.",
    "ALDH1 expression is associated with poorer prognosis for breast cancer primary tumors.",
    "Vitamin D deficiency is unrelated to birth weight.",
    "Cancer-associated fibroblasts produce a pro-tumorigenic microenvironment through secreted factors.",
]
PASSAGE = ("Alterations of the architecture of cerebral white matter in the developing human brain can affect "
           "cortical development and result in functional disabilities. A line scan diffusion-weighted magnetic "
           "resonance imaging sequence with diffusion tensor analysis was applied to measure the apparent diffusion "
           "coefficient, to calculate relative anisotropy, and to delineate three-dimensional fiber architecture "
           "in cerebral white matter in preterm infants and full-term infants. ") * 2


def _median_ms(fn: Any, repeats: int) -> float:
    for _ in range(min(3, repeats)):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1000.0)
    out = median(ts)
    assert out is not None
    return out


def scaling(fn: Any, make_batch: Any, sizes: list[int], repeats: int) -> dict[str, Any]:
    """``fn(make_batch(n))`` timed at each batch size: median ms per call and per item, items per second, and the
    largest batch's items per second over batch 1's."""
    per_item, per_s = {}, {}
    for n in sizes:
        batch = make_batch(n)
        ms = _median_ms(lambda b=batch: fn(b), max(2, repeats // max(1, n // 4)))
        per_item[str(n)] = round(ms / n, 4)
        per_s[str(n)] = round(n * 1000.0 / ms, 1) if ms > 0 else None
    return {"per_item_ms": per_item, "items_per_s": per_s,
            "gain_largest_vs_1": ratio(per_s.get(str(max(sizes))), per_s.get("1"), 2) if 1 in sizes else None}


def provider_fallback(model_dir: str) -> dict[str, Any]:
    """Ask for TensorRT then CUDA; report what the session runs on (never an exception)."""
    from index_builder.models.encoders import Embedder
    from index_builder.settings import EmbedderConfig, RuntimeConfig

    asked = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    try:
        emb = Embedder(EmbedderConfig(model=model_dir, runtime=RuntimeConfig(providers=asked)))
        v = emb.embed([QUERIES[0]])
        return {"asked": list(asked), "runs_on": emb.model.providers, "ok": bool(np.isfinite(v).all())}
    except Exception as e:  # the check reports it: a crash here is the finding
        return {"asked": list(asked), "error": f"{type(e).__name__}: {e}"}


def role_timings(embedder: str, cross_encoder: Path | None, provider: str, repeats: int,
                 ce_requests: int = 13, batches: tuple[int, ...] = (1, 16, 64),
                 late_interaction: str = "") -> dict[str, Any]:
    """``embedder``: a model folder ("" = the bundled model); ``cross_encoder``: a model folder or None (skipped);
    ``late_interaction``: a ColBERT model folder ("" = skipped)."""
    from index_builder.models.encoders import CrossEncoder, Embedder
    from index_builder.models.token_encoders import ColbertEncoder
    from index_builder.settings import CrossEncoderConfig, EmbedderConfig, RuntimeConfig, TokenEncoderConfig

    rt = RuntimeConfig(providers=(provider,))
    out: dict[str, Any] = {"provider": provider}
    emb = Embedder(EmbedderConfig(model=embedder, runtime=rt))
    out["embedder_runs_on"] = emb.model.providers
    q = QUERIES[0]
    out["query_encoding_ms"] = _median_ms(lambda: emb.encode([q], with_tokens=True), repeats)
    def queries(n: int) -> list[str]:
        return (QUERIES * (n // len(QUERIES) + 1))[:n]

    out["query_encoding_scaling"] = scaling(lambda b: emb.encode(b, with_tokens=True), queries, list(batches), repeats)
    for n in (b for b in batches if b > 1):
        per_item = out["query_encoding_scaling"]["per_item_ms"][str(n)]
        out[f"query_encoding_batch{n}_ms"] = round(per_item * n, 3)
        out[f"query_encoding_batch{n}_per_item_ms"] = per_item
    if late_interaction:
        colbert = ColbertEncoder(TokenEncoderConfig(model=late_interaction, runtime=rt))
        out["query_tokens_scaling"] = scaling(colbert.encode_queries, queries, list(batches), repeats)
    if cross_encoder is not None and cross_encoder.is_dir():
        ce = CrossEncoder(CrossEncoderConfig(model=str(cross_encoder), runtime=rt))
        out["cross_encoder_runs_on"] = ce.model.providers
        whole = [(q, PASSAGE)] * 5
        window = [(q, " ".join(PASSAGE.split()[:40]))] * 5
        out["ce_top5_whole_ms"] = _median_ms(lambda: ce.score(whole), repeats)
        out["ce_top5_window48_ms"] = _median_ms(lambda: ce.score(window), repeats)
        wide = whole * ce_requests  # 65 pairs by default: what batching gathers from 13 requests
        ms = _median_ms(lambda: ce.score(wide), max(2, repeats // 4))
        out[f"ce_{len(wide)}pairs_ms"] = ms
        out[f"ce_{len(wide)}pairs_per_pair_ms"] = round(ms / len(wide), 4)
        # requests' top 5 gathered into one call, per batch size of requests
        out["cross_encoder_scaling"] = scaling(ce.score, lambda n: whole * n, list(batches), repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="folder holding minilm-fp16/ and ce-minilm-l6-fp16/ (the "
                    "defaults of --embedder and --cross-encoder)")
    ap.add_argument("--embedder", help="the query encoder's model folder (default MODELS/minilm-fp16; \"\" = the "
                    "bundled int8 model)")
    ap.add_argument("--cross-encoder", help="the cross-encoder's model folder (default MODELS/ce-minilm-l6-fp16; "
                    "skipped when absent)")
    ap.add_argument("--providers", default="CUDAExecutionProvider",
                    help="comma-separated; fp16 models on the CPU provider are slow (casts): not a CPU figure")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--ce-requests", type=int, default=13, help="requests' top 5 in the batched cross-encoder call")
    ap.add_argument("--batches", default="1,16,64", help="batch sizes of the scaling figures (requests per call)")
    ap.add_argument("--late-interaction", default="", help="a ColBERT model folder: its query encoder timed too")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import onnxruntime as ort

    models = Path(args.models)
    embedder = str(models / "minilm-fp16") if args.embedder is None else args.embedder
    cross_encoder = models / "ce-minilm-l6-fp16" if args.cross_encoder is None else Path(args.cross_encoder)
    result: dict[str, Any] = {"onnxruntime": ort.__version__, "available": ort.get_available_providers(),
                              "fallback": provider_fallback(embedder), "roles": []}
    print("available providers:", result["available"])
    print("TensorRT then CUDA asked ->", result["fallback"])
    for p in args.providers.split(","):
        if p not in result["available"]:
            print(f"{p}: not in this build, skipped")
            continue
        repeats = args.repeats if p != "CPUExecutionProvider" else max(2, args.repeats // 5)
        r = role_timings(embedder, cross_encoder, p, repeats, args.ce_requests, tuple(ints(args.batches)),
                         args.late_interaction)
        result["roles"].append(r)
        print(r)
    if args.json:
        write_result(args.json, "gpu_check", {"embedder": embedder, "cross_encoder": str(cross_encoder),
                                              "providers": args.providers}, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
