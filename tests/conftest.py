"""Shared helpers. Multi-rank tests start real processes (torchrun or plain env:// ranks) that
talk over gloo; nothing about torch.distributed is mocked."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
IN_CI = os.environ.get("CI", "").lower() == "true"
FAST = ["model=vit_micro", "train.steps=4", "train.warmup_steps=1", "train.batch_size=4", "train.print_every=100"]


def require_tool(name: str) -> None:
    """Outside CI a missing system tool skips the test; in CI it fails it (CI installs them all)."""
    if shutil.which(name) is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed, and CI must run this test (.ci/run installs it)")
        pytest.skip(f"{name} not installed (bash env/setup_venv.sh local --with-test-tools installs it)")


def torchrun(nproc: int, args: list[str], timeout: int = 300, env=None) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def run_many(nproc: int, runs: list[list[str]], tmp_path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Several trainer runs in one launch (one process group): each launch costs seconds of imports."""
    spec = tmp_path / f"runs-{nproc}.json"
    spec.write_text(json.dumps(runs))
    proc = torchrun(nproc, [os.path.join(ROOT, "tests", "run_many.py"), str(spec)], timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def load_runs(out_dir) -> dict:
    """{(study, strategy, run_id): records} for every run under out_dir, each record validated."""
    from vit_scale.schema import validate_record_file

    found = {}
    for path in sorted(glob.glob(os.path.join(str(out_dir), "**", "metrics.jsonl"), recursive=True)):
        records = validate_record_file(path)
        start = records[0]
        found[(start["study"], start["strategy"]["label"], start["run_id"])] = records
    return found


def losses(records) -> list[float]:
    return [r["loss"] for r in records if r["event"] == "step"]
