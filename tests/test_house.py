"""The house rules, held by tools with their settings in pyproject.toml: ruff's lint rules and
format, and import-linter's contracts (the layer order, analysis above what it reads, the modules
that stay torch-free at import time, tools/contracts.py). A finding fails the test run, and so CI,
with the tool's own lines. The tools come with the `test` extra; outside CI a missing one skips."""

import os
import subprocess
import sys

import pytest
import yaml

from conftest import IN_CI, ROOT


def tool(name: str) -> str:
    """The tool installed next to this Python (the venv's), not whichever is first on PATH."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        message = f"{name} is not installed next to {sys.executable} (pip install -e '.[test]')"
        if IN_CI:
            pytest.fail(message + ", and CI must run this test")
        pytest.skip(message)
    return path


def run(command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_ruff_lint():
    proc = run([tool("ruff"), "check", "--output-format", "concise", "."])
    assert proc.returncode == 0, (
        f"ruff check found (`ruff check --fix` fixes those marked [*]):\n{proc.stdout}{proc.stderr}"
    )


def test_ruff_format():
    proc = run([tool("ruff"), "format", "--check", "."])
    assert proc.returncode == 0, f"ruff format would rewrite (run `ruff format FILE`):\n{proc.stdout}{proc.stderr}"


def test_import_contracts():
    """The layer order as docs/architecture.md draws it, every import, lazy ones included."""
    proc = run([tool("lint-imports"), "--no-cache", "--no-logo"])
    assert proc.returncode == 0, f"import contracts broken:\n{proc.stdout}{proc.stderr}"


def test_pre_commit_runs_the_versions_the_tests_run():
    """A hook and the test run that disagree on a rule would leave a commit failing in CI."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pins = dict(p.split("==") for p in tomllib.load(f)["project"]["optional-dependencies"]["test"] if "==" in p)
    with open(os.path.join(ROOT, ".pre-commit-config.yaml")) as f:
        revs = {r["repo"].rsplit("/", 1)[1]: r["rev"].lstrip("v") for r in yaml.safe_load(f)["repos"]}
    assert revs["ruff-pre-commit"] == pins["ruff"] and revs["codespell"] == pins["codespell"], (revs, pins)
