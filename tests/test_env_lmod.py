"""env/frontier.sh, env/cuda.sh and env/local.sh sourced under real Lmod (Debian's lmod package).

The modulefiles are mocks written by the test: Frontier's real rocm, PrgEnv-gnu,
craype-accel-amd-gfx90a, rccl-net-plugin (and a cluster's cuda) cannot exist on this machine. They
only set variables, which is enough to see that the env scripts load what they should, set what
they should, and change nothing when a module is missing. So is the ROCm torch of the tests that
compare its HIP with the module: a venv whose torch package is only a version.py saying which HIP.
"""

import os
import subprocess
import sys
import venv

import pytest

from conftest import IN_CI, ROOT
from jobs_support import TEST_VENV

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"

MOCK_MODULES = {
    "rocm/7.2.0.lua": 'setenv("ROCM_PATH", "/opt/rocm-7.2.0")\nprepend_path("PATH", "/opt/rocm-7.2.0/bin")\n',
    "rocm/6.4.2.lua": 'setenv("ROCM_PATH", "/opt/rocm-6.4.2")\nprepend_path("PATH", "/opt/rocm-6.4.2/bin")\n',
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
    base = {
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "MODULEPATH": modulepath,
        "USER": "tester",
        "VIT_SCALE_VENV": TEST_VENV,
    }
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
    # the ROCm of env/frontier.sh's VS_ROCM_DEFAULT, whose wheels env/setup_venv.sh installs
    assert loaded(env) == ["PrgEnv-gnu/8.5.0", "rocm/7.2.0", "craype-accel-amd-gfx90a/1.0"]
    assert env["ROCM_PATH"] == "/opt/rocm-7.2.0" and env["PE_ENV"] == "GNU"
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
    # no plugin here, one node: said once, and no plugin settings are made
    assert "no RCCL network plugin" in err and "NCCL_NET_GDR_LEVEL" not in env
    assert "VIT_SCALE_NCCL_NET_ACROSS_NODES" not in env
    if TEST_VENV:  # the tests' CPU torch, found without importing it
        assert "is not a ROCm build; build the venv for Frontier: bash env/setup_venv.sh frontier" in err


# what OLCF's module sets (a part of it: the mock only has to show the script leaves them to it)
RCCL_NET_PLUGIN = {
    "rccl-net-plugin/1.0.lua": 'setenv("FI_CXI_RDZV_PROTO", "alt_read")\n'
    'setenv("NCCL_NET_GDR_LEVEL", "PHB")\n'
    'prepend_path("LD_LIBRARY_PATH", "/sw/rccl-net-plugin/lib")\n'
}


def test_frontier_loads_olcfs_rccl_net_plugin_module_after_rocm(tmp_path):
    tree = module_tree(tmp_path, dict(MOCK_MODULES, **RCCL_NET_PLUGIN))
    status, env, err = source("frontier.sh", tmp_path, tree, SLURM_JOB_NUM_NODES="4")
    assert status == 0, err
    assert loaded(env) == ["PrgEnv-gnu/8.5.0", "rocm/7.2.0", "craype-accel-amd-gfx90a/1.0", "rccl-net-plugin/1.0"]
    assert env["FI_CXI_RDZV_PROTO"] == "alt_read" and env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert "FI_CXI_DEFAULT_TX_SIZE" not in env and "NCCL_NET_PLUGIN" not in env, "the module's settings are its own"
    # runs over more than one node must use it (the trainer sets NCCL_NET from this)
    # the name every aws-ofi-nccl/rccl release answers to (1.11 and older: only this one)
    assert env["VIT_SCALE_NCCL_NET_ACROSS_NODES"] == "AWS Libfabric" and "NCCL_NET" not in env
    assert "plugin" not in err

    status, env, err = source("frontier.sh", tmp_path, tree, SLURM_JOB_NUM_NODES="4", VIT_SCALE_REQUIRE_NET_PLUGIN="0")
    assert status == 0 and "rccl-net-plugin/1.0" in loaded(env), err
    assert "VIT_SCALE_NCCL_NET_ACROSS_NODES" not in env


def test_frontier_sets_olcfs_variables_for_a_plugin_built_by_hand(tmp_path):
    plugin = tmp_path / "aws-ofi-nccl"
    (plugin / "lib").mkdir(parents=True)
    (plugin / "lib" / "librccl-net.so").write_text("")
    status, env, err = source(
        "frontier.sh",
        tmp_path,
        module_tree(tmp_path),
        VIT_SCALE_AWS_OFI_RCCL=str(plugin),
        LD_LIBRARY_PATH="/opt/other",
        FI_MR_CACHE_MONITOR="userfaultfd",
    )
    assert status == 0, err
    assert env["LD_LIBRARY_PATH"] == f"{plugin}/lib:/opt/other"
    assert env["NCCL_NET_PLUGIN"] == f"{plugin}/lib/librccl-net.so"
    # OLCF's list for RCCL with the plugin on Slingshot, HPE's and AMD's "for correctness and speed"
    assert {
        name: env.get(name)
        for name in (
            "NCCL_NET_GDR_LEVEL",
            "NCCL_CROSS_NIC",
            "HSA_FORCE_FINE_GRAIN_PCIE",
            "FI_CXI_DISABLE_HOST_REGISTER",
            "FI_CXI_DEFAULT_CQ_SIZE",
            "FI_CXI_DEFAULT_TX_SIZE",
            "FI_CXI_RX_MATCH_MODE",
            "FI_CXI_RDZV_PROTO",
            "FI_CXI_RDZV_EAGER_SIZE",
            "FI_CXI_RDZV_THRESHOLD",
            "FI_CXI_RDZV_GET_MIN",
        )
    } == {
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_CROSS_NIC": "1",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        "FI_CXI_DEFAULT_CQ_SIZE": "131072",
        "FI_CXI_DEFAULT_TX_SIZE": "2048",
        "FI_CXI_RX_MATCH_MODE": "hybrid",
        "FI_CXI_RDZV_PROTO": "alt_read",
        "FI_CXI_RDZV_EAGER_SIZE": "0",
        "FI_CXI_RDZV_THRESHOLD": "0",
        "FI_CXI_RDZV_GET_MIN": "0",
    }
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd", "a value already set is kept"
    assert env["VIT_SCALE_NCCL_NET_ACROSS_NODES"] == "AWS Libfabric"
    assert "plugin" not in err


def test_a_job_over_several_nodes_without_a_plugin_stops_before_anything(tmp_path):
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), SLURM_JOB_NUM_NODES="4", LOADEDMODULES="")
    assert status == 1
    lines = err.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("env/frontier.sh: no RCCL network plugin")
        and "VIT_SCALE_REQUIRE_NET_PLUGIN=0" in lines[0]
    ), err
    assert loaded(env) == [""] and "MIOPEN_USER_DB_PATH" not in env
    # asked for: sockets, said once
    status, env, err = source(
        "frontier.sh", tmp_path, module_tree(tmp_path), SLURM_JOB_NUM_NODES="4", VIT_SCALE_REQUIRE_NET_PLUGIN="0"
    )
    assert status == 0 and "RCCL will use TCP sockets between nodes" in err, err
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_REQUIRE_NET_PLUGIN="yes")
    assert status == 1 and err.strip().startswith("env/frontier.sh: VIT_SCALE_REQUIRE_NET_PLUGIN=yes is not allowed")


