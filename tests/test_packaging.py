"""What ``pip install`` ships: the product's four packages, never the repository's ``bench`` and ``training`` (they
would land in site-packages as top-level modules of those names); ``hybridrag bench`` and ``hybridrag train`` work
in a checkout and, outside one, say in one line what to install (exit 2). Each CLI run is a ``python -S`` process
whose path holds only the packages as a wheel (or an editable install) lays them out, beside the environment's
dependencies: the test environment's own editable install is not on it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib

import pytest
from setuptools import find_packages

from tests.helpers import REPO

PRODUCT = {"hybridrag", "index_builder", "rerank", "retrieval"}


def _shipped() -> set[str]:
    """Top-level packages setuptools finds with the project's discovery settings (what the wheel holds)."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return {p.split(".")[0] for p in find_packages(where=str(REPO), include=find["include"])}


def test_the_wheel_ships_the_product_packages_only():
    assert _shipped() == PRODUCT


def _cli(site, cwd, *args: str) -> subprocess.CompletedProcess:
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; from hybridrag.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-S", "-c", code, str(site), sysconfig.get_paths()["purelib"], *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(a site folder holding the product packages as a wheel installs them, one mapping them from the checkout as
    an editable install does: links to the repository's folders)."""
    root = tmp_path_factory.mktemp("site")
    wheel, editable = root / "wheel", root / "editable"
    for site in (wheel, editable):
        site.mkdir()
    import shutil

    for name in sorted(PRODUCT):
        shutil.copytree(REPO / name, wheel / name, ignore=shutil.ignore_patterns("__pycache__"))
        (editable / name).symlink_to(REPO / name, target_is_directory=True)
    return wheel, editable


@pytest.mark.parametrize("command", [["bench", "load", "--duration", "1"], ["train", "cross-encoder", "--help"]])
def test_bench_and_train_outside_a_checkout_say_what_to_install(installed, tmp_path, command):
    wheel, _ = installed
    r = _cli(wheel, tmp_path, *command)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hybridrag {command[0]}: needs the repository checkout")
    assert "scripts/setup.sh --bench" in lines[0] and "Traceback" not in r.stderr
    assert "bench" in _cli(wheel, tmp_path, "--help").stdout  # the commands are listed, and the rest still works


def test_bench_and_train_in_a_checkout_installed_editable(installed, tmp_path):
    """The editable install maps the four packages only; the commands find bench/ and training/ in the checkout."""
    _, editable = installed
    r = _cli(editable, tmp_path, "bench", "scale_corpus", "--help")
    assert r.returncode == 0 and "usage: python -m bench.scale_corpus" in r.stdout, r.stderr
    r = _cli(editable, tmp_path, "train", "cross-encoder", "--help")
    assert r.returncode == 0 and "--dataset" in r.stdout, r.stderr
