"""train.compile (issue 12): compiled DDP and FULL_SHARD (FSDP1 with use_orig_params, FSDP2) train the eager model:
per-step losses within a relative 1e-3 of eager DDP's on the same 2 ranks, replicas agree, and the
record says what compiling cost. Real torchrun launch over gloo, torch.compile's CPU backend."""

import pytest

from conftest import FAST, by_study, load_runs, losses, run_many, train_refusals

COMPILE_TOL = 1e-3  # compiled kernels may fuse and reorder floating-point work


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile")
    out = f"output.dir={tmp / 'runs'}"
    runs = [
        [*FAST, out, "strategy=DDP", "output.study=eager-ddp"],
        [*FAST, out, "strategy=DDP", "train.compile=true", "output.study=compiled-ddp"],
        [
            *FAST,
            out,
            "strategy=FULL_SHARD",
            "fsdp.use_orig_params=true",
            "train.compile=true",
            "output.study=compiled-fsdp1",
        ],
        [*FAST, out, "strategy=FULL_SHARD", "fsdp.version=2", "train.compile=true", "output.study=compiled-fsdp2"],
    ]
    run_many(2, runs, tmp, timeout=900)
    return by_study(load_runs(tmp / "runs"))


@pytest.mark.parametrize("study", ["compiled-ddp", "compiled-fsdp1", "compiled-fsdp2"])
def test_compiled_runs_give_the_eager_losses(compiled_runs, study):
    end = compiled_runs[study][-1]
    assert end["status"] == "ok" and end["replicas_agree"] is True, end
    reference, compiled = losses(compiled_runs["eager-ddp"]), losses(compiled_runs[study])
    assert len(reference) == len(compiled) == 4
    for step, (a, b) in enumerate(zip(reference, compiled, strict=True), 1):
        assert abs(a - b) <= COMPILE_TOL * abs(a), f"{study}: step {step} loss {b} against eager DDP's {a}"


@pytest.mark.parametrize("study", ["compiled-ddp", "compiled-fsdp1", "compiled-fsdp2"])
def test_the_record_says_what_compiling_cost(compiled_runs, study):
    start, end = compiled_runs[study][0], compiled_runs[study][-1]
    assert start["strategy"]["options"]["compile"] is True and start["config"]["train"]["compile"] is True
    facts = end["compile"]
    assert facts["graphs"] >= 1 and facts["first_step_s"] > 0  # this run's graphs, not the process's
    # the first step compiles: it takes longer than any timed step
    assert facts["first_step_s"] > max(
        r["step_time_s"] for r in compiled_runs[study] if r["event"] == "step" and not r["warmup"]
    )
    assert facts["recompiled_in_window"] is (facts["graphs_in_window"] > 0)
    assert compiled_runs["eager-ddp"][-1]["compile"] is None
    assert "compile" not in compiled_runs["eager-ddp"][0]["strategy"]["options"]


REFUSED = {
    "zero2": (
        ["strategy=ZERO2", "train.compile=true"],
        "train.compile: ZERO2 does not compile (its engine owns the model); compile runs with DDP, NO_SHARD, "
        "HYBRID_<g>GPU, SHARD_GRAD_OP, FULL_SHARD; set train.compile=false",
    ),
    "fsdp1-flat": (
        ["strategy=FULL_SHARD", "train.compile=true"],
        "train.compile: under FSDP1 it needs fsdp.use_orig_params=true (with flat parameters torch.compile "
        "falls back to eager inside every unit); set fsdp.use_orig_params=true or fsdp.version=2",
    ),
    "tf32-bf16": (
        ["strategy=DDP", "train.tf32=true", "train.precision=bf16"],
        "train.tf32: only for train.precision=fp32 (a bf16 run already does its matmuls in bf16); "
        "set train.tf32=false or train.precision=fp32",
    ),
}


def test_refused_in_one_line(tmp_path):
    """Each case through `vit-scale train`'s main, all in one process (conftest.train_refusals)."""
    results = train_refusals({name: args for name, (args, _) in REFUSED.items()}, tmp_path)
    for name, (code, _, stderr) in results.items():
        assert code == 2 and stderr.strip() == f"vit-scale: error: {REFUSED[name][1]}", (name, stderr)
    assert not (tmp_path / "runs").exists()
