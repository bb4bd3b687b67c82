"""train.init=meta (what train.init=auto does above 1.5B parameters): the model is built on the meta
device and initialised where it lands, and it must still be one model: the same on every replica,
the same in every launch with the same seed, and drawn from the distributions timm's own
initialisation (train.init=device) uses. Real torchrun launches over gloo, vit_micro, fp32 (the first: the
session's launch of 4 ranks, tests/shared_launch.py)."""

import pytest

import shared_launch
from conftest import FAST, REL_TOL, assert_same_losses, by_study, load_runs, losses, run_many

META = [*FAST, "train.init=meta"]
FSDP_MODES = ("NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_2GPU")


# ---------------------------------------------------------------- the distributions


def _device_and_meta_built(model_name: str):
    """The same model built as train.init=device builds it, and built on the meta device then
    materialised on the CPU module by module as the strategies do."""
    from vit_scale.distributed.base import ModelFactory, module_names
    from vit_scale.models import count_params, get_spec

    factory = ModelFactory(get_spec(model_name), 1000, 0, "device", count_params(model_name))
    device_built = dict(factory.on_device("cpu").named_parameters())
    model = factory.on_meta()
    names = module_names(model)
    model.to_empty(device="cpu")
    for module, name in names.items():
        factory.init_module(module, name)
    return device_built, dict(model.named_parameters())


def test_meta_init_draws_every_parameter_from_timms_distribution():
    import torch

    device_built, meta_built = _device_and_meta_built("vit_tiny")
    assert meta_built.keys() == device_built.keys()
    for name, expected in device_built.items():
        got, expected = meta_built[name].detach(), expected.detach()
        assert got.shape == expected.shape and got.dtype == expected.dtype, name
        if expected.std() == 0:  # LayerNorm ones, zero biases
            assert torch.equal(got, expected), name
            continue
        n = expected.numel()
        # the smallest drawn tensors (cls_token, the patch embedding's bias) hold 192 values, whose
        # std and quantiles land within 8% of the device-built ones here
        assert abs(got.std() / expected.std() - 1) < 0.15, (name, float(got.std()), float(expected.std()))
        assert abs(got.mean() - expected.mean()) < 6 * expected.std() / n**0.5, name
        # the distribution's shape: the median and 95th percentile of |value| are 0.87 and 1.65 std
        # for a uniform, 0.67 and 1.96 for a normal; a normal in place of the patch embedding's
        # uniform is 22% and 19% off
        for q, a, b in zip((0.5, 0.95), _abs_quantiles(got), _abs_quantiles(expected), strict=True):
            assert abs(a / b - 1) < 0.15, (name, q, a / b)


def _abs_quantiles(t) -> tuple:
    """The median and 95th percentile of |t|, from its first 20000 values (the draws are
    independent, so any of them are a sample; sorting all of every tensor took seconds)."""
    ordered = t.abs().flatten()[:20000].sort().values
    return tuple(float(ordered[int(q * (len(ordered) - 1))]) for q in (0.5, 0.95))


def test_meta_init_does_not_depend_on_the_order_modules_are_materialised_in():
    import torch

    from vit_scale.distributed.base import ModelFactory, module_names
    from vit_scale.models import count_params, get_spec

    factory = ModelFactory(get_spec("vit_micro"), 10, 7, "meta", count_params("vit_micro", 10))
    built = []
    for order in (list, lambda items: list(reversed(items))):
        model = factory.on_meta()
        names = module_names(model)
        model.to_empty(device="cpu")
        for module, name in order(list(names.items())):
            factory.init_module(module, name)
        built.append(model.state_dict())
    assert all(torch.equal(built[0][k], built[1][k]) for k in built[0])


def test_fsdp2_keeps_offloaded_shards_on_the_host():
    """FSDP2 refuses offloaded parameters that are not on the CPU at its first forward, so a meta
    model is materialised there. A GPU world is described, not used (nothing here has one)."""
    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.fsdp.strategy import FSDPStrategy
    from vit_scale.launch.world import World

    world = World("torchrun", 0, 2, 0, 2, 1, "node", "127.0.0.1", 29500, device_type="cuda", device_index=1)
    devices = {}
    for offload in ("true", "false"):
        cfg = load_config(None, [*META, "strategy=FULL_SHARD", "fsdp.version=2", f"fsdp.cpu_offload={offload}"])
        devices[offload] = str(FSDPStrategy(cfg, parse_strategy(cfg.strategy), world).fsdp2_shard_device())
    assert devices == {"true": "cpu", "false": "cuda:1"}


