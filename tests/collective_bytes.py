"""Test driver: every collective a training step issues, with its size and its group, next to what
the planner predicts for the same run.

    torchrun --nproc_per_node=4 tests/collective_bytes.py OUT.json RANKS_PER_NODE LABEL[:key=value,...] ...
or as an entry of tests/run_many.py: ["@driver", "collective_bytes", OUT.json, RANKS_PER_NODE, LABEL, ...].

Each case builds vit_micro with the trainer's own strategy class (as tests/plan_tensors.py does) on
RANKS_PER_NODE ranks per emulated node, runs WARM steps unobserved, then COUNTED steps under
`CollectiveLog`. The warm steps are what a run's warm-up hides: DDP broadcasts its rebuilt bucket
order in the second step (Reducer::sync_bucket_indices), DeepSpeed ZeRO-3 records its module trace
in the first and checks it across ranks (broadcasts) at the start of the second
(partitioned_param_coordinator.py: reset_step). A `@key=value` in a case goes into the DeepSpeed
config the strategy generated (zero_optimization), for options the trainer leaves at their
defaults; the planner is told the same. Rank 0 writes, per case, every rank's log of every counted
step and the planner's `communication.predict` and `per_unit` for the Scenario the trainer's config
describes (`planning.from_config`).
"""

import json
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode

from vit_scale.config import load_config
from vit_scale.distributed import parse_strategy, parts, strategy_class
from vit_scale.distributed.base import ModelFactory
from vit_scale.distributed.deepspeed import cost as zero_cost
from vit_scale.launch.world import choose_device, detect_world, init_distributed, leave
from vit_scale.models import count_params, get_spec
from vit_scale.planning import communication, from_config, layout
from vit_scale.recipes.synthetic import SyntheticBatches

FAST = ["model=vit_micro", "train.batch_size=2", "train.precision=bf16", "train.steps=3", "train.warmup_steps=1"]
WARM, COUNTED = 2, 2

c10d = torch.ops.c10d
# c10d op: (kind, the index of its process group argument, the index of its tensors whose bytes count):
# the tensors the planner's sizes are of: the all-reduce's and broadcast's tensors, the all-gather's
# output (what every rank ends up with: allgather_'s [[one tensor per rank]] too), the reduce-scatter's
# input (what is reduced). Lists, nested ones too, count the sum of their tensors.
KINDS = {
    c10d.allreduce_.default: ("all_reduce", 1, 0),
    c10d.allreduce_coalesced_.default: ("all_reduce", 1, 0),
    c10d.broadcast_.default: ("broadcast", 1, 0),
    c10d._allgather_base_.default: ("all_gather", 2, 0),
    c10d.allgather_.default: ("all_gather", 2, 0),
    c10d.allgather_into_tensor_coalesced_.default: ("all_gather", 2, 0),
    c10d.allgather_coalesced_.default: ("all_gather", 2, 0),
    c10d._reduce_scatter_base_.default: ("reduce_scatter", 2, 1),
    c10d.reduce_scatter_.default: ("reduce_scatter", 2, 1),
    c10d.reduce_scatter_tensor_coalesced_.default: ("reduce_scatter", 2, 1),
}


def _nbytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    return sum(_nbytes(a) for a in arg)


def tensors_element_size(arg) -> int:
    return arg.element_size() if isinstance(arg, torch.Tensor) else tensors_element_size(arg[0])


def _dtypes(arg) -> list:
    if isinstance(arg, torch.Tensor):
        return [str(arg.dtype).replace("torch.", "")]
    return sorted({d for a in arg for d in _dtypes(a)})


