"""API keys: ``{"key": ["tenant", ...]}`` (``"*"`` = every tenant), read at the edge from a file and/or
``HYBRIDRAG_API_KEYS``, never from the repository. What a key may do is in docs/security.md."""

from __future__ import annotations

import json
from pathlib import Path

from index_builder.errors import ConfigError

API_KEY_HEADER = "x-api-key"
ALL_TENANTS = "*"


def parse_api_keys(text: str, where: str) -> dict[str, frozenset[str]]:
    """``{"key": ["tenant", ...]}`` (``"*"`` = every tenant) from ``where`` (a file name or an environment variable)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"API keys in {where} are not valid JSON: {e}") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and k and isinstance(v, list) for k, v in raw.items()):
        raise ConfigError(f"API keys in {where} must map each key to a list of tenants")
    return {k: frozenset(map(str, v)) for k, v in raw.items()}


def load_api_keys(path: str, env_value: str = "") -> dict[str, frozenset[str]]:
    """Keys from the configured file and/or the ``HYBRIDRAG_API_KEYS`` value (read at the edge); never from the repo."""
    keys: dict[str, frozenset[str]] = {}
    if path:
        try:
            keys.update(parse_api_keys(Path(path).read_text(encoding="utf-8"), path))
        except FileNotFoundError:
            raise ConfigError(f"API keys file not found: {path}") from None
    if env_value:
        keys.update(parse_api_keys(env_value, "HYBRIDRAG_API_KEYS"))
    return keys
