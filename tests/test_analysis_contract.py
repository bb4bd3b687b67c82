"""The contract of docs/run_record.md: the real trainer writes run directories, the analysis reads them.

Runs `python -m vit_scale train` twice on CPU at once (one process with DDP; two ranks under torchrun
with FULL_SHARD), then the analysis CLI on what they wrote, and checks the rows against the
records. Also checks that analysis/synthetic.py, which the other analysis tests and the
benchmark rely on, writes records the trainer's own JSON schema accepts.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from analysis import table  # noqa: E402
from analysis.synthetic import write_run  # noqa: E402
from analysis.weak_scaling import main  # noqa: E402
from conftest import require_module  # noqa: E402
from vit_scale.record import reader as records  # noqa: E402

KEYS = ["model=vit_micro", "train.steps=6", "train.warmup_steps=2", "train.batch_size=4", "output.study=contract"]


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return env


def _train(*cmds, timeout=300):
    """The trainers, side by side (each writes its own run directory; the one-process run leaves a core idle)."""
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in cmds
    ]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("trainer_runs"))
    py = sys.executable
    _train(
        [py, "-m", "vit_scale", "train", "strategy=DDP", f"output.dir={out}"] + KEYS,
        [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "vit_scale",
            "train",
            "strategy=FULL_SHARD",
            f"output.dir={out}",
        ]
        + KEYS,
    )
    return out


def _records(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    return lines[0], lines[-1]


def test_analysis_reads_what_the_trainer_writes(trained, tmp_path, capsys):
    report_dir = tmp_path / "report"
    assert main([trained, "--out", str(report_dir), "--dpi", "60", "--formats", "png"]) == 0
    assert "collected 2 runs" in capsys.readouterr().out
    import pandas as pd

    df = pd.read_csv(report_dir / "results.csv").set_index("strategy")
    assert sorted(df.index) == ["DDP", "FULL_SHARD"]
    for strategy, world in (("DDP", 1), ("FULL_SHARD", 2)):
        row = df.loc[strategy]
        (path,) = glob.glob(os.path.join(trained, "contract", "vit_micro", strategy, "n1", "*", "metrics.jsonl"))
        start, end = _records(path)
        assert row["status"] == "ok" and row["study"] == "contract" and row["model"] == "vit_micro"
        assert row["world_size"] == world and row["nodes"] == 1
        assert row["batch_per_device"] == 4 and row["batch_global"] == 4 * world
        assert row["params"] == start["model"]["params"] > 0
        assert row["ips_mean"] == pytest.approx(end["images_per_s"]["mean"])
        assert row["ips_std"] == pytest.approx(end["images_per_s"]["std"])
        assert row["ips_per_device"] == pytest.approx(end["images_per_s"]["mean"] / world)
        assert row["tflops_per_device"] == pytest.approx(end["tflops_per_device"])
        assert row["memory_measure"] == "rss" and row["memory_gib"] == pytest.approx(
            end["memory"]["peak_rss_gib"]["max"]
        )
        assert row["steps_done"] == 6 and row["timed_steps"] == 4
        assert row["efficiency"] == pytest.approx(1.0)  # each strategy is its own baseline
        assert bool(row["replicas_agree"]) is True
        assert row["run_id"] == start["run_id"] and row["v_torch"] == start["versions"]["torch"]
        # the wall time's split as the trainer wrote it; started by hand, so no launch time and no start-up
        split = end["time_split"]
        assert split["launched_at"] is None and pd.isna(row["startup_s"]) and split["timed_s"] > 0
        assert row["timed_window_s"] == pytest.approx(split["timed_s"]) and row["run_node_s"] == pytest.approx(
            split["wall_s"]
        )
        assert split["wall_s"] == pytest.approx(split["warmup_s"] + split["timed_s"] + split["rest_s"])
    assert df.loc["FULL_SHARD", "opt_backward_prefetch"] == "pre"
    assert df.loc["FULL_SHARD", "family"] == "fsdp" and df.loc["DDP", "family"] == "ddp"
    md = (report_dir / "report.md").read_text()
    assert "## Best run per model and node count" in md and "| vit_micro | 1 |" in md
    assert "## Where the allocation went" in md and "2 run(s) were not launched by vit-scale study" in md


def test_a_trainer_run_cut_short_reads_as_incomplete(trained, tmp_path):
    """A trainer record with its end line gone and the last step half written, as a killed job leaves it."""
    (src,) = glob.glob(os.path.join(trained, "contract", "vit_micro", "DDP", "n1", "*"))
    dst = tmp_path / "contract" / "vit_micro" / "DDP" / "n1" / "killed"
    shutil.copytree(src, dst)
    with open(dst / "metrics.jsonl") as f:
        lines = f.read().splitlines()
    with open(dst / "metrics.jsonl", "w") as f:
        f.write("\n".join(lines[:5]) + "\n" + lines[5][:25])  # start, steps 1-4, half of step 5
    coll = records.collect([str(tmp_path)])
    row = table.build(coll).results.iloc[0]
    assert row["status"] == "incomplete" and row["steps_done"] == 4
    assert row["error"].startswith("no end record; stopped after step 4 of 6")


def test_synthetic_records_pass_the_trainer_schema(tmp_path):
    """The other analysis tests and the benchmark use analysis/synthetic.py: keep it honest."""
    require_module("jsonschema", "pip install 'vit-scale[test]'")
    from vit_scale.record.schema import validate_record_file

    paths = [
        write_run(str(tmp_path), strategy="FULL_SHARD", nodes=2, ips=100.0, run_id="ok"),
        write_run(
            str(tmp_path), strategy="DDP", ips=None, status="oom", error="out of memory", memory_gib=None, run_id="oom"
        ),
        write_run(str(tmp_path), strategy="DDP", ips=50.0, status="diverged", replicas_agree=False, run_id="div"),
        write_run(str(tmp_path), strategy="ZERO3", ips=80.0, device="cpu", run_id="cpu"),
        write_run(str(tmp_path), strategy="DDP", end=False, steps_logged=3, run_id="killed"),
    ]
    for path in paths:
        validate_record_file(path)
