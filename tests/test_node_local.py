"""When a job copies its Python environment to node-local storage, and where (vit_scale/cluster/node_local.py):
above the profile's node count, off and forced by one variable, the profile's first directory that exists.
The copy itself runs on the local Slurm cluster (tests/test_jobs_slurm.py)."""

import dataclasses

import pytest

from vit_scale.check import cli as check_cli
from vit_scale.cluster import node_local, systems
from vit_scale.errors import UserError
from vit_scale.run.session import python_environments
from vit_scale.study import cli

JOB = {"SLURM_JOB_ID": "77", "USER": "ada"}


def profile(tmp_path, name="frontier"):
    """The real profile, its directories moved under tmp_path: bb/$USER (the NVMe) and tmp."""
    system = systems.read_system(name)
    dirs = [str(tmp_path / "bb" / "$USER"), str(tmp_path / "tmp")]
    (tmp_path / "tmp").mkdir()
    return dataclasses.replace(system, node_local_dirs=dirs)


def test_the_profiles_name_the_node_count_and_the_sites_directories():
    frontier, cuda, local = (systems.read_system(n) for n in ("frontier", "cuda", "local"))
    assert frontier.node_local_env_above == 16 and frontier.node_local_dirs == ["/mnt/bb/$USER", "/tmp"]
    assert cuda.node_local_env_above == 16 and cuda.node_local_dirs == ["$TMPDIR", "/tmp"]
    assert local.node_local_env_above is None  # never by default on emulated nodes


def test_on_above_the_profiles_node_count_on_the_nvme_when_the_job_has_it(tmp_path):
    system = profile(tmp_path)
    assert node_local.node_local_parent(system, 16, JOB) is None
    # no -C nvme: /mnt/bb/$USER does not exist, so /tmp
    assert node_local.node_local_parent(system, 17, JOB) == str(tmp_path / "tmp")
    (tmp_path / "bb" / "ada").mkdir(parents=True)
    assert node_local.node_local_parent(system, 128, JOB) == str(tmp_path / "bb" / "ada")


def test_one_variable_turns_it_off_or_forces_it_and_another_names_the_directory(tmp_path):
    system = profile(tmp_path)
    assert node_local.node_local_parent(system, 128, {**JOB, "VIT_SCALE_NODE_LOCAL_ENV": "0"}) is None
    assert node_local.node_local_parent(system, 1, {**JOB, "VIT_SCALE_NODE_LOCAL_ENV": "1"}) == str(tmp_path / "tmp")
    (tmp_path / "l").mkdir()
    local = profile(tmp_path / "l", "local")
    assert node_local.node_local_parent(local, 512, JOB) is None
    forced = {**JOB, "VIT_SCALE_NODE_LOCAL_ENV": "1", "VIT_SCALE_NODE_LOCAL_DIR": "/scratch/local"}
    assert node_local.node_local_parent(local, 2, forced) == "/scratch/local"
    # without Slurm there is one machine: nothing to spread
    assert node_local.node_local_parent(system, 128, {"VIT_SCALE_NODE_LOCAL_ENV": "1"}) is None


def test_wanted_but_no_directory_exists_is_an_empty_answer(tmp_path):
    system = dataclasses.replace(systems.read_system("cuda"), node_local_dirs=["$TMPDIR", str(tmp_path / "none")])
    assert node_local.node_local_parent(system, 32, JOB) == ""


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_a_bad_switch_is_one_line_naming_what_is_allowed(tmp_path, value):
    with pytest.raises(UserError) as error:
        node_local.node_local_parent(profile(tmp_path), 2, {**JOB, "VIT_SCALE_NODE_LOCAL_ENV": value})
    assert str(error.value).startswith(f"VIT_SCALE_NODE_LOCAL_ENV={value} is not allowed; allowed: 1 (copy")


@pytest.mark.parametrize("value", ["many", -1, True, 2.5])
def test_a_bad_node_count_in_the_profile_is_refused(value):
    with pytest.raises(UserError, match="node_local_env_above: .* is not allowed; allowed: a whole number of nodes"):
        node_local.read_above(value, "configs/systems/x.yaml")


def test_which_env_tells_the_job_script_where_to_copy(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("VIT_SCALE_NODE_LOCAL_ENV", "1")
    monkeypatch.setenv("VIT_SCALE_NODE_LOCAL_DIR", "/scratch/local")
    assert cli.main(["--which-env", "--system", "local", "--prog", "weak_scaling.sh"]) == 0
    assert capsys.readouterr().out == "env/local.sh\n/scratch/local\n"
    # a dry run sets nothing up; the analysis alone needs the environment but no copy
    assert cli.main(["--which-env", "--system", "local", "--dry-run"]) == 0
    assert capsys.readouterr().out == "none\n"
    assert cli.main(["--which-env", "--system", "local", "--analysis-only"]) == 0
    assert capsys.readouterr().out == "env/local.sh\n"
    monkeypatch.setenv("VIT_SCALE_NODE_LOCAL_ENV", "0")
    assert cli.main(["--which-env", "--system", "local"]) == 0
    assert capsys.readouterr().out == "env/local.sh\n"
    monkeypatch.setenv("VIT_SCALE_NODE_LOCAL_ENV", "on")
    assert cli.main(["--which-env", "--system", "local", "--prog", "weak_scaling.sh"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("weak_scaling.sh: VIT_SCALE_NODE_LOCAL_ENV=on is not allowed")


def test_the_check_job_copies_too(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "32")
    monkeypatch.setenv("TMPDIR", "/")  # a directory that exists, as a job's own $TMPDIR would
    assert check_cli.main(["--which-env", "--system", "cuda", "--ranks-per-node", "4"]) == 0
    assert capsys.readouterr().out == "env/cuda.sh\n/\n"
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "16")
    assert check_cli.main(["--which-env", "--system", "cuda", "--ranks-per-node", "4"]) == 0
    assert capsys.readouterr().out == "env/cuda.sh\n"


def test_the_record_counts_the_ranks_of_each_environment():
    facts = [("n1", "/tmp/e/venv", "/tmp/e/src/vit_scale")] * 3 + [("n2", "/shared/venv", "/home/u/vit_scale")]
    assert python_environments(facts) == [
        {"python_prefix": "/tmp/e/venv", "vit_scale_dir": "/tmp/e/src/vit_scale", "ranks": 3},
        {"python_prefix": "/shared/venv", "vit_scale_dir": "/home/u/vit_scale", "ranks": 1},
    ]
