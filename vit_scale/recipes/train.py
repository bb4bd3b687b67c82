"""The benchmark recipe: one model under one strategy on the launched ranks, synthetic data.

    python -m vit_scale train [--config FILE] [key=value ...]
    vit-scale train [--config FILE] [key=value ...]

Rank 0 writes the run record (docs/run_record.md) and prints progress; every rank exits with the
run's status code (0 ok, 1 failed, 2 bad input, 3 oom, 4 diverged, 5 timeout, 6 skipped). What
every run does (process group, record, signals, exit) is the session's (vit_scale.run.session);
this file holds the loop and its end-of-run figures.
"""

from __future__ import annotations

import sys

from vit_scale.config import BENCHMARK_SECTIONS, Config, parse_command_line
from vit_scale.launch.world import World
from vit_scale.record.end import EndRecord
from vit_scale.run.meter import EventTimedMeter
from vit_scale.run.session import RunSession
from vit_scale.run.session import main as session_main


def _parse_args(argv):
    return parse_command_line(
        argv,
        "vit-scale train",
        __doc__.split("\n\n")[0],
        "configs/",
        "model=vit_micro strategy=HYBRID_2GPU train.batch_size=8 train.steps=30",
        sections=BENCHMARK_SECTIONS,
    )


class Run(RunSession):
    """The benchmark: synthetic batches, fixed steps, every step timed after the warm-up."""

    def __init__(self, cfg: Config, world: World):
        super().__init__(cfg, world)
        self.compile = None  # train.compile: what compiling cost (EventTimedMeter.compile_facts)
        self.profile = None  # profile.enabled: the traces written after the timed window

    def train(self) -> None:
        from vit_scale.distributed.base import ModelFactory
        from vit_scale.models import count_params, get_spec
        from vit_scale.recipes.synthetic import SyntheticBatches

        cfg, world = self.cfg, self.world
        spec = get_spec(cfg.model)
        factory = ModelFactory(
            spec, cfg.train.num_classes, cfg.train.seed, cfg.train.init, count_params(cfg.model, cfg.train.num_classes)
        )
        self.strategy.setup(factory)
        data = SyntheticBatches(
            cfg.train.batch_size,
            spec.img_size,
            cfg.train.num_classes,
            world.device,
            cfg.train.seed,
            world.rank,
            cfg.train.synthetic_batches,
        )
        global_batch = cfg.train.batch_size * world.world_size
        meter = self.new_meter(EventTimedMeter, global_batch, cfg.train.steps, cfg.train.warmup_steps)
        for step in range(1, cfg.train.steps + 1):
            images, labels = data[step - 1]
            meter.start()
            meter.stop(step, self.strategy.train_step(images, labels))
        meter.window_s()  # the timed window closes: its figures are taken here
        self.compile = meter.compile_facts()
        self.probe_nodes()  # outside the window: each node's health for the end record
        if cfg.profile.enabled:
            from vit_scale.run.profiling import record_traces

            self.profile = record_traces(
                self, lambda k: self.strategy.train_step(*data[k]), cfg.profile.steps, cfg.profile.ranks
            )

    def finish(self) -> EndRecord:
        """End-of-run collectives (every rank): replica check and memory; rank 0 builds the summary."""
        import torch.distributed as dist

        from vit_scale.run.replicas import replica_checksums, replicas_agree

        checksums = replica_checksums(self.strategy, self.world.device)
        figures = self.meter.result()
        peaks = [None] * self.world.world_size
        dist.all_gather_object(peaks, figures.memory)
        agree = replicas_agree(checksums)
        status, error = "ok", None
        if not agree:
            status, error = (
                "diverged",
                (
                    f"replicas differ at the end: parameter checksums "
                    f"{sorted({round(c[0], 6) for c in checksums})} across ranks"
                ),
            )
        elif figures.nonfinite_step is not None:
            status, error = "diverged", f"loss was not finite from step {figures.nonfinite_step}"
        return self.end_record(
            status,
            error,
            peaks=peaks,
            replicas_agree=agree,
            replica_checksums=checksums,
            extra={"compile": self.compile, "profile": self.profile},
        )

    def interrupted_end(self, status: str, error: str, failed_rank) -> EndRecord:
        # no TFLOP/s or MFU for a run stopped short: its window never closed
        return self.end_record(status, error, failed_rank, rates=False)

    def summary_lines(self, end: EndRecord) -> list[str]:
        c = end.get("compile")
        if not c:
            return super().summary_lines(end)
        return [
            *super().summary_lines(end),
            f"compiled: first step {c['first_step_s']:.1f} s (compilation included), {c['graphs']} graph(s), "
            + (
                "a recompile inside the timed window: lengthen train.warmup_steps"
                if c["recompiled_in_window"]
                else "none made inside the timed window"
            ),
        ]


def execute(cfg: Config, world: World, keep_process_group: bool = False) -> int:
    """Run one configuration. `keep_process_group` lets a caller run several in one launch."""
    return Run(cfg, world).execute(keep_process_group)


def main(argv=None) -> int:
    return session_main(Run, sys.argv[1:] if argv is None else argv, _parse_args)


if __name__ == "__main__":
    sys.exit(main())
