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
    proc = run([tool("ruff"), "format", "--check", "--output-format", "concise", "."])
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


def test_import_time_contract_tells_lazy_imports_from_eager_ones(tmp_path, monkeypatch):
    """tools/contracts.py on a made-up package: a heavy import inside a function is allowed, one at
    import time is reported with the chain that brought it, and a listed module that is missing is
    reported too."""
    tool("lint-imports")  # import-linter, and grimp with it
    import grimp

    monkeypatch.syspath_prepend(ROOT)
    from tools import contracts

    (tmp_path / "heavy.py").write_text("")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lazy.py").write_text("def f():\n    import heavy\n")
    (pkg / "eager.py").write_text("from pkg import middle\n")
    (pkg / "middle.py").write_text("import heavy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    graph = grimp.build_graph("pkg", cache_dir=None)

    def findings(modules):
        contract = contracts.ImportTimeForbiddenContract("t", {}, {"modules": modules, "forbidden_modules": ["heavy"]})
        return contract.check(graph, verbose=False).metadata["findings"]

    assert findings(["pkg.lazy"]) == []
    assert findings(["pkg.eager"]) == [("pkg.eager", "imports heavy at import time: pkg.eager -> pkg.middle -> heavy")]
    assert findings(["pkg.gone"]) == [("pkg.gone", "does not exist")]


MAX_FUNCTION_LINES = 100
# (file, function) allowed above MAX_FUNCTION_LINES: none (make_plan, 201 lines, was the last; split)
LONG_FUNCTIONS_ALLOWED: set = set()


def test_no_function_above_100_lines():
    """A function longer than a screen or two mixes responsibilities (options, plan, launching, ledger,
    output): split it into named helpers. Counts every line from `def` to the last line of the body,
    docstring and comments included, as `ast` gives them."""
    import ast

    long, allowed_seen = [], set()
    for top in ("vit_scale", "analysis"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), rel)
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        lines = node.end_lineno - node.lineno + 1
                        if lines <= MAX_FUNCTION_LINES:
                            continue
                        if (rel, node.name) in LONG_FUNCTIONS_ALLOWED:
                            allowed_seen.add((rel, node.name))
                        else:
                            long.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"functions above {MAX_FUNCTION_LINES} lines (split them by responsibility):\n" + "\n".join(long)
    stale = LONG_FUNCTIONS_ALLOWED - allowed_seen
    assert not stale, f"no longer above {MAX_FUNCTION_LINES} lines, take them off LONG_FUNCTIONS_ALLOWED: {stale}"