def venv_with_rocm_torch(where, hip: str) -> str:
    """A venv whose torch is only the version.py of a ROCm build (mock: no ROCm torch here)."""
    venv.create(where, with_pip=False, symlinks=True)
    site = where / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('the mock torch is never imported')\n")
    (site / "torch" / "version.py").write_text(f"__version__ = '2.13.0+rocm{hip[:3]}'\nhip = '{hip}'\n")
    return str(where)


def test_torch_hip_is_compared_with_the_loaded_rocm_module(tmp_path):
    old = venv_with_rocm_torch(tmp_path / "rocm64", "6.4.43482-0f2d60242")
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_VENV=old)
    assert status == 0, err
    (line,) = [line for line in err.splitlines() if "torch" in line]
    assert line == (
        f"env/frontier.sh: torch 2.13.0+rocm6.4 in {old} is built for ROCm 6.4 but module rocm/7.2.0 is "
        f"loaded; rebuild the venv (VIT_SCALE_ROCM=7.2.0 bash env/setup_venv.sh frontier) or load a "
        f"rocm/6.4 module (VIT_SCALE_ROCM=6.4.x)"
    )
    # the same version on both sides: nothing to say
    status, env, err = source(
        "frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_VENV=old, VIT_SCALE_ROCM="6.4.2"
    )
    assert status == 0 and "rocm/6.4.2" in loaded(env) and "torch" not in err, err
    new = venv_with_rocm_torch(tmp_path / "rocm72", "7.2.26015-fc0010cf6a")
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_VENV=new)
    assert status == 0 and "torch" not in err, err


@pytest.mark.parametrize(
    "script,modules,missing",
    [
        ("frontier.sh", {k: v for k, v in MOCK_MODULES.items() if not k.startswith("rocm")}, "rocm/7.2.0"),
        (
            "frontier.sh",
            {k: v for k, v in MOCK_MODULES.items() if not k.startswith("craype")},
            "craype-accel-amd-gfx90a",
        ),
        ("cuda.sh", {k: v for k, v in MOCK_MODULES.items() if not k.startswith("cuda")}, "cuda"),
    ],
)
def test_a_missing_module_is_named_and_nothing_is_set(tmp_path, script, modules, missing):
    status, env, err = source(script, tmp_path, module_tree(tmp_path, modules), LOADEDMODULES="")
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert (
        lines[0].startswith(f"env/{script}: module '{missing}' is not available") and "nothing was loaded" in lines[0]
    )
    assert loaded(env) == [""], "no module may stay loaded"
    for name in (
        "MIOPEN_USER_DB_PATH",
        "NCCL_SOCKET_IFNAME",
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "VIRTUAL_ENV",
        "VIT_SCALE_HOME",
        "ROCM_PATH",
        "PE_ENV",
        "VIT_SCALE_NCCL_NET_ACROSS_NODES",
    ):
        assert name not in env, name
    assert env["PATH"] == "/usr/bin:/bin"


def test_a_module_the_site_names_differently(tmp_path):
    status, env, err = source(
        "frontier.sh",
        tmp_path,
        module_tree(tmp_path),
        VIT_SCALE_MODULES="PrgEnv-gnu rocm/6.3.1 craype-accel-amd-gfx90a",
    )
    assert status == 1 and "module 'rocm/6.3.1' is not available" in err
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_MODULES="rocm")
    assert status == 0 and loaded(env) == ["rocm/7.2.0"], err


def test_a_missing_venv_is_named_and_nothing_is_set(tmp_path):
    status, env, err = source("frontier.sh", tmp_path, module_tree(tmp_path), VIT_SCALE_VENV=str(tmp_path / "none"))
    assert status == 1
    assert err.strip() == (
        f"env/frontier.sh: no Python venv at {tmp_path}/none; build it with: bash {ROOT}/env/"
        f"setup_venv.sh frontier (or set VIT_SCALE_VENV)"
    )
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
