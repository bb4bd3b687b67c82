"""env/frontier.sh, env/cuda.sh and env/local.sh sourced under real Lmod (Debian's lmod package).

The modulefiles are mocks written by the test: Frontier's real rocm, PrgEnv-gnu,
craype-accel-amd-gfx90a (and a cluster's cuda) cannot exist on this machine. They only set
variables, which is enough to see that the env scripts load what they should, set what they
should, and change nothing when a module is missing.
"""
import os
import subprocess

import pytest

from conftest import IN_CI, ROOT
from jobs_support import TEST_VENV

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"

MOCK_MODULES = {
    "rocm/6.2.4.lua": 'setenv("ROCM_PATH", "/opt/rocm-6.2.4")\nprepend_path("PATH", "/opt/rocm-6.2.4/bin")\n',
    "PrgEnv-gnu/8.5.0.lua": 'setenv("PE_ENV", "GNU")\n',
    "craype-accel-amd-gfx90a/1.0.lua": 'setenv("CRAY_ACCEL_TARGET", "amd-gfx90a")\n',
    "cuda/12.4.lua": 'setenv("CUDA_HOME", "/usr/local/cuda-12.4")\nprepend_path("PATH", "/usr/local/cuda-12.4/bin")\n',
}


@pytest.fixture(scope="module", autouse=True)
def lmod():
    if not os.path.exists(LMOD_INIT):
        message = f"Lmod is not installed ({LMOD_INIT} missing; apt-get install --no-install-recommends lmod)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def module_tree(root, modules=MOCK_MODULES):
    for name, text in modules.items():
        path = root / "modulefiles" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root / "modulefiles")


def source(script, tmp_path, modulepath, **env):
    """Source env/SCRIPT in a clean bash (as a batch job starts: no `module` function yet) and
    return (exit code, the environment afterwards, stderr)."""
    base = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "MODULEPATH": modulepath, "USER": "tester",
            "VIT_SCALE_VENV": TEST_VENV}
    base.update(env)
    code = f'source {ROOT}/env/{script}; status=$?; echo "status=$status"; env -0 > {tmp_path}/env.out'
    proc = subprocess.run(["bash", "-c", code], env=base, capture_output=True, text=True, timeout=60)
    status = int(proc.stdout.strip().rsplit("status=", 1)[1])
    after = dict(item.split("=", 1) for item in (tmp_path / "env.out").read_text().split("\0") if "=" in item)
    return status, after, proc.stderr


def loaded(environment):
    return environment.get("LOADEDMODULES", "").split(":")


def test_frontier_loads_the_modules_and_sets_the_variables(tmp_path):
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), SLURM_JOB_ID="4242")
    assert status == 0, err
    assert loaded(env) == ["PrgEnv-gnu/8.5.0", "rocm/6.2.4", "craype-accel-amd-gfx90a/1.0"]
    assert env["ROCM_PATH"] == "/opt/rocm-6.2.4" and env["PE_ENV"] == "GNU"
    assert env["CRAY_ACCEL_TARGET"] == "amd-gfx90a"
    assert env["MIOPEN_USER_DB_PATH"] == "/tmp/tester-miopen-4242"  # per job, node-local
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == env["MIOPEN_USER_DB_PATH"]
    assert env["VIT_SCALE_NODE_DIRS"] == env["MIOPEN_USER_DB_PATH"]
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0"
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["VIT_SCALE_HOME"] == ROOT
    if TEST_VENV:
        assert env["PATH"].split(":")[0] == os.path.join(TEST_VENV, "bin")
        assert env["VIRTUAL_ENV"] == TEST_VENV
    # no plugin here: said once, and the plugin's settings are not made
    assert "no aws-ofi-rccl plugin" in err and "NCCL_NET_GDR_LEVEL" not in env


