"""Observability's settings: ``[tracing]`` (the OpenTelemetry exporter and sampling).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import OpenTelemetry. :mod:`retrieval.observability.tracing` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPORTERS = ("none", "console", "otlp")


@dataclass(frozen=True)
class TracingConfig:
    exporter: str = "none"
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "hybridrag"
    sample_ratio: float = 1.0  # parent-based: a request's stages follow its sampling decision

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"tracing.exporter must be one of {list(EXPORTERS)}, got {self.exporter!r}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"tracing.sample_ratio must be in [0, 1], got {self.sample_ratio}")
