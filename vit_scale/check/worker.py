"""The rank side of `vit-scale check`: started on every rank by the study's launchers
(`python -m vit_scale.check.worker system.launcher=KIND spec=PATH`).

Order: the meter first, on rank 0 alone in a process group of its own (the other ranks wait at
the world's rendezvous meanwhile), the Block's GEMMs timed on rank 0 alone (check.gemms), then the
world's process group: environment, kernels, the collectives, the strategy labels. Rank 0
rewrites the facts file (spec's `result`) after each part, atomically, so that a launch that dies
half-way still leaves what it found, and names the label it is running (`in_progress`) so the
orchestrator can blame the right one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

WORLD_TIMEOUT_S = 1800  # the other ranks wait this long at the rendezvous while rank 0 meters


class Facts:
    """What rank 0 found so far, written after every change (other ranks write nothing)."""

    def __init__(self, path: str, writes: bool):
        self.path, self.writes = path, writes
        self.data: dict = {"parts_done": [], "in_progress": None, "strategies": []}

    def set(self, **values) -> None:
        self.data.update(values)
        self.save()

    def done(self, part: str) -> None:
        self.data["parts_done"].append(part)
        self.save()

    def save(self) -> None:
        if not self.writes:
            return
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:600]


def parse(argv: list) -> dict:
    args = {}
    for item in argv:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"vit_scale.check.worker: expected KEY=VALUE, got {item!r}")
        args[key] = value
    return args


def main(argv=None) -> int:
    from vit_scale.errors import UserError
    from vit_scale.launch.world import choose_device, detect_world, leave

    args = parse(sys.argv[1:] if argv is None else argv)
    with open(args["spec"]) as f:
        spec = json.load(f)
    try:
        world = choose_device(detect_world(args.get("system.launcher", "auto")), spec.get("device", "auto"))
    except UserError as exc:  # e.g. more ranks on a node than GPUs it shows
        from vit_scale.run.session import launch_rank_guess

        if launch_rank_guess() == 0:
            Facts(spec["result"], True).set(fatal=str(exc))
        leave(1)
    facts = Facts(spec["result"], world.rank == 0)
    facts.set(
        world={
            "world_size": world.world_size,
            "nodes": world.nodes,
            "ranks_per_node": world.local_world_size,
            "backend": world.backend,
            "device_type": world.device_type,
            "launcher": world.launcher,
            "gloo_transport": os.environ.get("GLOO_DEVICE_TRANSPORT", "tcp").lower(),
        }
    )
    parts = spec["parts"]
    same_network_as_the_world(world)
    log_transport(world, spec.get("nccl_log"))
    if "meter" in parts and world.rank == 0:
        meter(world, spec, facts)
    if "compute" in parts and world.rank == 0:
        compute(world, spec, facts)
    join_world(world)
    facts.data["world"]["collective_timeout_s"] = collective_timeout_s(world)
    facts.save()
    if "environment" in parts:
        environment(world, spec, facts)
    if "nodes" in parts:
        nodes(world, spec, facts)
    if "interconnect" in parts:
        interconnect(world, spec, facts)
    if "strategies" in parts:
        with new_groups_bounded():
            strategies(world, spec, facts)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    leave(0)


def same_network_as_the_world(world) -> None:
    """The network choice the world's process group will make (init_distributed sets NCCL_NET for a
    run over several nodes where the env script asks for it), made before the meter's one-rank
    group, so that NCCL names one network in the log, the one the check reports."""
    from vit_scale.launch.world import network_requirement

    os.environ.update(network_requirement(world))


def log_transport(world, log_path) -> None:
    """NCCL's INFO lines, to a file per process, on the few ranks that prove the transport: set
    before NCCL's first use here (the meter's group on rank 0, else the world's), which is when NCCL
    reads them. Every rank logging would create a file per rank at once in one directory of a
    parallel filesystem, written a line at a time inside communicator setup."""
    from vit_scale.check.environment import logs_transport, nccl_logging

    if log_path and logs_transport(world.rank, world.local_world_size):
        os.environ.update(nccl_logging(log_path))


def join_world(world) -> None:
    """The world's process group: its rendezvous may wait WORLD_TIMEOUT_S (rank 0 meters first),
    its collectives afterwards COLLECTIVE_TIMEOUT_S, so that a rank stuck behind a broken peer
    ends the launch in minutes. The trainer's runs reuse this group (their
    system.collective_timeout_s applies only to a group they create themselves)."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    from vit_scale.check.collectives import COLLECTIVE_TIMEOUT_S
    from vit_scale.launch.world import init_distributed

    init_distributed(world, WORLD_TIMEOUT_S)
    c10d._set_pg_timeout(timedelta(seconds=COLLECTIVE_TIMEOUT_S))  # gloo and NCCL: the default group's


