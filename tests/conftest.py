"""Shared fixtures: the real bundled model and a real index of the sample corpus, built once per run."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents.corpus import read_corpus
from index_builder.models.encoders import Embedder
from retrieval.app import open_index
from retrieval.config import AppConfig, load_config
from retrieval.engines.settings import EngineConfig
from retrieval.evaluate import load_qrels, load_queries
from retrieval.live.store import DocumentStore
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from tests.helpers import SAMPLE

# pytest-xdist (the README's command, ``-n 2``): a file's tests run on one worker, so its module fixtures (servers,
# clusters) are set up once; these run together: the two fuzzers share one server (``fuzz_server``), and the Ray
# tests run one after another (a cluster's teardown, ``ray stop --force``, ends every Ray process on the machine).
# The model is loaded once per worker; the sample indexes, which tests only read, are built once per run
# (``built_once``). xdist's own ``--dist loadgroup`` cannot be used: it renames test ids through an attribute pytest 9
# no longer reads.
XDIST_GROUPS = {"tests/retrieval/serving/test_fuzz.py": "fuzz_server",
                "tests/retrieval/serving/test_http_fuzz.py": "fuzz_server",
                "tests/index_builder/test_ray_build.py": "ray",
                "tests/bench/test_bench_smoke.py::test_ray_build_bench_smoke": "ray"}


# The longest units first (docs/development.md lists the slowest tests), so that no worker starts one near the end.
XDIST_FIRST = ("ray", "tests/retrieval/test_beir_scifact.py", "tests/bench/test_bench_smoke.py",
               "tests/hybridrag/test_config_cli.py", "tests/index_builder/test_token_storage.py",
               "tests/bench/test_scale_smoke.py", "tests/index_builder/test_stream_build.py",
               "tests/hybridrag/test_sync_operator.py", "tests/retrieval/generation/test_answer_cache.py")


def _xdist_unit(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    return XDIST_GROUPS.get(nodeid.split("[", 1)[0]) or XDIST_GROUPS.get(file) or file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units of whole files, or of the groups above, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_unit(nodeid)

    config.option.loadscopereorder = False
    return FilesAndGroups(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """Under xdist (a worker), the units of ``XDIST_FIRST`` first: every worker orders its collection alike."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {unit: i for i, unit in enumerate(XDIST_FIRST)}
        items.sort(key=lambda item: rank.get(_xdist_unit(item.nodeid), len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _sync_state_in_tmp(tmp_path_factory, monkeypatch) -> None:
    """A folder sync keeps its per-source secrets under $XDG_STATE_HOME (retrieval/folder_state.py): never the
    developer's own home during tests (a test that needs two "machines" sets its own)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))


@pytest.fixture(scope="session")
def config() -> AppConfig:
    return load_config(environ={})


@pytest.fixture(scope="session")
def embedder(config: AppConfig) -> Embedder:
    return Embedder(config.embedder)


@pytest.fixture(scope="session")
def sample_docs():
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    return docs


@pytest.fixture(scope="session")
def sample_queries() -> dict[str, str]:
    return load_queries(SAMPLE)


@pytest.fixture(scope="session")
def sample_qrels():
    return load_qrels(SAMPLE, "test")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A read-only session fixture's folder built once per run, not once per xdist worker: the first worker to ask
    builds it under a lock in the run's base temp (the workers' common parent), the others wait and reuse it. Tests
    only read these folders (tests that write take a copy: ``writable``); the build is deterministic, so which
    worker builds it does not matter. Without xdist: a private folder, as before."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    from filelock import FileLock

    run = tmp_path_factory.getbasetemp().parent  # .../pytest-N, shared by this run's workers (popen-gwK below it)
    root, done = run / name, run / f"{name}.done"
    with FileLock(str(run / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that died mid-build leaves no marker
            root.mkdir()
            build(root)
            done.touch()
    return root


@pytest.fixture(scope="session")
def sample_index_dir(tmp_path_factory, sample_docs, config, embedder) -> Path:
    return built_once(tmp_path_factory, "sample-index",
                      lambda root: build_snapshot(sample_docs, root, config.build_config(), embedder))


@pytest.fixture(scope="session")
def int8_index_dir(tmp_path_factory, sample_docs, config, embedder) -> Path:
    """The sample index with its token vectors stored as int8 (the plain storage studies and caches read)."""
    build = config.build_config()
    build = dataclasses.replace(build, token_encoder=dataclasses.replace(build.token_encoder, storage="int8"))
    return built_once(tmp_path_factory, "sample-index-int8", lambda root: build_snapshot(sample_docs, root, build, embedder))


@pytest.fixture(scope="session")
def int8_index(int8_index_dir, config, embedder) -> SearchIndex:
    return SearchIndex.load(int8_index_dir, config, embedder)


@pytest.fixture(scope="session")
def sample_index(sample_index_dir, config, embedder) -> SearchIndex:
    return SearchIndex.load(sample_index_dir, config, embedder)


@pytest.fixture(scope="session")
def pipeline(sample_index, embedder, config):
    p = Pipeline(sample_index, embedder, config)
    yield p
    p.close()


def engine_config(config: AppConfig, **backend) -> AppConfig:
    """``config`` with the first stage on Qdrant (default: the in-process engine, empty at start)."""
    return dataclasses.replace(config, backend=EngineConfig(**{"kind": "qdrant", **backend}))


@pytest.fixture(scope="session")
def engine_pipeline(sample_index_dir, config, embedder):
    """The sample index migrated into an in-process Qdrant engine (the engine backend's twin of ``pipeline``)."""
    cfg = engine_config(config)
    p = Pipeline(open_index(sample_index_dir, cfg, embedder), embedder, cfg)
    yield p
    p.close()


@pytest.fixture(scope="session", params=["local", "qdrant"])
def any_pipeline(request):
    """The same tests on both first-stage backends: the local snapshot and the Qdrant engine."""
    return request.getfixturevalue("pipeline" if request.param == "local" else "engine_pipeline")


@pytest.fixture(scope="session")
def writable_template(tmp_path_factory, sample_docs, config, embedder) -> Path:
    """A document store seeded with the sample corpus and a snapshot built from it (covering its sequence
    number), built once per run: tests that write take a copy (``writable``)."""

    def build(root: Path) -> None:
        store = DocumentStore(root / "store.db")
        store.upsert(sample_docs)
        seq, docs = store.snapshot()
        store.close()
        build_snapshot(docs, root / "index", config.build_config(), embedder, covered_seq=seq)

    return built_once(tmp_path_factory, "writable-template", build)


@pytest.fixture(scope="session")
def fuzz_server(writable_template, tmp_path_factory):
    """One ``hybridrag serve`` (both doors, a store, tenant-bound keys) that both fuzzers send their requests to
    (tests/retrieval/serving/test_fuzz.py and test_http_fuzz.py), started and warmed once a session."""
    from tests.retrieval.serving.fuzzing import FuzzServer

    server = FuzzServer(tmp_path_factory.mktemp("fuzz-server"), writable_template)
    try:
        server.warm()
        yield server
    finally:
        server.stop()


@pytest.fixture()
def writable(writable_template, tmp_path) -> Path:
    """A private copy of the writable template in ``tmp_path``: ``store.db`` and ``index/``."""
    shutil.copy2(writable_template / "store.db", tmp_path / "store.db")
    shutil.copytree(writable_template / "index", tmp_path / "index")
    return tmp_path


@pytest.fixture(scope="session")
def sample_train(tmp_path_factory) -> Path:
    """The sample corpus with its judgments as a 'train' split (the sample has only one split), for the trainers."""
    root = tmp_path_factory.mktemp("sample-train")
    for name in ("corpus.jsonl", "queries.jsonl"):
        shutil.copy2(SAMPLE / name, root / name)
    (root / "qrels").mkdir()
    shutil.copy2(SAMPLE / "qrels" / "test.tsv", root / "qrels" / "train.tsv")
    return root


def pytest_configure(config) -> None:
    """Framework adapters whose framework is not installed stay out of doctest collection (tests/adapter_frameworks.py)."""
    from tests.adapter_frameworks import SkipAbsentFrameworks

    config.pluginmanager.register(SkipAbsentFrameworks(), "hybridrag-adapter-frameworks")