class CollectiveLog(TorchDispatchMode):
    """Every c10d collective issued while active, from any caller: the ops below torch.distributed's
    Python functions, which DDP's C++ reducer, FSDP and deepspeed.comm all reach through the
    dispatcher (ProcessGroup::allreduce and friends call c10d::allreduce_ etc.)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional", "_c10d_functional_autograd"):
            if func not in KINDS:  # counted nowhere: the test fails on it rather than miss bytes
                self.calls.append({"op": str(func), "kind": "unknown"})
            else:
                kind, pg_arg, tensor_arg = KINDS[func]
                group = ProcessGroup.unbox(args[pg_arg])
                tensors = args[tensor_arg]
                self.calls.append(
                    {
                        "op": str(func),
                        "kind": kind,
                        "bytes": _nbytes(tensors),
                        "numel": _nbytes(tensors) // tensors_element_size(tensors),
                        "dtype": _dtypes(tensors),
                        "ranks": dist.get_process_group_ranks(group),
                    }
                )
        return func(*args, **(kwargs or {}))


def counted_step(strategy, images, labels) -> list:
    """One training step under a CollectiveLog; a {"kind": "backward"} entry marks where the loss was
    taken (what comes before it, the forward issued)."""
    # every family takes its loss through parts.loss, so the mark goes there
    log, loss = CollectiveLog(), parts.loss

    def marked_loss(logits, target):
        log.calls.append({"kind": "backward"})
        return loss(logits, target)

    parts.loss = marked_loss
    try:
        with log:
            strategy.train_step(images, labels)
    finally:
        parts.loss = loss
    return log.calls


def run_case(case: str, world) -> dict:
    label, _, extra = case.partition(":")
    extra = [x for x in extra.split(",") if x]
    zero = {k[1:]: int(v) for k, v in (x.split("=") for x in extra if x.startswith("@"))}
    cfg = load_config(
        None,
        FAST
        + [f"strategy={label}", f"system.ranks_per_node={world.local_world_size}"]
        + [x for x in extra if not x.startswith("@")],
    )
    parsed = parse_strategy(cfg.strategy)
    strategy = strategy_class(parsed.family)(cfg, parsed, world)
    if zero:  # DeepSpeed options the trainer leaves at their defaults: into the config it generated
        strategy.ds_config["zero_optimization"].update(zero)
    spec = get_spec(cfg.model)
    strategy.setup(
        ModelFactory(
            spec, cfg.train.num_classes, cfg.train.seed, cfg.train.init, count_params(cfg.model, cfg.train.num_classes)
        )
    )
    batches = SyntheticBatches(
        cfg.train.batch_size, spec.img_size, cfg.train.num_classes, world.device, cfg.train.seed, world.rank, 1
    )
    images, labels = batches[0]
    for _ in range(WARM):
        strategy.train_step(images, labels)
    steps = [counted_step(strategy, images, labels) for _ in range(COUNTED)]
    sc = from_config(cfg, nodes=world.nodes, gpus_per_node=world.local_world_size, device_memory_gib=None)
    lay = layout(sc)
    # the planner assumes DeepSpeed's default reuse distance; a case that sets another tells it so
    default_reuse = zero_cost.DS_MAX_REUSE_DISTANCE
    zero_cost.DS_MAX_REUSE_DISTANCE = zero.get("stage3_max_reuse_distance", default_reuse)
    try:
        predicted, per_unit = communication.predict(sc, lay), communication.per_unit(sc, lay)
    finally:
        zero_cost.DS_MAX_REUSE_DISTANCE = default_reuse
    ranks = [None] * world.world_size
    dist.all_gather_object(ranks, steps)
    return {
        "case": case,
        "ranks": ranks,
        "nodes": world.nodes,
        "ranks_per_node": world.local_world_size,
        "predicted": predicted,
        "per_unit": per_unit,
    }


def run(argv: list) -> int:
    """OUT.json RANKS_PER_NODE CASES...: in the launch's process group, started here unless a run before made
    it (tests/run_many.py's @driver entries)."""
    out, ranks_per_node, cases = argv[0], int(argv[1]), argv[2:]
    cfg = load_config(None, FAST)
    world = choose_device(detect_world(cfg.system.launcher, ranks_per_node), "cpu")
    if not dist.is_initialized():
        init_distributed(world, cfg.system.collective_timeout_s)
    results = [run_case(case, world) for case in cases]
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    return 0


def main() -> int:
    code = run(sys.argv[1:])
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    leave(main())  # as vit_scale.recipes.train.main does: interpreter shutdown can abort in gloo's threads
