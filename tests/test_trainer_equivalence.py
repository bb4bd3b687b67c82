"""Every FSDP mode trains the same model as DDP: same per-step losses on the same ranks, replicas
agree, status ok. Real torchrun launches over gloo, vit_micro, fp32 (the session's launches of 2 and of 4
ranks, tests/shared_launch.py)."""

import itertools

import pytest

import shared_launch
from conftest import FAST, assert_same_losses, by_study, load_runs, losses


def _two_rank_runs(tmp) -> list:
    out = f"output.dir={tmp / 'runs'}"
    runs = [[*FAST, out, "strategy=DDP", "output.study=ddp"]]
    for strategy in ("NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_1GPU", "HYBRID_2GPU"):
        runs.append([*FAST, out, f"strategy={strategy}", f"output.study=fsdp1-{strategy}"])
    for strategy in ("NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP"):
        runs.append([*FAST, out, f"strategy={strategy}", "fsdp.version=2", f"output.study=fsdp2-{strategy}"])
    runs.append(
        [
            *FAST,
            out,
            "strategy=FULL_SHARD",
            "fsdp.use_orig_params=true",
            "fsdp.forward_prefetch=true",
            "output.study=fsdp1-orig-params",
        ]
    )
    for strategy, prefetch, limit in itertools.product(
        ("FULL_SHARD", "SHARD_GRAD_OP"), ("none", "pre", "post"), ("true", "false")
    ):
        runs.append(
            [
                *FAST,
                out,
                f"strategy={strategy}",
                f"fsdp.backward_prefetch={prefetch}",
                f"fsdp.limit_all_gathers={limit}",
                f"output.study=grid-{strategy}-{prefetch}-{limit}",
            ]
        )
    # not compared with fp32 DDP: checks that these options train and keep replicas equal
    runs.append(
        [
            *FAST,
            out,
            "strategy=FULL_SHARD",
            "train.precision=bf16",
            "train.activation_checkpointing=true",
            "output.study=bf16-ac-fsdp1",
        ]
    )
    runs.append(
        [
            *FAST,
            out,
            "strategy=SHARD_GRAD_OP",
            "fsdp.version=2",
            "train.precision=bf16",
            "train.activation_checkpointing=true",
            "output.study=bf16-ac-fsdp2",
        ]
    )
    runs.append(
        [
            *FAST,
            out,
            "strategy=DDP",
            "train.precision=bf16",
            "train.activation_checkpointing=true",
            "output.study=bf16-ac-ddp",
        ]
    )
    return runs


# in the session's launch of 2 ranks and in its launch of 4 (tests/shared_launch.py)
shared_launch.register("test_trainer_equivalence", "two_rank_runs", 2, _two_rank_runs, order=0)


@pytest.fixture(scope="module")
def two_rank_runs(shared_launches):
    share = shared_launches.share("test_trainer_equivalence", "two_rank_runs")
    return by_study(load_runs(share.folder / "runs"))


def test_every_run_ok_and_replicas_agree(two_rank_runs):
    assert len(two_rank_runs) == 25
    for study, records in two_rank_runs.items():
        end = records[-1]
        assert end["event"] == "end" and end["status"] == "ok", (study, end)
        assert end["replicas_agree"] is True, study
        assert records[0]["world"]["world_size"] == 2
        assert end["steps_done"] == 4 and end["timed_steps"] == 3
        assert end["images_per_s"]["mean"] > 0 and end["memory"]["peak_rss_gib"]["max"] > 0


@pytest.mark.parametrize(
    "study",
    [
        "fsdp1-NO_SHARD",
        "fsdp1-FULL_SHARD",
        "fsdp1-SHARD_GRAD_OP",
        "fsdp1-HYBRID_1GPU",
        "fsdp1-HYBRID_2GPU",
        "fsdp2-NO_SHARD",
        "fsdp2-FULL_SHARD",
        "fsdp2-SHARD_GRAD_OP",
        "fsdp1-orig-params",
    ],
)
def test_fsdp_modes_equal_ddp_on_two_ranks(two_rank_runs, study):
    assert_same_losses(losses(two_rank_runs["ddp"]), losses(two_rank_runs[study]), study)


def test_prefetch_and_limit_all_gathers_grid_equals_ddp(two_rank_runs):
    reference = losses(two_rank_runs["ddp"])
    grid = [s for s in two_rank_runs if s.startswith("grid-")]
    assert len(grid) == 12
    for study in grid:
        assert_same_losses(reference, losses(two_rank_runs[study]), study)
        options = two_rank_runs[study][0]["strategy"]["options"]
        _, _, prefetch, limit = study.split("-")
        assert options["backward_prefetch"] == prefetch and str(options["limit_all_gathers"]).lower() == limit


