"""Tracing (OpenTelemetry spans per request and stage)."""
