"""vit-scale check on this CPU, as a user runs it: real ranks over gloo on emulated nodes, through
the study's launchers, without Slurm (on the local Slurm cluster: tests/test_check_allocations.py).

Failures are injected one of each kind, several in one check: a label the capability table
refuses (CAI_DDP_FP16 on a CPU), a label that fails in its second step (the worker run through a
VIT_SCALE_PYTHON that patches the trainer, as tests/jobs_support.py does for the study), a kernel
that is not built (an empty TORCH_EXTENSIONS_DIR with ZERO1, and a `vit-scale prepare` that
fails), a transport that is not the expected one (VIT_SCALE_EXPECT_TRANSPORT=ib). What cannot
exist here, NCCL's log lines and GPUs, is given to the verdict as NCCL prints it and as a GPU
rank reports it (test_nccl_* and test_gpu_*), on the check.json of a real run.
"""

import copy
import json
import os
import re
import subprocess
import sys

import pytest

import jobs_support
from conftest import PYTHON, ROOT, require_module

jsonschema = require_module("jsonschema", "pip install 'vit-scale[test]'")

DOCS = os.path.join(ROOT, "docs", "check.md")
STUDY = [
    "--system",
    "local",
    "--models",
    "vit_micro",
    "--steps",
    "3",
    "--warmup-steps",
    "1",
    "--set",
    "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
    "--batch-size",
    "2",
    "--out",
    "runs",
    "--no-analysis",
    "--check",
    "--repeat",
    "1",
]

# the worker, with SHARD_GRAD_OP raising in its second step on every rank, the meter's trainer run
# raising in its second step on rank 0, and rank 3 alone getting a wrong reduce-scatter across nodes
WRONG_ON_RANK_3 = """
from vit_scale.check import collectives, worker  # noqa: E402

real_result_is_right = collectives.result_is_right


def wrong_on_rank_3_across_nodes(collective, recv, ranks, piece):
    import torch.distributed as dist

    if collective == "reduce_scatter" and ranks == 4 and dist.get_rank() == 3:
        return False
    return real_result_is_right(collective, recv, ranks, piece)


collectives.result_is_right = wrong_on_rank_3_across_nodes
sys.exit(worker.main(sys.argv[1:]))"""
INJECT = jobs_support.INJECT.format(
    when='self.cfg.strategy == "SHARD_GRAD_OP" or self.cfg.output.study == "meter"',
    action='raise RuntimeError("injected by the test: " + ("the meter\'s run" if self.cfg.output.study == "meter" '
    'else "SHARD_GRAD_OP") + " breaks in its second step")',
    entry=WRONG_ON_RANK_3,
)
# VIT_SCALE_PYTHON: the worker with the injection, a `vit-scale prepare` that cannot build, the rest as is
WRAPPER = """#!/bin/bash
if [ "${{1:-}} ${{2:-}}" = "-m vit_scale.check.worker" ]; then
  shift 2
  exec {python} {inject} "$@"
fi
if [ "${{1:-}} ${{2:-}} ${{3:-}}" = "-m vit_scale prepare" ]; then
  echo "vit-scale prepare: injected by the test: no compiler here" >&2
  exit 1
fi
exec {python} "$@"
"""


def docs_schema() -> dict:
    text = open(DOCS).read()
    found = re.search(
        r"<!-- check.json schema: begin[^>]*-->\s*```json\n(.*?)```\s*<!-- check.json schema: end -->", text, re.S
    )
    assert found, "docs/check.md has no check.json schema between its markers"
    return json.loads(found.group(1))


def valid_check(path) -> dict:
    """check.json, validated against the schema docs/check.md carries."""
    with open(path) as f:
        check = json.load(f)
    jsonschema.validate(check, docs_schema(), cls=jsonschema.Draft202012Validator)
    return check


def lines_of(check: dict) -> dict:
    return {line["check"]: line for line in check["lines"]}