def test_frontier_uses_the_aws_ofi_rccl_plugin_when_present(tmp_path):
    plugin = tmp_path / "aws-ofi-rccl"
    (plugin / "lib").mkdir(parents=True)
    (plugin / "lib" / "librccl-net.so").write_text("")
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_AWS_OFI_RCCL=str(plugin),
                              LD_LIBRARY_PATH="/opt/other")
    assert status == 0, err
    assert env["LD_LIBRARY_PATH"] == f"{plugin}/lib:/opt/other"
    assert env["NCCL_NET_GDR_LEVEL"] == "3" and env["NCCL_CROSS_NIC"] == "1"
    assert "aws-ofi-rccl" not in err

    # a site module of that name works too
    modules = dict(MOCK_MODULES, **{"aws-ofi-rccl/1.0.lua": 'setenv("AWS_OFI_RCCL", "yes")\n'})
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path / "with-plugin", modules))
    assert status == 0, err
    assert "aws-ofi-rccl/1.0" in loaded(env) and env["NCCL_NET_GDR_LEVEL"] == "3"


@pytest.mark.parametrize("script,modules,missing", [
    ("frontier.sh", {k: v for k, v in MOCK_MODULES.items() if not k.startswith("rocm")}, "rocm/6.2.4"),
    ("frontier.sh", {k: v for k, v in MOCK_MODULES.items() if not k.startswith("craype")}, "craype-accel-amd-gfx90a"),
    ("cuda.sh", {k: v for k, v in MOCK_MODULES.items() if not k.startswith("cuda")}, "cuda"),
])
def test_a_missing_module_is_named_and_nothing_is_set(tmp_path, script, modules, missing):
    status, env, err = source(script, tmp_path, module_tree(tmp_path, modules), LOADEDMODULES="")
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"env/{script}: module '{missing}' is not available") and "nothing was loaded" in lines[0]
    assert loaded(env) == [""], "no module may stay loaded"
    for name in ("MIOPEN_USER_DB_PATH", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "OMP_NUM_THREADS", "VIRTUAL_ENV",
                 "VIT_SCALE_HOME", "ROCM_PATH", "PE_ENV"):
        assert name not in env, name
    assert env["PATH"] == "/usr/bin:/bin"


def test_a_module_the_site_names_differently(tmp_path):
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path),
                              VIT_SCALE_MODULES="PrgEnv-gnu rocm/6.3.1 craype-accel-amd-gfx90a")
    assert status == 1 and "module 'rocm/6.3.1' is not available" in err
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_MODULES="rocm")
    assert status == 0 and loaded(env) == ["rocm/6.2.4"], err


def test_a_missing_venv_is_named_and_nothing_is_set(tmp_path):
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_VENV=str(tmp_path / "none"))
    assert status == 1
    assert err.strip() == (f"env/frontier.sh: no Python venv at {tmp_path}/none; build it with: bash {ROOT}/env/"
                           f"setup_venv.sh frontier (or set VIT_SCALE_VENV)")
    assert "LOADEDMODULES" not in env or loaded(env) == [""]
    assert "MIOPEN_USER_DB_PATH" not in env


def test_cuda_loads_its_module(tmp_path):
    status, env, err = source("cuda.sh", tmp_path, module_tree(tmp_path))
    assert status == 0, err
    assert loaded(env) == ["cuda/12.4"] and env["CUDA_HOME"] == "/usr/local/cuda-12.4"
    assert env["NCCL_DEBUG"] == "WARN" and env["OMP_NUM_THREADS"] == "1"
    # a cluster whose CUDA comes with the OS loads none
    status, env, err = source("cuda.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_MODULES="")
    assert status == 0 and "LOADEDMODULES" not in env, err


def test_local_needs_no_modules(tmp_path):
    status, env, err = source("local.sh", tmp_path, "")
    assert status == 0 and err == ""
    assert env["OMP_NUM_THREADS"] == "1" and env["OMPI_MCA_btl"] == "self,tcp"


@pytest.mark.parametrize("script", ["frontier.sh", "cuda.sh", "local.sh"])
def test_running_instead_of_sourcing_says_how(script):
    proc = subprocess.run(["bash", os.path.join(ROOT, "env", script)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"env/{script} sets variables in your shell, so source it: source env/{script}"
