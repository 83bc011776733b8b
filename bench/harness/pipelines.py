"""Pipelines in process, built the one way the service builds them (:func:`retrieval.app.open_pipeline`: the
configured backend, caches and cross-encoder), and ablations expressed through the configuration."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def with_sections(config: Any, **sections: Mapping[str, Any]) -> Any:
    """``config`` with fields of some sections replaced: ``with_sections(c, rerank={"li_weight": 0.5})``.

    >>> from retrieval.config import load_config
    >>> c = with_sections(load_config(environ={}), rerank={"li_weight": 0.25}, cache={"enabled": False})
    >>> c.rerank.li_weight, c.cache.enabled
    (0.25, False)
    """
    return dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **changes)
                                          for name, changes in sections.items()})


@contextlib.contextmanager
def opened(index_dir: str | Path | None, config: Any) -> Iterator[Any]:
    """The pipeline ``hybridrag serve`` would run over ``index_dir`` with ``config``, closed on leaving."""
    from retrieval.app import open_pipeline

    pipeline = open_pipeline(None if index_dir is None else Path(index_dir), config)
    try:
        yield pipeline
    finally:
        pipeline.close()