def fail_lines(stderr: str, prog: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: FAIL ")]


def run(args, cwd, env=None, timeout=300):
    return subprocess.run(
        [PYTHON, "-m", "vit_scale", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


# ---------------------------------------------------------------- real checks


@pytest.fixture(scope="module")
def passing_study(tmp_path_factory):
    """`vit-scale study --check` on 1 emulated node without Slurm: the check passes, then the run."""
    work = tmp_path_factory.mktemp("passing")
    proc = run(
        ["study", *STUDY, "--nodes", "1", "--strategies", "DDP", "--study", "s"], work, env={"VIT_SCALE_PYTHON": PYTHON}
    )
    return work, proc


@pytest.fixture(scope="module")
def broken_study(tmp_path_factory):
    """`vit-scale study --check` on 2 emulated nodes with six failures injected."""
    work = tmp_path_factory.mktemp("broken")
    inject, wrapper = work / "inject_check.py", work / "python-injecting"
    inject.write_text(INJECT)
    wrapper.write_text(WRAPPER.format(python=PYTHON, inject=inject))
    wrapper.chmod(0o755)
    (work / "no-kernels").mkdir()
    proc = run(
        ["study", *STUDY, "--nodes", "2", "--strategies", "DDP,CAI_DDP_FP16,SHARD_GRAD_OP,ZERO1", "--study", "b"],
        work,
        env={
            "VIT_SCALE_PYTHON": str(wrapper),
            "TORCH_EXTENSIONS_DIR": str(work / "no-kernels"),
            "VIT_SCALE_EXPECT_TRANSPORT": "ib",
            "PYTHONPATH": ROOT,
        },
    )
    return work, proc


def test_study_check_passes_on_one_node_then_the_study_runs(passing_study):
    work, proc = passing_study
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = valid_check(work / "runs" / "s" / "check.json")
    assert check["ok"] and check["nodes"] == 1 and check["ranks_per_node"] == 2 and check["quick"]
    found = lines_of(check)
    fit_status = {name: line["status"] for name, line in found.items() if " fit " in name}
    assert {name: line["status"] for name, line in found.items() if name not in fit_status} == {
        "versions": "info",
        "modules": "info",
        "devices": "ok",
        "transport": "ok",
        "kernels": "ok",
        "all_reduce": "ok",
        "all_gather": "ok",
        "reduce_scatter": "ok",
        "DDP fp32": "ok",
        "meter overhead": "info",
        "meter timing": "info",
        "meter memory": "skipped",
        "compute fp32": "info",
        "nodes": "ok",  # one node: its compute, nothing to compare it with
    }
    assert sorted(check["per_node"]["hosts"]) == ["local0"] and check["per_node"]["slow"] == []
    # quick mode still fits each collective (within the node only here); a fit it cannot vouch for warns
    assert set(fit_status) == {f"{c} fit intra" for c in ("all_reduce", "all_gather", "reduce_scatter")}
    assert set(fit_status.values()) <= {"info", "warn"}
    facts = check["facts"]
    assert facts["versions"]["torch"] and facts["world"]["backend"] == "gloo"
    # the world's collectives wait minutes, not the rendezvous' half hour
    assert facts["world"]["collective_timeout_s"] == 300
    assert [r["node"] for r in facts["ranks"]] == ["local0", "local0"]
    assert check["transport"]["observed"] == ["tcp"]
    # within the node only, each size timed, bus bandwidth as nccl-tests defines it
    measured = facts["interconnect"]["measurements"]
    assert {m["scope"] for m in measured} == {"node"}
    assert {(m["collective"], m["size"]) for m in measured} >= {
        (c, s) for c in ("all_reduce", "all_gather", "reduce_scatter") for s in ("latency", "block", "bucket")
    }
    for m in measured:
        assert m["correct"] and m["time_s"] > 0
        factor = 2 * (m["ranks"] - 1) / m["ranks"] if m["collective"] == "all_reduce" else (m["ranks"] - 1) / m["ranks"]
        assert m["algbw_gbs"] == pytest.approx(m["bytes"] / m["time_s"] / 1e9)
        assert m["busbw_gbs"] == pytest.approx(m["algbw_gbs"] * factor)
    bucket = next(m for m in measured if m["size"] == "bucket")
    # DDP's 25 MiB bucket, or (quick mode, where the rate found says a call would take over 0.5 s: a loaded
    # machine) the largest power-of-two multiple of the Block that fits, said in facts.interconnect.skipped
    cuts = [s for s in facts["interconnect"]["skipped"] if s["size"] == "bucket" and s.get("measured_bytes")]
    assert bucket["bytes"] == 25 * 2**20 or any(c["measured_bytes"] == bucket["bytes"] for c in cuts), cuts
    assert_computes(check, work / "runs" / "s" / "check.json", work)
    meter = facts["meter"]
    assert meter["ratio"] > 0 and meter["event_step_s"] > 0 and meter["host_step_s"] > 0 and meter["steps_compared"] > 0
    # then the study ran, and its summary shows the check
    assert "[1/1] vit_micro DDP n1 (2 ranks) ... ok" in proc.stdout
    assert "  check:       ready (" in proc.stdout and "transport tcp, expected tcp" in proc.stdout
    assert not (work / "runs" / "s" / "check").exists()  # the check's records stay out of the study's
    # a study of one model keeps its check by node count and model, and check.json is a copy of it
    kept = work / "runs" / "s" / "check-n1-vit_micro.json"
    assert kept.read_text() == (work / "runs" / "s" / "check.json").read_text()


def test_report_shows_the_checks_facts(passing_study):
    work, _ = passing_study
    sys.path.insert(0, ROOT)
    from analysis import report

    text = report.to_markdown(report._check_section([str(work / "runs" / "s")]))
    assert "## System check" in text and "| verdict | ready (" in text
    assert re.search(r"\| transport between nodes \| tcp, expected tcp \|", text)
    # the bucket whole, or cut to what quick mode's 0.5 s a call allows at the rate found (a loaded machine)
    bucket = r"(25 MiB \(DDP bucket\)|[0-9.]+ [KM]iB \(DDP bucket, cut to [0-9.]+ [KM]iB\))"
    assert re.search(rf"\| all_reduce \| within a node \| 2 \| {bucket} \| [0-9.]+ \|", text), text
    assert report._check_section([str(work / "runs")]) == []  # no check.json there: no section


def test_study_check_refuses_to_start_and_says_each_failure_in_one_line(broken_study):
    work, proc = broken_study
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    prog = "vit-scale study --check"
    failures = fail_lines(proc.stderr, prog)
    assert len(failures) == 6, proc.stderr
    text = "\n".join(failures)
    assert re.search(r"FAIL transport: tcp between nodes \(gloo: tcp\), expected ib; .*--expect-transport", text)
    assert re.search(
        r"FAIL kernel deepspeed\.cpu_adam: not built on local0, local1 .*needed by ZERO1; run: "
        r"vit-scale prepare --strategies ZERO1",
        text,
    )
    assert "FAIL CAI_DDP_FP16 fp32: strategy: CAI_DDP_FP16 needs a GPU" in text
    assert re.search(
        r"FAIL SHARD_GRAD_OP fp32: failed: rank \d: RuntimeError: injected by the test: SHARD_GRAD_OP "
        r"breaks in its second step; see .*b\.check/records/",
        text,
    )
    # the meter's failed trainer run is a line, and the check goes on
    assert re.search(
        r"FAIL meter: RuntimeError: the trainer's DDP run failed: RuntimeError: injected by the test: "
        r"the meter's run breaks in its second step \(record: .*/records/meter/",
        text,
    ), text
    # a wrong result seen on rank 3 alone is reported
    assert re.search(r"FAIL reduce_scatter: wrong result across nodes at .* \(4 ranks\)", text), text
    assert "vit-scale study: the check found the system not ready" in proc.stderr
    assert "no run was started" in proc.stderr and " ... ok" not in proc.stdout
    assert not list((work / "runs" / "b").glob("vit_micro"))

    check = valid_check(work / "runs" / "b" / "check.json")
    assert not check["ok"] and check["exit_code"] == 1
    found = lines_of(check)
    # everything not injected holds, on two emulated nodes
    assert found["DDP fp32"]["status"] == "ok" and found["ZERO1 fp32"]["status"] == "ok"
    assert found["devices"]["status"] == "ok" and "(local0, local1)" in found["devices"]["text"]
    for collective in ("all_reduce", "all_gather"):
        assert found[collective]["status"] == "ok" and "across nodes (4 ranks)" in found[collective]["text"]
    # the quick sweep's fits, both scopes, although the reduce-scatter across nodes was wrong on rank 3
    # (its points are left out: wrong results are not points)
    assert_fits(
        check,
        min_sizes=4,
        pairs={(c, s) for c in ("all_reduce", "all_gather", "reduce_scatter") for s in ("intra", "inter")}
        - {("reduce_scatter", "inter")},
    )
    assert_calibrates(check, str(work / "runs" / "b" / "check.json"))
    assert found["CAI_DDP_FP16 fp32"]["status"] == "refused"
    # the label after the one that took the ranks down ran in a second launch
    attempts = check["launch"]["attempts"]
    assert len(attempts) == 2 and attempts[1]["labels"] == [["ZERO1", "fp32"]], attempts
    assert "some kernels could not be built" in proc.stderr  # the study's prepare failed; the check said which


def assert_fits(check: dict, min_sizes: int, pairs: set) -> None:
    """check.json's `fits` (one per collective, scope and group size) and `step_fits` (one per collective
    and scope, over every group size: with 2 ranks a node and 2 nodes, one size each, 2 and 4 ranks), each
    from at least `min_sizes` sizes, a usable one with a latency and a positive bus bandwidth, a flagged
    one saying why; the check's line of each is the step fit's."""
    fits = {(f["collective"], f["scope"]): f for f in check["fits"]}
    assert set(fits) == pairs and len(check["fits"]) == len(pairs), check["fits"]
    steps = {(f["collective"], f["scope"]): f for f in check["step_fits"]}
    assert set(steps) == pairs, check["step_fits"]
    for f in fits.values():
        assert f["sizes"] >= min_sizes and f["ranks"] == (2 if f["scope"] == "intra" else 4), f
    for f in steps.values():
        assert f["sizes"] >= min_sizes and f["groups"] == [2 if f["scope"] == "intra" else 4], f
        if f["usable"]:
            assert f["step_latency_us"] >= 0 and f["launch_us"] >= 0 and f["bus_gbps"] > 0 and not f["flags"], f
        else:
            assert f["flags"] and all(isinstance(flag, str) and flag for flag in f["flags"]), f
        line = lines_of(check)[f"{f['collective']} fit {f['scope']}"]
        assert not line["needed"] and line["status"] == ("info" if f["usable"] else "warn"), line
        assert ("not used: " in line["text"]) != f["usable"], line
        assert f"from {f['groups'][0]} ranks" in line["text"], line


def assert_computes(check: dict, path, work) -> None:
    """The Block's GEMMs timed at the study's model, batch and precision (check.json's compute), and the
    plan's 1-node compute is their sum scaled to the step (the FLOPs' stem and head at their rate), named
    as such (the derivation's arithmetic: tests/test_compute_from_check.py)."""
    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape
    from vit_scale.planning.step_time import forward_flops_per_image

    [entry] = check["compute"]["entries"]
    assert (entry["model"], entry["precision"], entry["batch_size"]) == ("vit_micro", "fp32", 2), entry
    assert len(entry["ops"]) == 18 and all(op["seconds"] > 0 for op in entry["ops"])
    assert check["compute"]["timer"] == "time.perf_counter" and entry["efficiency"] is None  # a CPU: no peak
    argv = ["plan", "--system", "local", "--model", "vit_micro", "--strategy", "DDP", "--nodes", "1", "--batch-size"]
    proc = run([*argv, "2", "--precision", "fp32", "--calibration", str(path), "--json"], work)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["rows"]
    shape = Shape.from_spec(get_spec("vit_micro"))
    f = forward_flops_per_image(shape)
    rate = entry["flops"] / entry["seconds"]
    timed = sum(op["seconds"] for op in entry["ops"])
    step = row["prediction"]["step"]
    assert step["forward_s"] + step["backward_s"] == pytest.approx(
        shape.L * timed + 3 * 2 * (f["stem"] + f["head"]) / rate, rel=1e-5
    )
    assert row["prediction"]["compute_from"] == "check's GEMMs at this model's shapes"


def assert_calibrates(check: dict, path: str) -> None:
    """vit_scale.planning.predict takes the file as a calibration: its usable step fits replace the
    profile's defaults, each flagged one is named as not used, and a prediction comes out, extrapolated
    beyond the largest group the check formed."""
    from vit_scale.planning import predict
    from vit_scale.planning.scenario import Scenario

    cal = predict.choose_calibration(
        path, predict.profile_path("local"), system="local", models=["vit_micro"], precisions=["fp32"]
    )
    # a check whose fits were all flagged calibrates nothing: the profile's defaults, said so
    usable = [f for f in check["step_fits"] if f["usable"]]
    assert cal.kind == ("check" if usable else "profile"), cal.describe()
    for f in check["step_fits"]:
        named = f"{f['collective']}/{f['scope']}"
        assert (f"{named} not used: " in cal.describe()) != f["usable"], cal.describe()
        assert ((f["collective"], f["scope"]) in cal.network.per_collective) == f["usable"]
    sc = Scenario(model="vit_micro", strategy="FULL_SHARD", nodes=2, gpus_per_node=2, batch_size=8, precision="fp32")
    far = Scenario(model="vit_micro", strategy="FULL_SHARD", nodes=8, gpus_per_node=2, batch_size=8, precision="fp32")
    step, beyond = predict.predict([sc, far], cal, predict.compute_from_flops(1.0, 0.5), blocking=True)
    assert step.images_per_s > 0 and step.breakdown.exposed_inter_s > 0
    if usable:
        # 2 nodes' world group is 4 ranks: within what was fitted only if a usable fit saw 4 (one across
        # nodes); the within-node fits alone saw 2 (a noisy sweep can flag every fit across nodes)
        seen = max(f["largest_ranks"] for f in usable)
        assert step.extrapolated == (seen < 4) and beyond.extrapolated, (seen, step.extrapolated)


# ---------------------------------------------------------------- what needs a GPU, on real check.json

NCCL_IB = """n1:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
n1:1234:1234 [0] NCCL INFO Using network IB
n1:1234:1240 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0/GDRDMA
n1:1234:1240 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC
"""
NCCL_SOCKET = """n1:1234:1234 [0] NCCL INFO NET/IB : No device found.
n1:1234:1234 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.1.1<0>
n1:1234:1234 [0] NCCL INFO Using network Socket
n1:1234:1240 [0] NCCL INFO Channel 00/0 : 4[0] -> 0[0] [receive] via NET/Socket/0
"""
RCCL_OFI = """frontier00001:555:555 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
frontier00001:555:555 [0] NCCL INFO Using network AWS Libfabric
frontier00001:555:560 [0] NCCL INFO Channel 00/0 : 0[c1000] -> 8[c1000] [send] via NET/AWS Libfabric/0/GDRDMA
"""


def as_if(check: dict, **changes) -> dict:
    changed = copy.deepcopy(check)
    changed.update(changes)
    return changed


def verdict_of(check: dict) -> dict:
    from vit_scale.check import verdict

    return {line.check: line for line in verdict.lines(check)}


@pytest.mark.parametrize(
    "system, log, nodes, status, text",
    [
        ("cuda", NCCL_IB, 2, "ok", "ib between nodes (nccl: IB), expected ib or ofi"),
        ("cuda", NCCL_SOCKET, 2, "fail", "socket between nodes (nccl: Socket), expected ib or ofi"),
        # on one node NCCL connects no nodes: what it loaded is said, not failed (Frontier's one-node steps get Socket)
        ("cuda", NCCL_SOCKET, 1, "warn", "socket for a job over several nodes (nccl: Socket), expected ib or ofi"),
        ("frontier", RCCL_OFI, 2, "ok", "ofi between nodes (nccl: AWS Libfabric), expected ofi"),
        ("frontier", NCCL_IB, 2, "fail", "ib between nodes (nccl: IB), expected ofi"),
        ("frontier", "", 2, "fail", "nccl said nothing about its network (expected ofi)"),
    ],
)
def test_nccl_transport_from_its_log_lines(passing_study, system, log, nodes, status, text):
    """NCCL's own lines (mocked: no NCCL here) decide the transport line, as on a GPU cluster."""
    from vit_scale.check.environment import expected_transport, transport_facts
    from vit_scale.cluster.systems import read_system

    work, _ = passing_study
    real = valid_check(work / "runs" / "s" / "check.json")
    facts = transport_facts("nccl", log, expected_transport(read_system(system).inter_node_transport, "nccl"))
    line = verdict_of(as_if(real, system=system, nodes=nodes, ranks_per_node=1, transport=facts))["transport"]
    assert (line.status, line.text) == (status, text), line
    assert line.broken == (status == "fail")
    if status != "ok":
        assert line.fix


def test_gpu_ranks_sharing_or_missing_a_gpu_fail_the_devices_line(passing_study):
    """Two ranks of a node reporting one GPU's UUID, or a rank that sees none (mocked GPU ranks)."""
    work, _ = passing_study
    real = valid_check(work / "runs" / "s" / "check.json")
    gpu_ranks = [
        {
            **r,
            "device_type": "cuda",
            "device_index": 0,
            "device_name": "NVIDIA H100",
            "device_id": "GPU-1234",
            "visible_devices": {"CUDA_VISIBLE_DEVICES": "0"},
        }
        for r in real["facts"]["ranks"]
    ]
    shared = as_if(real, backend="nccl")
    shared["facts"]["ranks"] = gpu_ranks
    line = verdict_of(shared)["devices"]
    assert line.status == "fail" and line.text == "ranks 0, 1 on local0 drive the same GPU (GPU-1234)", line
    blind = as_if(real, backend="nccl")
    blind["facts"]["ranks"] = [gpu_ranks[0], real["facts"]["ranks"][1]]
    line = verdict_of(blind)["devices"]
    assert line.status == "fail" and "1 of 2 ranks see no GPU (first: rank 1 on local0" in line.text, line


def test_bad_input_is_one_line(tmp_path, capsys):
    from vit_scale.check import cli

    assert cli.main(["--system", "local", "--batch-size", "0"]) == 2  # the timed GEMMs' batch
    assert capsys.readouterr().err == (
        "vit-scale check: --batch-size: '0' is not allowed; allowed: a whole number of at least 1\n"
    )
    proc = run(["check", "--system", "local", "--precision", "fp8"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "vit-scale check: --precision: 'fp8' is not allowed; allowed: fp32, bf16, fp16\n"
    proc = run(["check", "--system", "local", "--strategies", "DDP,NOPE"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown strategy 'NOPE'" in proc.stderr


def test_the_schema_in_the_docs_is_the_codes():
    from vit_scale.check.schema import CHECK_SCHEMA

    assert docs_schema() == CHECK_SCHEMA, "regenerate docs/check.md's block: python -m vit_scale.check.schema"
    jsonschema.Draft202012Validator.check_schema(CHECK_SCHEMA)


# ---------------------------------------------------------------- the decisions, without a launch


def ring_sum(values, dtype):
    """What a ring all-reduce computes: each hop adds one rank's value to the partial sum and
    rounds it to the buffer's type (as NCCL's reduction kernels do)."""
    import numpy
    import torch

    if dtype == torch.float32:  # numpy's float32 rounds each addition the same way, much faster
        total = numpy.float32(values[0])
        for value in values[1:]:
            total = numpy.float32(total + numpy.float32(value))
        return torch.tensor(total)
    total = torch.tensor(values[0], dtype=dtype)
    for value in values[1:]:
        total = (total + torch.tensor(value, dtype=dtype)).to(dtype)
    return total.float()


def test_collective_check_is_exact_where_a_bf16_ring_is_not():
    """384 ranks: a bf16 ring's per-hop rounding puts a right sum more than 1% off n(n+1)/2 (the old
    rule failed it); the check sums in fp32, exact at any size (tests/test_check_scale.py), and still
    catches a lost rank."""
    import torch

    from vit_scale.check.collectives import check_value, expected_sum, result_is_right

    n = 384
    values = [float(rank + 1) for rank in range(n)]
    bf16 = ring_sum(values, torch.bfloat16)
    assert not torch.allclose(bf16, torch.tensor(n * (n + 1) / 2), rtol=1e-2)  # why the check left bf16
    sent = [float(check_value("all_reduce", rank, n)) for rank in range(n)]
    exact = ring_sum(sent, torch.float32)
    assert result_is_right("all_reduce", exact.repeat(n), n, 1)
    lost_one = ring_sum(sent[:-1], torch.float32)
    assert not result_is_right("all_reduce", lost_one.repeat(n), n, 1)
    assert not result_is_right("reduce_scatter", (exact + 1).repeat(3), n, 3)
    assert exact.item() == expected_sum(n)
    gathered = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(2)
    assert result_is_right("all_gather", gathered, n, 2)
    assert not result_is_right("all_gather", gathered.flip(0), n, 2)


def test_scopes_come_from_every_ranks_node_and_uneven_placement_is_refused():
    from vit_scale.check.collectives import scopes_for
    from vit_scale.errors import UserError

    assert scopes_for(["a", "b", "a", "b"]) == [("node", 2), ("world", 4)]  # cyclic placement
    assert scopes_for(["a", "b"]) == [("world", 2)]
    assert scopes_for(["a", "a"]) == [("node", 2)]
    with pytest.raises(UserError) as refused:
        scopes_for(["a", "a", "b"])  # rank 2 alone would skip the within-a-node collectives and hang the rest
    assert str(refused.value).startswith("ranks per node: uneven placement (a 2, b 1); allowed: the same number")
    assert "\n" not in str(refused.value)


def test_nccl_lines_are_read_from_their_files(tmp_path):
    """NCCL_DEBUG_FILE's files (one per logging process, as NCCL names them) decide the transport,
    with the launch's log read too (mocked lines: no NCCL here)."""
    from vit_scale.check.environment import collective_logs, nccl_log_name, transport_facts

    logs = tmp_path / "logs"
    logs.mkdir()
    stamp = "20260101-000000-1"
    (logs / nccl_log_name(stamp, 1).replace("%h", "n1").replace("%p", "1234")).write_text(NCCL_IB)
    (logs / nccl_log_name("20250101-000000-9", 1).replace("%h", "n1").replace("%p", "9")).write_text(NCCL_SOCKET)
    rank_log = logs / f"check.{stamp}.1.log"
    rank_log.write_text("rank output, NCCL's lines lost to os._exit\n")
    text = "".join(line for lines in collective_logs(str(tmp_path), stamp, [str(rank_log)]) for line in lines)
    assert "Socket" not in text and "rank output" in text  # another check's file is not read
    facts = transport_facts("nccl", collective_logs(str(tmp_path), stamp, [str(rank_log)]), ("ib", "ofi"))
    assert facts["observed"] == ["ib"], facts
    assert nccl_log_name(stamp, 2) == f"nccl.{stamp}.2.%h.%p.log"


class Props:
    def __init__(self, uuid, domain=None, bus=None, device=None):
        self.uuid, self.pci_domain_id, self.pci_bus_id, self.pci_device_id = uuid, domain, bus, device


def test_gpu_identity_is_the_pci_address_and_never_a_placeholder_uuid():
    """Device properties as torch reports them on ROCm and CUDA (mocked: no GPU here)."""
    from vit_scale.check.environment import gpu_identity

    assert gpu_identity(Props("GPU-XX", 0, 0xC1, 0)) == "pci 0000:c1:00"
    assert gpu_identity(Props("GPU-XX", 0, 0xD1, 0)) != gpu_identity(Props("GPU-XX", 0, 0xC1, 0))
    assert gpu_identity(Props("GPU-XX")) is None
    assert gpu_identity(Props("00000000-0000-0000-0000-000000000000")) is None
    real = "8c1bd5e2-4a1f-7b3c-9d0e-112233445566"
    assert gpu_identity(Props(real)) == real


class FakeOutcome:
    def __init__(self, code, timed_out, seconds):
        self.code, self.timed_out, self.seconds, self.interrupted = code, timed_out, seconds, False


def test_time_limit_is_one_deadline_and_a_broken_meter_is_left_out_of_the_next_launch(tmp_path, monkeypatch):
    """The relaunch decisions, with the launches faked: a meter that took rank 0 down, then a label
    that ran out of the one --time-limit every launch shares."""
    from vit_scale.check import launches as launches_module
    from vit_scale.check import ledger
    from vit_scale.check.options import PARTS, Request, parse

    check = launches_module.Launches(
        Request(
            parse(["--system", "local", "--strategies", "DDP,ZERO1", "--out", str(tmp_path), "--time-limit", "0.05"])
        )
    )
    clock = [1000.0]
    monkeypatch.setattr(launches_module.time, "monotonic", lambda: clock[0])
    launches = []

    def launch(supervisor, parts, labels, attempt, stamp, left_s):
        launches.append((parts, left_s))
        clock[0] += 2.0
        world = {"world": {"world_size": 2}}
        if attempt == 1:
            return (
                {**world, "in_progress": {"part": "meter", "settings": {"model": "vit_micro"}}},
                FakeOutcome(1, False, 2.0),
                "log",
            )
        clock[0] += left_s
        return (
            {
                **world,
                "parts_done": ["environment", "interconnect"],
                "in_progress": {"label": "DDP", "precision": "fp32"},
            },
            FakeOutcome(124, True, left_s),
            "log",
        )

    monkeypatch.setattr(check, "launch", launch)
    monkeypatch.setattr(ledger, "last_line", lambda log: "the last line")
    facts, attempts = check.launch_until_done(type("S", (), {"interrupted": False})(), "stamp")
    assert [parts for parts, _ in launches] == [list(PARTS), ["environment", "nodes", "interconnect", "strategies"]]
    assert launches[0][1] == pytest.approx(3.0) and launches[1][1] == pytest.approx(1.0)
    assert facts["meter"] == {
        "error": "failed: the trainer's run ended the ranks (exit 1): the last line",
        "settings": {"model": "vit_micro"},
    }
    rows = {r["label"]: r for r in facts["strategies"]}
    assert rows["DDP"]["status"] == "timeout" and rows["ZERO1"]["status"] == "timeout"
    assert "used all of --time-limit 0.05 min" in rows["ZERO1"]["error"]


def test_full_sweep_runs_from_8_bytes_to_the_largest_message_of_the_strategies():
    """At least 8 sizes, 8 B first, up to the largest of a Block, DDP's bucket and ZeRO's bucket (the
    whole model, for a model smaller than DeepSpeed's bucket); quick keeps its five (64 KiB finds the rate
    its Block and bucket follow)."""
    from vit_scale.check.collectives import block_bytes, sizes_for, zero_bucket_bytes
    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape

    for model, precision in (("vit_micro", "fp32"), ("vit_base", "bf16")):
        sizes = sizes_for(model, precision, quick=False)
        assert len({s.nbytes for s in sizes}) >= 8 and sizes[0].nbytes == 8
        assert [s.nbytes for s in sizes] == sorted(s.nbytes for s in sizes)
        assert zero_bucket_bytes(model, precision) == Shape.from_spec(get_spec(model)).params * (
            4 if precision == "fp32" else 2
        )
        largest = max(block_bytes(model, precision), 25 * 2**20, zero_bucket_bytes(model, precision))
        assert sizes[-1].nbytes == largest and {"block", "bucket"} <= {s.name for s in sizes}
    quick = sizes_for("vit_micro", "fp32", quick=True)
    assert [s.name for s in quick] == ["latency", "latency", "sweep", "block", "bucket"]
    assert [s.nbytes for s in quick][:3] == [8, 4096, 65536]


def test_fits_of_measurements_keep_a_flagged_fit_flagged():
    """fits_of on hand-made points: a clean line gives back its alpha and B; latency points that run
    backwards beyond their spread are flagged, kept, and never NaN or infinite in check.json."""
    from vit_scale.check.collectives import fits_of

    def m(scope, collective, nbytes, seconds, spread=0.0, correct=True):
        return {
            "scope": scope,
            "collective": collective,
            "ranks": 4,
            "bytes": nbytes,
            "time_s": seconds,
            "spread_s": spread,
            "correct": correct,
        }

    sizes = [8 * 8**i for i in range(9)]
    clean = [m("world", "all_gather", s, 50e-6 + s * 0.75 / 2e9) for s in sizes]
    backwards = [m("node", "all_reduce", 8, 900e-6, 1e-6), m("node", "all_reduce", 4096, 100e-6, 1e-6)]
    flat = [m("node", "reduce_scatter", s, 1e-3) for s in (8, 64, 512, 4096)]
    wrong = [m("world", "reduce_scatter", s, 1e-3, correct=False) for s in sizes]
    fits = {(f["collective"], f["scope"]): f for f in fits_of(clean + backwards + flat + wrong)}
    assert set(fits) == {("all_gather", "inter"), ("all_reduce", "intra"), ("reduce_scatter", "intra")}
    good = fits[("all_gather", "inter")]
    assert good["usable"] and good["sizes"] == 9
    assert good["alpha_us"] == pytest.approx(50, rel=1e-3) and good["bus_gbps"] == pytest.approx(2, rel=1e-3)
    assert any(f.startswith("not monotone") for f in fits[("all_reduce", "intra")]["flags"])
    assert not fits[("reduce_scatter", "intra")]["usable"]
    json.dumps(fits_of(clean + backwards + flat), allow_nan=False)


def test_the_sweeps_time_budget_extends_the_line_of_what_was_measured():
    """A latency-bound step (8 B -> 4 KiB) is not expected to cost 512 times the 8 B call; a
    bandwidth-bound one grows with its bytes; named sizes are never left out for time."""
    from vit_scale.check.collectives import FULL, Size, expected_seconds, left_out

    small = {"bytes": 8, "time_s": 1e-3}
    assert expected_seconds([small], 4096) == pytest.approx(1e-3)
    big = {"bytes": 8 + 10**6, "time_s": 1e-3 + 1e-2}
    assert expected_seconds([small, big], 8 + 2 * 10**6) == pytest.approx(1e-3 + 2e-2)
    sweep = Size("sweep", 8 + 10**7, "fp32", "")
    assert left_out("all_reduce", sweep, 2, 0, FULL, [small, big], left_s=1.0).startswith("time budget: ")
    assert left_out("all_reduce", sweep, 2, 0, FULL, [small, big], left_s=100.0) == ""
    assert left_out("all_reduce", Size("bucket", 8 + 10**7, "fp32", ""), 2, 0, FULL, [small, big], 0.0) == ""
    # a group narrower than the scope's widest: its named sizes only feed the fit, within the budget
    narrow = left_out("all_reduce", Size("bucket", 8 + 10**7, "fp32", ""), 2, 0, FULL, [small, big], 0.0, False)
    assert narrow.startswith("time budget: ")
    assert left_out("all_reduce", sweep, 2, 4 * 10**7, FULL, [], 100.0).startswith("memory: ")


@pytest.mark.parametrize("part", ["strategies", "meter"])
def test_a_signal_during_a_part_leaves_it_a_timeout_even_without_its_end_record(tmp_path, monkeypatch, part):
    """A signal stops the launch while a label (or the meter) runs, and its trainer is killed before
    it writes an end record: the second check.json write, after the launch ended, still says the
    signal stopped it (a timeout), not that the ranks failed. The launch is faked: what it returns is
    what a SIGKILLed launch leaves."""
    from vit_scale.check import cli, ledger
    from vit_scale.check.launches import Launches
    from vit_scale.check.options import Request, parse

    request = Request(parse(["--system", "local", "--strategies", "DDP", "--out", str(tmp_path / "c")]))
    supervisor = type("S", (), {"interrupted": False})()

    def launch(self, supervisor_, parts, labels, attempt, stamp, left_s):
        supervisor.interrupted = True
        outcome = FakeOutcome(143, False, 1.0)
        outcome.interrupted = True
        running = {"part": "meter", "settings": {}} if part == "meter" else {"label": "DDP", "precision": "fp32"}
        return {"world": {"world_size": 2}, "in_progress": running}, outcome, "log"

    monkeypatch.setattr(Launches, "launch", launch)
    monkeypatch.setattr(ledger, "last_line", lambda log: "the last line")
    assert cli.run(request, supervisor) == 143
    found = {line["check"]: line for line in json.loads((tmp_path / "c" / "check.json").read_text())["lines"]}
    name = "meter" if part == "meter" else "DDP fp32"
    assert found[name]["text"].startswith("timeout: stopped by a signal"), found[name]


def test_checks_kept_per_node_count_and_model_are_each_read_and_shown(tmp_path):
    """The side-by-side jobs of a --per-model sweep each keep their model's check of one node count;
    the readers (the study's summary, the report) find every one by the one pattern, and a directory
    from before (check-n<N>.json) still reads."""
    from vit_scale.record.check_file import check_files, check_path, checks_of

    sys.path.insert(0, ROOT)
    from analysis import report

    for nodes, model in ((1, "vit_micro"), (1, "vit_tiny"), (2, None)):
        path = check_path(str(tmp_path), nodes, model)
        with open(path, "w") as f:
            json.dump({"schema": 1, "nodes": nodes, "model": model or "vit_base", "lines": [], "facts": {}}, f)
    assert [os.path.basename(p) for p in sorted(os.listdir(tmp_path))] == [
        "check-n1-vit_micro.json",
        "check-n1-vit_tiny.json",
        "check-n2.json",
    ]
    found = check_files(str(tmp_path))
    assert [(n, m, c["model"]) for n, m, _, c in found] == [
        (1, "vit_micro", "vit_micro"),
        (1, "vit_tiny", "vit_tiny"),
        (2, None, "vit_base"),
    ]
    assert [n for n, _ in checks_of(str(tmp_path))] == [1, 1, 2]
    text = report.to_markdown(report._check_section([str(tmp_path)]))
    for title in ("System check: 1 node, vit_micro", "System check: 1 node, vit_tiny", "System check: 2 nodes\n"):
        assert f"## {title}" in text, text


def test_the_labels_group_bound_is_put_back_after_them():
    """The check bounds the groups its labels make through torch's process-wide defaults; torch's own
    are back afterwards, for whatever else the worker process runs (the meter's trainer run)."""
    import torch.distributed.distributed_c10d as c10d

    from vit_scale.check.collectives import COLLECTIVE_TIMEOUT_S
    from vit_scale.check.worker import new_groups_bounded

    torchs = c10d.default_pg_timeout, c10d.default_pg_nccl_timeout
    with pytest.raises(RuntimeError), new_groups_bounded():
        assert c10d.default_pg_timeout.total_seconds() == COLLECTIVE_TIMEOUT_S
        assert c10d.default_pg_nccl_timeout.total_seconds() == COLLECTIVE_TIMEOUT_S
        raise RuntimeError("a label failed")
    assert (c10d.default_pg_timeout, c10d.default_pg_nccl_timeout) == torchs