# ---------------------------------------------------------------- every FSDP mode on 4 ranks


def _meta_runs(out: str, which=None) -> list:
    runs = []
    for version in (1, 2):
        for mode in FSDP_MODES:
            runs.append(
                [*META, out, f"strategy={mode}", f"fsdp.version={version}", f"output.study=fsdp{version}-{mode}"]
            )
    runs += [
        [*META, out, "strategy=HYBRID_1GPU", "output.study=fsdp2-HYBRID_1GPU"],  # FSDP2 whatever the version
        [
            *META,
            out,
            "strategy=FULL_SHARD",
            "fsdp.version=2",
            "fsdp.cpu_offload=true",
            "output.study=fsdp2-FULL_SHARD-offload",
        ],
        [
            *META,
            out,
            "strategy=FULL_SHARD",
            "fsdp.version=2",
            "train.activation_checkpointing=true",
            "output.study=fsdp2-FULL_SHARD-ac",
        ],
    ]
    if which is not None:
        runs = [run for run in runs if run[-1].split("=", 1)[1] in which]
    return runs


# every layout starts from the same model (test below), so two stand for all: the FSDP1 one
# materialised unit by unit, the FSDP2 one shard by shard over a 2-D mesh
REPEATED = ("fsdp1-FULL_SHARD", "fsdp2-HYBRID_2GPU")


def _first_launch(folder) -> list:
    out = f"output.dir={folder / 'runs'}"
    # weights from timm's device init: the meta runs must not have trained this model
    return _meta_runs(out) + [[*FAST, out, "strategy=FULL_SHARD", "output.study=device-init"]]


# the first launch is the session's launch of 4 ranks (tests/shared_launch.py)
shared_launch.register("test_meta_init", "meta_runs", 4, _first_launch, order=0)


@pytest.fixture(scope="module")
def meta_runs(shared_launches, tmp_path_factory):
    first, second = shared_launches.share("test_meta_init", "meta_runs").folder, tmp_path_factory.mktemp("second")
    # another launch, the same seed: fresh processes, whose global RNG torch seeds at random
    run_many(4, _meta_runs(f"output.dir={second / 'runs'}", which=REPEATED), second)
    return by_study(load_runs(first / "runs")), by_study(load_runs(second / "runs"))


def test_every_fsdp_mode_with_meta_init_ends_ok_with_replicas_agreeing(meta_runs):
    runs, _ = meta_runs
    expected = {f"fsdp{v}-{m}" for v in (1, 2) for m in FSDP_MODES} | {
        "fsdp2-HYBRID_1GPU",
        "fsdp2-FULL_SHARD-offload",
        "fsdp2-FULL_SHARD-ac",
        "device-init",
    }
    assert expected <= runs.keys()
    for study, records in runs.items():
        end = records[-1]
        assert end["event"] == "end" and end["status"] == "ok", (study, end)
        assert end["replicas_agree"] is True, study
        assert records[0]["world"]["world_size"] == 4
        assert (records[0]["config"]["train"]["init"] == "meta") is (study != "device-init"), study
    hybrid = runs["fsdp1-HYBRID_2GPU"][0]["strategy"]
    assert (hybrid["implementation"], hybrid["shard_group_size"], hybrid["replicate_group_size"]) == ("fsdp1", 2, 2)


def test_every_layout_starts_from_the_same_model(meta_runs):
    """Each parameter's values are keyed by the seed and its name, not by the rank or the shard:
    FSDP1 and FSDP2 in every sharding train the same model."""
    runs, _ = meta_runs
    reference = losses(runs["fsdp1-FULL_SHARD"])
    for study in runs:
        if study != "device-init":
            assert_same_losses(reference, losses(runs[study]), study)
    first_device = losses(runs["device-init"])[0]
    assert abs(first_device - reference[0]) > 100 * REL_TOL * abs(reference[0]), "the meta runs built on the device"


def test_a_second_launch_with_the_same_seed_gives_the_same_losses(meta_runs):
    runs, again = meta_runs
    assert again.keys() == set(REPEATED)
    for study in REPEATED:
        assert_same_losses(losses(runs[study]), losses(again[study]), f"{study}, second launch")