@contextlib.contextmanager
def new_groups_bounded():
    """While the labels run, every group made without a timeout of its own gets
    COLLECTIVE_TIMEOUT_S, not torch's 10 or 30 minutes: the labels' subgroups (FSDP's
    init_device_mesh, DeepSpeed's deepspeed.comm.new_group, ColossalAI's ProcessGroupMesh and
    ProcessGroupManager) all call torch's new_group or split_group without one, and those take
    the default from c10d's module globals when called (_get_default_timeout), so one hung label
    ends in minutes, not in 10 of the --time-limit. The world's group and the node groups pass
    their own. Those globals are torch's private ones and hold for the whole process: torch's own
    values are put back after the labels, so that nothing else this process runs (the meter's
    trainer run) has its groups changed."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    from vit_scale.check.collectives import COLLECTIVE_TIMEOUT_S

    torchs = c10d.default_pg_timeout, c10d.default_pg_nccl_timeout
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    try:
        yield
    finally:
        c10d.default_pg_timeout, c10d.default_pg_nccl_timeout = torchs


def group_timeout_s(world, group=None) -> float | None:
    """A group's collective timeout as its backend holds it (the world's by default; None where
    torch hides it)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    try:
        device = torch.device("cpu" if world.device_type == "cpu" else "cuda")
        return (group or c10d._get_default_group())._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def collective_timeout_s(world) -> float | None:
    """The world group's collective timeout as its backend holds it (None where torch hides it)."""
    return group_timeout_s(world)


def live_groups() -> list:
    """The process groups this rank is in, the world's included, as torch's registry holds them."""
    import torch.distributed.distributed_c10d as c10d

    return list(c10d._world.pg_map)


def end_groups_since(world, before: list) -> float | None:
    """Destroy the groups made since `before` (a label's meshes and subgroups, the node groups), so
    that their buffers, proxy threads and network endpoints do not pile up over the labels and a
    late label's failure is not its predecessors' doing; the libraries' caches of them are
    forgotten so that a later label makes its own. The longest collective timeout among them and
    the world's: what bounded the label's collectives."""
    import torch.distributed as dist

    made = [group for group in live_groups() if group not in before]
    held = [t for t in [group_timeout_s(world)] + [group_timeout_s(world, g) for g in made] if t is not None]
    if made:
        dist.barrier()  # no rank still in a collective of a group another rank destroys
        for group in made:
            dist.destroy_process_group(group)
        forget_groups(made)
    return max(held) if held else None


def forget_groups(groups: list) -> None:
    """Drop references the libraries keep to destroyed groups in module globals: DeepSpeed's
    deepspeed.utils.groups caches its world and parallel groups and makes them again only when its
    cache is empty."""
    module = sys.modules.get("deepspeed.utils.groups")
    if module is None:
        return
    gone = {id(group) for group in groups}
    for name, value in list(vars(module).items()):
        if not name.startswith("_") or name.startswith("__"):
            continue
        if id(value) in gone:
            setattr(module, name, None)
        elif isinstance(value, dict):
            for key in [k for k, v in value.items() if id(v) in gone]:
                del value[key]