def test_the_run_records_what_ran(two_rank_runs):
    hybrid1 = two_rank_runs["fsdp1-HYBRID_1GPU"][0]["strategy"]
    # asked for FSDP1, ran FSDP2, and says why
    assert hybrid1["implementation"] == "fsdp2" and hybrid1["options"]["fsdp_version"] == 2
    assert any("never synchronises" in note for note in hybrid1["notes"])
    assert (hybrid1["shard_group_size"], hybrid1["replicate_group_size"]) == (1, 2)
    full = two_rank_runs["fsdp1-FULL_SHARD"][0]
    assert full["strategy"]["implementation"] == "fsdp1" and full["strategy"]["shard_group_size"] == 2
    assert full["model"]["params"] == 206376 and full["model"]["flops_per_image"] > 0
    assert full["config"]["fsdp"]["backward_prefetch"] == "pre"
    bf16 = two_rank_runs["bf16-ac-fsdp1"][0]["strategy"]["options"]
    assert bf16["precision"] == "bf16" and bf16["activation_checkpointing"] is True


def _four_rank_runs(tmp) -> list:
    out = f"output.dir={tmp / 'runs'}"
    runs = [
        [*FAST, out, "strategy=DDP", "output.study=ddp"],
        [*FAST, out, "strategy=HYBRID_1GPU", "output.study=hybrid1"],
        [*FAST, out, "strategy=HYBRID_2GPU", "output.study=hybrid2"],
        [*FAST, out, "strategy=HYBRID_2GPU", "fsdp.version=2", "output.study=hybrid2-fsdp2"],
        [*FAST, out, "strategy=HYBRID_4GPU", "output.study=hybrid4"],
        # FSDP1 as it would build HYBRID_1GPU: the replica check must catch it
        ["@broken_hybrid1", *FAST, out, "strategy=HYBRID_1GPU", "output.study=broken-hybrid1"],
    ]
    for prefetch, limit in itertools.product(("none", "pre", "post"), ("true", "false")):
        runs.append(
            [
                *FAST,
                out,
                "strategy=HYBRID_2GPU",
                f"fsdp.backward_prefetch={prefetch}",
                f"fsdp.limit_all_gathers={limit}",
                f"output.study=grid-HYBRID_2GPU-{prefetch}-{limit}",
            ]
        )
    return runs


shared_launch.register("test_trainer_equivalence", "four_rank_runs", 4, _four_rank_runs, order=0)


@pytest.fixture(scope="module")
def four_rank_runs(shared_launches):
    share = shared_launches.share("test_trainer_equivalence", "four_rank_runs")
    return by_study(load_runs(share.folder / "runs")), share


@pytest.mark.parametrize(
    "study",
    [
        "hybrid1",
        "hybrid2",
        "hybrid2-fsdp2",
        "hybrid4",
        "grid-HYBRID_2GPU-none-true",
        "grid-HYBRID_2GPU-post-false",
        "grid-HYBRID_2GPU-pre-false",
    ],
)
def test_hybrid_modes_equal_ddp_on_four_ranks(four_rank_runs, study):
    runs, _ = four_rank_runs
    end = runs[study][-1]
    assert end["status"] == "ok" and end["replicas_agree"] is True, end
    assert_same_losses(losses(runs["ddp"]), losses(runs[study]), study)


def test_hybrid_group_layout(four_rank_runs):
    runs, _ = four_rank_runs
    layouts = {
        s: (runs[s][0]["strategy"]["shard_group_size"], runs[s][0]["strategy"]["replicate_group_size"])
        for s in ("hybrid1", "hybrid2", "hybrid4")
    }
    assert layouts == {"hybrid1": (1, 4), "hybrid2": (2, 2), "hybrid4": (4, 1)}


def test_replica_check_catches_fsdp1_hybrid_with_one_rank_shard_groups(four_rank_runs):
    runs, proc = four_rank_runs
    end = runs["broken-hybrid1"][-1]
    assert end["status"] == "diverged" and end["replicas_agree"] is False
    assert "replicas differ" in end["error"]
    # and its losses are not DDP's: the replicas trained apart
    assert losses(runs["broken-hybrid1"])[-1] != pytest.approx(losses(runs["ddp"])[-1], rel=1e-6)
    assert proc.codes[:6] == [0, 0, 0, 0, 0, 4]
