"""The communicators of the check's strategy labels, on 4 real gloo ranks (2 emulated nodes of 2)
running the check's worker over labels that make groups of their own: FSDP's HYBRID mesh
(init_device_mesh), DeepSpeed's groups (twice: its cache of them must not outlive them) and
ColossalAI's. After each label this rank is in the world's group alone again (torch's registry,
distributed_c10d._world.pg_map) and none of the label's runs is alive, and every group a label
made held the check's 300 s collective bound, which the label's row says."""

import json
import os
import subprocess

from conftest import PYTHON, ROOT

# the labels that make groups of their own (DDP, which makes none, cost a label run and showed nothing more)
LABELS = ["HYBRID_2GPU", "ZERO1", "ZERO3", "CAI_DDP"]

# the worker as the launchers start it, with what each label made recorded (the groups it left
# behind, their timeouts) and the live groups counted after each label
COUNTING_WORKER = """
import json, sys
import torch.distributed.distributed_c10d as c10d
from vit_scale.check import strategies, worker

report = sys.argv[1]
real_run_label, real_release = strategies.run_label, worker.release_memory


def timeout_s(group):
    import torch

    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def run_label(label, precision, world, spec, attempt):
    before = set(c10d._world.pg_map)
    row = real_run_label(label, precision, world, spec, attempt)
    made = [g for g in c10d._world.pg_map if g not in before]
    with open(report, "a") as f:
        f.write(json.dumps({"label": label, "made": len(made),
                            "timeouts": [timeout_s(g) for g in made]}) + "\\n")
    return row


def release_memory(world):
    import gc

    from vit_scale.recipes.train import Run

    real_release(world)
    runs = sum(1 for o in gc.get_objects() if isinstance(o, Run))
    with open(report, "a") as f:
        f.write(json.dumps({"live": len(c10d._world.pg_map), "runs": runs}) + "\\n")


strategies.run_label, worker.release_memory = run_label, release_memory
sys.exit(worker.main(sys.argv[2:]))
"""


def test_each_labels_groups_are_bounded_and_destroyed_after_it(tmp_path):
    from vit_scale.launch.world import free_port

    script = tmp_path / "counting_worker.py"
    script.write_text(COUNTING_WORKER)
    spec = {
        "parts": ["strategies"],
        "labels": [[label, "fp32"] for label in LABELS],
        "model": "vit_micro",
        "precisions": ["fp32"],
        "quick": True,
        "records": str(tmp_path / "records"),
        "result": str(tmp_path / "facts.json"),
        "run_prefix": "groups",
        "attempt": 1,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    port = free_port()
    procs = []
    for rank in range(4):
        env = {
            **os.environ,
            "PYTHONPATH": ROOT,
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank % 2),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "VIT_SCALE_NODE_NAME": f"node{rank // 2}",
            "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
        }
        procs.append(
            subprocess.Popen(
                [
                    PYTHON,
                    str(script),
                    str(tmp_path / f"report.{rank}.jsonl"),
                    "system.launcher=torchrun",
                    f"spec={tmp_path / 'spec.json'}",
                ],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=1200)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(out[-3000:] for out in outputs)
    rows = json.loads((tmp_path / "facts.json").read_text())["strategies"]
    assert [(r["label"], r["status"]) for r in rows] == [(label, "ok") for label in LABELS], rows
    for rank in range(4):
        events = [json.loads(line) for line in (tmp_path / f"report.{rank}.jsonl").read_text().splitlines()]
        made = {e["label"]: e for e in events if "label" in e}
        assert [e["live"] for e in events if "live" in e] == [1] * len(LABELS), (rank, events)
        # nor is a label's run (its model, optimizer state, buckets) alive after it, on any rank
        assert [e["runs"] for e in events if "runs" in e] == [0] * len(LABELS), (rank, events)
        # the labels that make groups did make some (else this test would prove nothing), all bounded
        assert made["HYBRID_2GPU"]["made"] >= 2 and made["ZERO1"]["made"] >= 1 and made["ZERO3"]["made"] >= 1, made
        assert all(t == 300 for e in made.values() for t in e["timeouts"]), made
    assert all(r["collective_timeout_s"] == 300 for r in rows), rows
