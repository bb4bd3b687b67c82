"""Test driver: several trainer runs in one launch (one process group), to keep the suite fast.

    torchrun --nproc_per_node=N tests/run_many.py RUNS.json
RUNS.json is a list of override lists. An entry may start with "@broken_hybrid1", which runs
HYBRID_1GPU the way FSDP1 alone would (1-rank shard groups) to show the replica check catches it,
or with "@finetune", which runs `vit-scale finetune` (its own checks first) instead of the benchmark,
or with "@driver", followed by the name of another test driver of tests/ (collective_bytes, plan_tensors) and its
arguments: that driver's run(arguments), in this launch's process group.
Rank 0 opens each run's output with a line "RUN_MANY <i>" (conftest.run_outputs splits on it).
"""

import importlib
import json
import os
import sys

from vit_scale.config import load_config
from vit_scale.distributed import FAMILIES, parse_strategy
from vit_scale.distributed.fsdp.strategy import FSDPStrategy
from vit_scale.errors import UserError
from vit_scale.launch.world import choose_device, detect_world, leave
from vit_scale.recipes import finetune, train
from vit_scale.run import session

RUN_MARK = "RUN_MANY"


class FSDP1WithOneRankShardGroups(FSDPStrategy):
    """HYBRID_1GPU as plain FSDP1 builds it: the trap the toolkit avoids."""

    def __init__(self, cfg, label, world):
        super().__init__(cfg, label, world)
        self.implementation_version, self.implementation = 1, "fsdp1"


def main() -> int:
    with open(sys.argv[1]) as f:
        runs = json.load(f)
    codes = []
    real_strategy_class = session.strategy_class
    for index, overrides in enumerate(runs):
        if int(os.environ.get("RANK", "0")) == 0:  # after what the run before printed (flushed)
            sys.stdout.flush()
            os.write(sys.stdout.fileno(), f"{RUN_MARK} {index}\n".encode())
        if overrides and overrides[0] == "@driver":
            codes.append(importlib.import_module(overrides[1]).run(overrides[2:]))
            continue
        broken = overrides and overrides[0] == "@broken_hybrid1"
        finetuning = overrides and overrides[0] == "@finetune"
        if broken:
            session.strategy_class = lambda family: FSDP1WithOneRankShardGroups
        if broken or finetuning:
            overrides = overrides[1:]
        cfg = load_config(None, overrides)
        world = choose_device(detect_world(cfg.system.launcher, cfg.system.ranks_per_node), cfg.system.device)
        label = parse_strategy(cfg.strategy)
        family = real_strategy_class(label.family)
        try:  # as vit_scale.recipes.train.main (and finetune.main) do before any run
            family.check(cfg, label, world)
            extra = finetune.check_inputs_of_strategy(cfg, world, FAMILIES[label.family]) if finetuning else ()
        except UserError as exc:
            print(f"REFUSED {cfg.strategy} {cfg.train.precision}: {exc}", flush=True)
            codes.append(exc.exit_code)
        else:
            if finetuning:
                codes.append(finetune.FinetuneRun(cfg, world, *extra).execute(keep_process_group=True))
            else:
                codes.append(train.execute(cfg, world, keep_process_group=True))
        session.strategy_class = real_strategy_class
    sys.stdout.flush()
    # one write() per rank: both ranks share the pipe, and print's separate pieces interleaved
    # ("EXIT CODESEXIT CODES  [0, ...") in one CI run
    os.write(sys.stdout.fileno(), f"EXIT CODES {codes}\n".encode())
    import torch.distributed as dist

    # leave the way a single run does: a process group left to interpreter shutdown can abort
    # there ("terminate called without an active exception") once DeepSpeed has wrapped it
    if dist.is_initialized():
        dist.destroy_process_group()
    leave(0)  # as vit_scale.recipes.train.main does: interpreter shutdown can abort in gloo's threads


if __name__ == "__main__":
    sys.exit(main())
