"""docs/configuration.md against the code: every key of ``AppConfig`` on the page with its default, the switches
kept for reproducing a report naming it, the removed keys listed and refused with their reason; and the declared
range checks naming the key, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from index_builder.errors import ConfigError
from index_builder.settings import Section
from retrieval.config import REMOVED, AppConfig, load_config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
MAIN, ADVANCED, REMOVED_HEADING = "Every key", "Advanced: reproducing a report", "Removed keys"


def _sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def _toml_block(section: str) -> str:
    (block,) = re.findall(r"^```toml\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    return block


def _leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _config_keys(cls: Any = AppConfig, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _config_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _nested(path: str, value: Any) -> dict[str, Any]:
    head, *rest = path.split(".")
    return {head: _nested(".".join(rest), value) if rest else value}


def _get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


@pytest.fixture(scope="module")
def page() -> dict[str, str]:
    return _sections(PAGE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def documented(page: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each block's keys (dotted path -> documented value)."""
    return {name: dict(_leaves(tomllib.loads(_toml_block(page[name])))) for name in (MAIN, ADVANCED)}


def test_every_key_is_on_the_page_once_with_its_default(documented: dict[str, dict[str, Any]]) -> None:
    main, advanced = documented[MAIN], documented[ADVANCED]
    assert not set(main) & set(advanced), f"in both blocks: {sorted(set(main) & set(advanced))}"
    keys, on_page = set(_config_keys()), set(main) | set(advanced)
    assert not keys - on_page, f"keys missing from docs/configuration.md: {sorted(keys - on_page)}"
    assert not on_page - keys, f"documented keys the configuration does not have: {sorted(on_page - keys)}"
    merged: dict[str, Any] = {}
    for path, value in (*main.items(), *advanced.items()):
        node = merged
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    loaded, defaults = load_config(environ={}, overrides=merged), AppConfig()  # the page loads as it is written
    wrong = {k: (_get(loaded, k), _get(defaults, k)) for k in sorted(keys) if _get(loaded, k) != _get(defaults, k)}
    assert not wrong, f"documented value != default (documented, default): {wrong}"


def test_each_switch_for_reproducing_a_report_names_it(page: dict[str, str]) -> None:
    """In the Advanced block, a key names its report (docs/results/) on its line or the comment lines under it;
    a key repeated in another table (``[batching.query_tokens]``) may rely on its first mention."""
    named: set[str] = set()
    lines = _toml_block(page[ADVANCED]).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\w+) = ", line)
        if not m:
            continue
        comment = [line, *[n for n in lines[i + 1:i + 4] if n.lstrip().startswith("#") and n.startswith(" ")]]
        if any("results/" in c for c in comment):
            named.add(m[1])
        assert m[1] in named, f"Advanced key {m[1]!r} names no report (docs/results/...): {line!r}"
    assert named


def test_removed_keys_are_listed_and_refused_with_their_reason(page: dict[str, str]) -> None:
    rows = re.findall(r"^\| `([a-z_.]+)` \| issue \d+ \| (.+) \|$", page[REMOVED_HEADING], flags=re.MULTILINE)
    assert {key for key, _ in rows} == set(REMOVED), "the page's Removed keys table and retrieval.config.REMOVED differ"
    assert not set(REMOVED) & set(_config_keys())
    for key in REMOVED:
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)} was removed: .*configuration\.md#removed-keys"):
            load_config(environ={}, overrides=_nested(key, True))
        env = "HYBRIDRAG_" + key.upper().replace(".", "__")
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)} was removed: {re.escape(REMOVED[key][:30])}"):
            load_config(environ={env: "true"})


def test_every_section_checks_its_fields_and_knows_its_place() -> None:
    """Each section is a :class:`Section` (its declared ranges run whenever it is made), and its ``SECTION`` (the
    place its messages name) is where AppConfig puts it ("" for a shape used in several places)."""
    def walk(cls: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield prefix + f.name, hints[f.name]
                yield from walk(hints[f.name], f"{prefix}{f.name}.")

    places: dict[Any, list[str]] = {}
    for path, cls in walk(AppConfig, ""):
        assert issubclass(cls, Section), f"{path}: {cls.__name__} is not a Section, so nothing checks its fields"
        places.setdefault(cls, []).append(path)
    for cls, paths in places.items():
        assert cls.SECTION == (paths[0] if len(paths) == 1 else ""), (cls.__name__, cls.SECTION, paths)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("fusion.k", -1, "fusion.k must be > 0, got -1.0"),
    ("batching.cross_encoder.max_wait_ms", 1500, "batching.cross_encoder.max_wait_ms must be in [0, 1000], got 1500.0"),
    ("rerank.li_top_k", 101, "rerank.li_top_k must be in [1, max_top_k (100)], got 101"),
    ("server.compute_nice", 20, "server.compute_nice must be in [0, 19] (0 = off), got 20"),
    ("http.port", -2, "http.port must be in [-1, 65535] (-1 = off, 0 = any free port), got -2"),
    ("embedder.runtime.graph_optimization", "max",
     "embedder.runtime.graph_optimization must be one of disable, basic, extended, all, got 'max'"),
    ("generation.routing.large.read_timeout_s", 0, "generation.routing.large.read_timeout_s must be > 0, got 0.0"),
    ("chunking.overlap", 113, "chunking.overlap must be in [0, 112] (half of max_tokens), got 113"),
])
def test_a_value_out_of_range_is_refused_naming_key_value_and_range(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(environ={}, overrides=_nested(key, value))
    assert str(e.value) == message
    with pytest.raises(ConfigError) as e:  # the same from the environment
        load_config(environ={"HYBRIDRAG_" + key.upper().replace(".", "__"): str(value)})
    assert str(e.value) == message


def test_a_section_made_by_hand_is_checked_too() -> None:
    """Not only the loader: ``dataclasses.replace`` and direct construction run the same declared checks, and a
    value of the wrong type is named as such."""
    config = AppConfig()
    with pytest.raises(ConfigError, match=r"^server\.processes must be in \[1, 64\], got 0$"):
        dataclasses.replace(config.server, processes=0)
    with pytest.raises(ConfigError, match=r"^max_batch_size must be an integer in \[1, 1024\], got True$"):
        dataclasses.replace(config.batching.embed, max_batch_size=True)
    with pytest.raises(ConfigError, match=r"^hnsw\.ef_construction must be >= m \(64\), got 32$"):
        dataclasses.replace(config.hnsw, m=64, ef_construction=32)
