"""Every shell script of jobs/, env/ and tools/ passes shellcheck at warning level (and parses)."""

import glob
import os
import subprocess

from conftest import ROOT, require_tool


def shell_scripts() -> list:
    found = []
    for folder in ("jobs", "env", "tools"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*"), recursive=True):
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                head = f.readline()
            if path.endswith(".sh") or (head.startswith(b"#!") and b"sh" in head.split(b"/")[-1]):
                found.append(os.path.relpath(path, ROOT))
    return sorted(found)


def test_the_scripts_are_all_found():
    scripts = shell_scripts()
    for expected in (
        "jobs/weak_scaling.sh",
        "jobs/submit_sweep.sh",
        "jobs/lib/common.sh",
        "env/frontier.sh",
        "env/cuda.sh",
        "env/local.sh",
        "env/common.sh",
        "env/setup_venv.sh",
        "tools/local-slurm-cluster.sh",
    ):
        assert expected in scripts


def test_the_commands_are_executable():
    for command in (
        "jobs/weak_scaling.sh",
        "jobs/submit_sweep.sh",
        "env/setup_venv.sh",
        "tools/local-slurm-cluster.sh",
    ):
        assert os.access(os.path.join(ROOT, command), os.X_OK), f"chmod +x {command}"


def test_shellcheck_warning_level():
    require_tool("shellcheck")
    # -x follows `source` so that what one script defines for another is checked together
    proc = subprocess.run(
        ["shellcheck", "-x", "-S", "warning", *shell_scripts()], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bash_parses_them():
    for script in shell_scripts():
        proc = subprocess.run(["bash", "-n", script], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"
