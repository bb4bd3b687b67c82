"""tracking.backend: TensorBoard event files in the run directory, read back with TensorBoard's own
reader, hold the run's losses and end figures; a backend whose package is missing is one line,
exit 2, and nothing written."""

import glob
import os
import subprocess
import sys

from conftest import ROOT, load_runs, losses

RUN = [
    sys.executable,
    "-m",
    "vit_scale",
    "train",
    "model=vit_micro",
    "strategy=DDP",
    "train.steps=4",
    "train.warmup_steps=1",
    "train.batch_size=2",
    "system.launcher=single",
    "train.health_probe_s=0.1",  # the node-health probe after the window, shortened (it defaults to 1 s)
]


def test_tensorboard_events_hold_what_the_record_holds(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = subprocess.run(
        [*RUN, "tracking.backend=tensorboard", f"output.dir={tmp_path}", "output.study=tb"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (records,) = load_runs(tmp_path).values()
    run_dir = os.path.dirname(glob.glob(str(tmp_path / "**" / "metrics.jsonl"), recursive=True)[0])
    assert glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    events = EventAccumulator(run_dir)
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/images_per_s", "end/images_per_s", "end/peak_memory_gib"} <= set(tags), tags
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4]
    assert [round(e.value, 5) for e in loss] == [round(v, 5) for v in losses(records)]
    end = records[-1]
    assert (
        abs(events.Scalars("end/images_per_s")[0].value - end["images_per_s"]["mean"])
        < 1e-3 * end["images_per_s"]["mean"]
    )


def test_missing_backend_package_is_one_line(tmp_path):
    # wandb made missing whether or not it is installed here: a None in sys.modules is what
    # importlib.util.find_spec reports as "not found"
    missing = (
        "import sys; sys.modules['wandb'] = None; from vit_scale.recipes.train import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", missing, *RUN[4:], "tracking.backend=wandb", f"output.dir={tmp_path}/runs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "vit-scale: error: tracking.backend: wandb needs the wandb package, which is not installed; "
        "pip install 'vit-scale[wandb]', or tracking.backend=none"
    ], proc.stderr
    assert not (tmp_path / "runs").exists()