def meter(world, spec: dict, facts: Facts) -> None:
    from vit_scale.check.meter import MeterSettings, measure_alone, settings_for

    settings = MeterSettings(**spec["meter"]) if spec.get("meter") else settings_for(world.device_type, spec["quick"])
    # a trainer's run that fails leaves the process (RunSession.execute ends in os._exit): this
    # names the meter, so that the orchestrator says so and starts the rest without it
    facts.set(in_progress={"part": "meter", "settings": vars(settings)})
    try:
        found = measure_alone(world, settings, spec["records"])
    except Exception as exc:
        traceback.print_exc()
        found = {"error": short_error(exc), "settings": vars(settings)}
    facts.set(meter=found, in_progress=None)
    facts.done("meter")


def compute(world, spec: dict, facts: Facts) -> None:
    """The Block's GEMMs timed on rank 0's device, alone (the other ranks wait at the world's rendezvous)."""
    from vit_scale.check.gemms import measure

    try:
        found = measure(world, spec)
    except Exception as exc:
        traceback.print_exc()
        found = {"error": short_error(exc), "entries": []}
    facts.set(compute=found)
    facts.done("compute")


def environment(world, spec: dict, facts: Facts) -> None:
    import torch.distributed as dist

    from vit_scale.check.environment import host_facts, kernel_facts, rank_facts
    from vit_scale.distributed.capabilities import refusal

    runnable = list(
        dict.fromkeys(
            label for label, precision in spec["labels"] if refusal(label, precision, world.device_type) is None
        )
    )
    ranks = [None] * world.world_size
    dist.all_gather_object(ranks, rank_facts(world))
    # kernels are looked for on each node (a node-local $TORCH_EXTENSIONS_DIR differs between nodes)
    mine = None
    if world.local_rank == 0:
        try:
            mine = {"node": world.node_name, "kernels": kernel_facts(runnable, world.device_type)}
        except Exception as exc:
            mine = {"node": world.node_name, "error": short_error(exc)}
    by_node = [None] * world.world_size
    dist.all_gather_object(by_node, mine)
    if world.rank == 0:
        facts.set(ranks=ranks, kernels=[k for k in by_node if k], **host_facts(world))
    facts.done("environment")


def nodes(world, spec: dict, facts: Facts) -> None:
    """Every node's compute and link at once (check.nodes); rank 0 keeps the figures."""
    from vit_scale.check.nodes import measure
    from vit_scale.errors import UserError

    try:
        found = measure(world, spec)
    except UserError as exc:  # e.g. uneven placement: the same one line on every rank
        found = {"error": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        found = {"error": short_error(exc)}
    if world.rank == 0:
        facts.set(nodes=found)
    facts.done("nodes")


def interconnect(world, spec: dict, facts: Facts) -> None:
    from vit_scale.check.collectives import FULL, QUICK, measure_all, sizes_for
    from vit_scale.errors import UserError

    sizes = sizes_for(spec["model"], spec["precisions"][0], spec["quick"])
    before = live_groups()
    try:
        settings = QUICK if spec["quick"] else FULL
        measured, skipped = measure_all(world, sizes, settings, quick=spec["quick"])
        found = {
            "model": spec["model"],
            "measurements": measured,
            "skipped": skipped,
            "error": None,
            "budget_s": settings.sweep_budget_s,
        }
    except UserError as exc:  # e.g. uneven placement: the same one line on every rank
        found = {"model": spec["model"], "measurements": [], "error": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        found = {"model": spec["model"], "measurements": [], "error": short_error(exc)}
    end_groups_since(world, before)  # the node groups
    facts.set(interconnect=found)
    facts.done("interconnect")


def strategies(world, spec: dict, facts: Facts) -> None:
    from vit_scale.check.strategies import run_label

    for label, precision in spec["labels"]:
        facts.set(in_progress={"label": label, "precision": precision})
        before = live_groups()
        row = run_label(label, precision, world, spec, spec.get("attempt", 1))
        row["collective_timeout_s"] = end_groups_since(world, before)
        facts.data["strategies"].append(row)
        facts.set(in_progress=None)
        release_memory(world)
    facts.done("strategies")


def release_memory(world) -> None:
    """A label's model, optimizer and cached device blocks, freed before the next label, so that a
    label does not fail for the memory its predecessor left behind."""
    import gc

    gc.collect()
    if world.device_type != "cpu":
        import torch

        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
