"""Observability's settings: ``[tracing]`` (the OpenTelemetry exporter and sampling).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import OpenTelemetry. :mod:`retrieval.observability.tracing` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from index_builder.settings import Section, bounded, one_of

EXPORTERS = ("none", "console", "otlp")


@dataclass(frozen=True)
class TracingConfig(Section):
    SECTION = "tracing"
    exporter: str = one_of("none", EXPORTERS)
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "hybridrag"
    sample_ratio: float = bounded(1.0, 0, 1)  # parent-based: a request's stages follow its sampling decision
