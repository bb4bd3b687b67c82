"""A user's mistake gets one line naming the key and what is allowed, exit code 2, nothing written,
and no traceback; on every rank the same way, before any process group work."""

import os
import socket
import subprocess

import pytest

from conftest import PYTHON, ROOT
from vit_scale.recipes.train import main


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["model=vit_giant"], ["model", "vit_giant", "vit_micro", "vit_15b"]),
        (["strategy=ZERO4"], ["strategy", "ZERO4", "FULL_SHARD", "HYBRID_<g>GPU"]),
        (["train.bach_size=8"], ["train.bach_size", "unknown key", "batch_size"]),
        (["colour=red"], ["colour", "unknown key", "model"]),
        (["train.batch_size=eight"], ["train.batch_size", "integer", "eight"]),
        (["train.batch_size=0"], ["train.batch_size", "at least 1"]),
        (["train.activation_checkpointing=maybe"], ["train.activation_checkpointing", "true or false"]),
        (["fsdp.backward_prefetch=sideways"], ["fsdp.backward_prefetch", "none, pre, post"]),
        (["train.precision=fp8"], ["train.precision", "fp32, bf16, fp16"]),
        (["train.steps=5", "train.warmup_steps=5"], ["train.warmup_steps", "less than train.steps"]),
        (["steps"], ["steps", "key=value"]),
    ],
)
def test_bad_override(overrides, words, capsys, tmp_path):
    assert main([*overrides, f"output.dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vit-scale: error: "), err
    for word in words:
        assert word in err
    assert not (tmp_path / "runs").exists()


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: vit_micro\ntrain:\n  batch_size: [8\n")
    assert main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml" in err and "line" in err and "YAML" in err


def test_yaml_unknown_key_and_wrong_type(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: vit_micro\ntrain:\n  batch_size: 8\n  lr: fast\n")
    assert main(["--config", str(cfg)]) == 2
    assert "train.lr: expected a number" in capsys.readouterr().err
    cfg.write_text("fsdp:\n  prefetch: pre\n")
    assert main(["--config", str(cfg)]) == 2
    assert "fsdp.prefetch: unknown key" in capsys.readouterr().err


def test_output_dir_that_is_a_file_is_refused_and_kept(tmp_path, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("precious\n")
    assert main(["model=vit_micro", f"output.dir={blocker}/study"]) == 2
    err = capsys.readouterr().err
    assert "output.dir" in err and "is a file" in err
    assert blocker.read_text() == "precious\n"


def test_subprocess_exit_code_and_no_traceback():
    proc = subprocess.run(
        [PYTHON, "-m", "vit_scale", "train", "model=vit_micro", "strategy=FULL_SHARDED"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_hybrid_group_not_dividing_world_size_fails_on_every_rank(tmp_path):
    """Two real ranks: both exit 2 before any process group work, and only rank 0 prints."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [
                    PYTHON,
                    "-m",
                    "vit_scale",
                    "train",
                    "model=vit_micro",
                    "strategy=HYBRID_4GPU",
                    f"output.dir={tmp_path / 'runs'}",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [code for _, _, code in results] == [2, 2]
    errors = "".join(err for _, err, _ in results)
    assert errors.count("\n") == 1 and "HYBRID_4GPU" in errors and "divisible by 4" in errors, errors
    assert not (tmp_path / "runs").exists()
