"""What every command shares: its configuration (the file, the environment, the flags), the thread flag, an opened
pipeline."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def config_from(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Any:
    from retrieval.config import load_config

    return load_config(getattr(args, "config", None), overrides=overrides)


def thread_overrides(args: argparse.Namespace) -> dict[str, Any]:
    if not args.threads:
        return {}
    import faiss

    faiss.omp_set_num_threads(args.threads)
    rt = {"runtime": {"intra_op_threads": args.threads}}
    return {"embedder": rt, "late_interaction": rt, "cross_encoder": rt}


def open_pipeline(index_dir: Path | None, config: Any) -> Any:
    from retrieval.app import open_pipeline

    return open_pipeline(index_dir, config)
