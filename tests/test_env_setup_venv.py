"""env/setup_venv.sh, lightly: --dry-run prints the installs it would make (building a real venv
takes minutes and is what the README's commands do), and bad input is refused. Also the rule
that every variable an env script sets says why."""

import glob
import os
import re
import subprocess

import pytest

from conftest import ROOT

SETUP = os.path.join(ROOT, "env", "setup_venv.sh")


def dry_run(tmp_path, *args, **env):
    full_env = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "TORCH_INDEX_URL", "VIT_SCALE_ROCM")}
    full_env.update(env)
    proc = subprocess.run(
        ["bash", SETUP, *args, "--venv", str(tmp_path / "venv"), "--dry-run"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "venv").exists()
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_local_installs_torch_first_then_the_project_against_it(tmp_path):
    venv = tmp_path / "venv"
    commands = dry_run(tmp_path, "local", "--extras", "test,deepspeed,mpi")
    assert commands == [
        f"python3 -m venv {venv}",
        f"{venv}/bin/python -m pip install torch==2.13.0",
        f"{venv}/bin/python -c '<print torch==X (and torchvision==Y) as installed>' > {venv}/vit-scale-constraints.txt",
        "export DS_BUILD_OPS=0",
        f"{venv}/bin/python -m pip install -c {venv}/vit-scale-constraints.txt -e {ROOT}[test,deepspeed,mpi]",
    ]


@pytest.mark.parametrize(
    "system,index",
    [("cuda", "https://download.pytorch.org/whl/cu128"), ("frontier", "https://download.pytorch.org/whl/rocm7.2")],
)
def test_gpu_systems_take_torch_and_torchvision_from_the_build_index(tmp_path, system, index):
    commands = dry_run(tmp_path, system)
    assert f"{tmp_path}/venv/bin/python -m pip install torch==2.13.0 torchvision --index-url {index}" in commands
    assert commands[-1].endswith(f"-e {ROOT}")


def test_frontier_wheels_follow_the_rocm_of_env_frontier_sh(tmp_path):
    """One ROCm version for the module env/frontier.sh loads and the wheels installed here."""
    with open(os.path.join(ROOT, "env", "frontier.sh")) as f:
        (default,) = re.findall(r"^VS_ROCM_DEFAULT=(\d+\.\d+)\.\d+$", f.read(), re.M)
    pip = f"{tmp_path}/venv/bin/python -m pip install torch==2.13.0 torchvision --index-url"
    assert f"{pip} https://download.pytorch.org/whl/rocm{default}" in dry_run(tmp_path, "frontier")
    assert f"{pip} https://download.pytorch.org/whl/rocm7.1" in dry_run(tmp_path, "frontier", VIT_SCALE_ROCM="7.1.1")
    proc = subprocess.run(
        ["bash", SETUP, "frontier", "--dry-run"],
        env=dict(os.environ, VIT_SCALE_ROCM="latest"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "setup_venv.sh: VIT_SCALE_ROCM: 'latest' is not a ROCm version; allowed: a version such as 7.2.0 (the "
        "module rocm/7.2.0, the wheels of whl/rocm7.2)"
    )


def test_frontier_builds_mpi4py_against_cray_mpich(tmp_path):
    venv = tmp_path / "venv"
    commands = dry_run(tmp_path, "frontier", "--extras", "mpi")
    constraints = f"-c {venv}/vit-scale-constraints.txt"
    # OLCF's recipe, before the project whose [mpi] extra would otherwise take a wheel
    assert commands[-2:] == [
        f"env MPICC=cc -shared {venv}/bin/python -m pip install {constraints} --no-cache-dir --no-binary=mpi4py mpi4py",
        f"{venv}/bin/python -m pip install {constraints} -e {ROOT}[mpi]",
    ]
    assert not any("MPICC" in line for line in dry_run(tmp_path, "local", "--extras", "mpi"))


def test_overrides_and_colossalai(tmp_path):
    commands = dry_run(
        tmp_path,
        "local",
        "--extras",
        "colossalai",
        TORCH_SPEC="torch==2.12.1",
        TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu",
    )
    pip = f"{tmp_path}/venv/bin/python -m pip install"
    constraints = f"-c {tmp_path}/venv/vit-scale-constraints.txt"
    assert f"{pip} torch==2.12.1 torchvision --index-url https://download.pytorch.org/whl/cpu" in commands
    # colossalai last and alone: no later pip call checks its torch<=2.5.1 pin (pip's red resolver ERROR)
    assert commands[-2:] == [
        f"{pip} {constraints} transformers==4.51.3 peft==0.13.2 galore-torch bitsandbytes",
        f"{pip} {constraints} --no-deps colossalai==0.5.0",
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "SYSTEM: missing; allowed: local, cuda, frontier"),
        (["summit"], "SYSTEM: unknown system 'summit'; allowed: local, cuda, frontier"),
        (
            ["local", "--extras", "test,horovod"],
            "--extras: unknown extra 'horovod'; allowed: test, deepspeed, mpi, colossalai, lora, tensorboard, wandb",
        ),
        (["local", "--gpu"], "unknown option '--gpu'; allowed: --venv --extras --with-test-tools --dry-run --help"),
    ],
)
def test_bad_input(tmp_path, args, message):
    proc = subprocess.run(["bash", SETUP, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"setup_venv.sh: {message}"
    assert os.listdir(tmp_path) == []


def test_with_test_tools_installs_the_test_packages_with_apt(tmp_path):
    proc = subprocess.run(
        ["bash", SETUP, "local", "--with-test-tools", "--venv", str(tmp_path / "v"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    packages = "slurm-wlm munge lmod shellcheck openmpi-bin libpmix-dev g++"
    assert f"test tools already installed: {packages}" in proc.stdout or re.search(
        rf"apt-get install -y --no-install-recommends {packages}$", proc.stdout, re.M
    ), proc.stdout


def test_every_variable_an_env_script_sets_says_why():
    """A comment right above each export (or on its line), so a cluster user knows what may go."""
    unexplained = []
    for path in sorted(glob.glob(os.path.join(ROOT, "env", "*.sh"))):
        lines = open(path).read().splitlines()
        for i, line in enumerate(lines):
            if not re.match(r"\s*export\s+\w+=", line):
                continue
            before = lines[i - 1].strip() if i else ""
            if not (before.startswith("#") or "#" in line.split("=", 1)[1]):
                unexplained.append(f"{os.path.basename(path)}:{i + 1}: {line.strip()}")
    assert unexplained == []


def test_the_extras_it_accepts_are_the_projects(tmp_path):
    """--extras hands the names to pip, which only warns about an extra the project lacks: the
    script's list and pyproject.toml's must be the same."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    proc = subprocess.run(
        ["bash", SETUP, "local", "--extras", "nope"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert set(proc.stderr.strip().split("allowed: ")[1].split(", ")) == extras
