"""The build on a Ray cluster against the number of encoder actors, beside the single-process build and the encoder
alone on the same passages, in one run (issue 42).

1. **encoder**: the corpus's passages through ``Embedder.encode`` in this process, ``[build] embed_batch`` at a
   time, with token vectors (:func:`bench.build._encoder_alone`): the model alone, all cores (the floor).
2. **local**: ``hybridrag build`` (one process, ONNX on all cores).
3. **ray, W actors** for each W of ``--workers``: ``hybridrag build --ray local`` with ``[build.ray] actors = W``,
   each actor one ONNX thread on one CPU (``actor_cpus = 1``) while W <= cores, else a share of the cores
   (``actor_cpus = cores / W``, still one thread each): where the cores run out. The Ray cluster's start, the actors'
   model loading, chunking in tasks, the segments and the driver's assembly are all inside the wall time.

Each build is its own process, into an empty folder; every run (the floor too) groups passages ``--embed-batch``
at a time (128: some 23 batches for 1,500 SciFact documents, enough to spread over the actors; at the default
1,024 there are 3). Usage::

    python -m bench.ray_build --corpus ../shared/data/beir/scifact --limit 1500 --workers 1,2,4 [--json F]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import ints, machine, ratio, write_result


def _corpus(src: str, limit: int, out: Path) -> Path:
    import json

    from index_builder.documents.corpus import iter_corpus

    path = out / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(iter_corpus(src)):
            if limit and i >= limit:
                break
            f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n")
    return path


def _build(corpus: Path, out: Path, toml: str, ray: str | None) -> dict[str, Any]:
    cfg = out.with_suffix(".toml")
    cfg.write_text(toml)
    cmd = [sys.executable, "-m", "hybridrag", "build", "--corpus", str(corpus), "--out", str(out), "--config",
           str(cfg), "--quiet", *(["--ray", ray] if ray else [])]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    m = re.search(r"(\d+) chunks, .* (\d+) passages embedded", done.stdout)
    assert m, done.stdout
    chunks = int(m.group(1))
    stages = dict(re.findall(r"(\w+) ([\d.]+)s", done.stdout.split("stages:")[-1]))
    return {"wall_s": round(wall, 1), "chunks": chunks, "passages_per_s": round(chunks / wall, 1),
            "stages_s": {k: float(v) for k, v in stages.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hybridrag bench ray_build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="BEIR folder or JSONL")
    ap.add_argument("--limit", type=int, default=1500, help="the corpus's first N documents")
    ap.add_argument("--workers", default="1,2,4", help="encoder actors per Ray run")
    ap.add_argument("--embed-batch", type=int, default=128,
                    help="[build] embed_batch for every run, the floor's included (enough batches to spread)")
    ap.add_argument("--json", default="results/ray-build/ray-build.json")
    args = ap.parse_args(argv)
    from bench.build import _encoder_alone

    os.environ["HYBRIDRAG_BUILD__EMBED_BATCH"] = str(args.embed_batch)  # every run, the children included
    cores = os.cpu_count() or 1
    out: dict[str, Any] = {"machine": machine(), "cores": cores, "limit": args.limit}
    with tempfile.TemporaryDirectory(prefix="ray-build-") as tmp_s:
        tmp = Path(tmp_s)
        corpus = _corpus(args.corpus, args.limit, tmp)
        out["encoder"] = floor = _encoder_alone(str(corpus), 0)
        print(f"encoder alone: {floor['passages_per_s']} passages/s ({floor['passages']} passages)", file=sys.stderr)
        out["local"] = local = _build(corpus, tmp / "local", "", None)
        local["x_encoder"] = ratio(local["passages_per_s"], floor["passages_per_s"])
        print(f"local build: {local}", file=sys.stderr)
        out["ray"] = {}
        for w in ints(args.workers):
            share = 1.0 if w <= cores else cores / w
            toml = f"[build.ray]\nactors = {w}\nactor_cpus = {share:g}\n"
            row = _build(corpus, tmp / f"ray-{w}", toml, "local")
            row["x_encoder"] = ratio(row["passages_per_s"], floor["passages_per_s"])
            row["x_local"] = ratio(row["passages_per_s"], local["passages_per_s"])
            out["ray"][str(w)] = row
            print(f"ray, {w} actors: {row}", file=sys.stderr)
        first = out["ray"][str(ints(args.workers)[0])]["passages_per_s"]
        for row in out["ray"].values():
            row["x_first"] = ratio(row["passages_per_s"], first)
    write_result(args.json, "ray_build", vars(args), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
