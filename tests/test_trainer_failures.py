"""How runs end when things go wrong: a dead rank, Slurm's end-of-time signal. Real processes
over gloo, started the way torchrun would start them (RANK, WORLD_SIZE, MASTER_ADDR env)."""

import glob
import json
import os
import signal
import socket
import subprocess
import time

from conftest import PYTHON, ROOT
from vit_scale.record.schema import validate_record_file


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(n, out_dir, extra):
    port = _free_port()
    procs = []
    for rank in range(n):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            PYTHON,
            "-m",
            "vit_scale",
            "train",
            "model=vit_micro",
            "train.batch_size=4",
            "train.steps=100000",
            "train.warmup_steps=2",
            "train.print_every=100000",
            f"output.dir={out_dir}",
            *extra,
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def _wait_for_steps(out_dir, count, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        paths = glob.glob(os.path.join(str(out_dir), "**", "metrics.jsonl"), recursive=True)
        if paths:
            with open(paths[0]) as f:
                if sum(1 for line in f if '"event": "step"' in line) >= count:
                    return paths[0]
        time.sleep(0.2)
    raise AssertionError(f"no {count} steps recorded within {timeout} s")


def _end_record(path):
    records = validate_record_file(path)
    assert records[-1]["event"] == "end", "the run left no end record"
    return records[-1]


def test_a_killed_rank_ends_the_job_with_a_failed_record(tmp_path):
    timeout_s = 30
    procs = _start_ranks(2, tmp_path, ["strategy=FULL_SHARD", f"system.collective_timeout_s={timeout_s}"])
    try:
        path = _wait_for_steps(tmp_path, 5)
        killed_at = time.time()
        procs[1].send_signal(signal.SIGKILL)
        code = procs[0].wait(timeout=timeout_s + 30)
        ended_after = time.time() - killed_at
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    end = _end_record(path)
    assert end["status"] == "failed" and end["error"], end
    assert end["steps_done"] >= 5
    assert code == 1
    assert ended_after < timeout_s + 15, f"rank 0 hung for {ended_after:.0f} s after its peer died"


def test_sigterm_from_slurm_leaves_a_timeout_record(tmp_path):
    procs = _start_ranks(2, tmp_path, ["strategy=DDP"])
    try:
        path = _wait_for_steps(tmp_path, 5)
        for p in procs:  # Slurm signals every task of the step at the time limit
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
        out0 = procs[0].communicate()[0]
    finally:
        for p in procs:
            p.kill()
    end = _end_record(path)
    assert end["status"] == "timeout", end
    assert "SIGTERM" in end["error"]
    assert end["steps_done"] >= 5 and end["replicas_agree"] is None
    assert end["images_per_s"]["mean"] > 0  # what was measured before the signal is kept
    assert codes[0] == 5
    assert "TIMEOUT" in out0


def test_sigusr1_single_process(tmp_path):
    procs = _start_ranks(1, tmp_path, ["strategy=DDP"])
    path = _wait_for_steps(tmp_path, 3)
    procs[0].send_signal(signal.SIGUSR1)
    assert procs[0].wait(timeout=60) == 5
    procs[0].communicate()
    end = _end_record(path)
    assert end["status"] == "timeout" and "SIGUSR1" in end["error"]
    with open(path) as f:
        steps = [json.loads(line) for line in f if '"step"' in line and '"event": "step"' in line]
    assert end["steps_done"] == steps[-1]["step"]
