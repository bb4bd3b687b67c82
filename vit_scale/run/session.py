"""What every run does, whatever it trains: the run session.

A recipe (`vit_scale.recipes.train`, the benchmark on synthetic data; `vit_scale.recipes.finetune`, real data
with evaluation and checkpoints) subclasses RunSession for its loop (`train`) and its end record
after the loop (`finish`), and composes the rest from parts: a step meter (vit_scale.run.meter)
that owns its figures, the end record built from them in one place (vit_scale.run.ending), and a
signal policy passed in (vit_scale.run.stopping). The session owns the command line, the checks
before any process group, the process group, the run directory and start record, the planner's
verdict (`plan.skip_if_not_fits`), the end record for every status, the summary printed at the
end, the exit code and the exit itself (MPI included).

Exit codes: 0 ok, 1 failed, 2 bad input, 3 oom, 4 diverged, 5 timeout (a signal), 6 skipped,
and for a recipe that saves on a signal, 7: stopped after saving a checkpoint (requeue).
"""

from __future__ import annotations

import os
import sys
import time

from vit_scale.config import Config, load_config, to_yaml
from vit_scale.distributed import FAMILIES, parse_strategy, strategy_class
from vit_scale.distributed.kernels import use_venv_tools
from vit_scale.errors import UserError
from vit_scale.launch.signals import RunInterrupted
from vit_scale.launch.world import MPI_RANK_VARS, World, choose_device, detect_world, init_distributed, leave
from vit_scale.record.end import EndRecord
from vit_scale.record.reader import rank_errors
from vit_scale.record.versions import vit_scale_dir
from vit_scale.record.writer import EXIT_CODES, EXIT_REQUEUE, RunRecorder, make_run_id, run_directory, write_rank_error
from vit_scale.run import tracking
from vit_scale.run.ending import end_record, figure_lines, launched_at
from vit_scale.run.meter import StepMeter
from vit_scale.run.stopping import InterruptOnSignal
from vit_scale.text import plural


def say(world: World | None, message: str) -> None:
    if world is None or world.is_main:
        print(message, flush=True)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]


def classify(exc: BaseException) -> str:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower():
        return "oom"
    return "failed"


def exit_code(end: EndRecord) -> int:
    """A run stopped by a signal after saving a checkpoint asks to be requeued (7)."""
    if end.status == "timeout" and end.get("requeue"):
        return EXIT_REQUEUE
    return EXIT_CODES.get(end.status, 1)


def python_environments(facts: list) -> list[dict]:
    """Every (python prefix, vit_scale directory) the ranks ran from and how many ranks did, in rank order;
    `facts`: each rank's (node, sys.prefix, vit_scale directory)."""
    counts: dict = {}
    for _, prefix, package in facts:
        counts[(prefix, package)] = counts.get((prefix, package), 0) + 1
    return [{"python_prefix": p, "vit_scale_dir": d, "ranks": n} for (p, d), n in counts.items()]


def launch_rank_guess() -> int:
    """Before the launcher is decoded: which rank we probably are, so only one prints an error."""
    for key in ("RANK", "SLURM_PROCID", *MPI_RANK_VARS):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


class RunSession:
    """One run of one model under one strategy on the launched ranks; see the module doc. A recipe
    says `train` (the loop), `finish` (the end record after it) and, where it has keys of its own,
    `interrupted_end` and `summary_lines`."""

    command = "vit-scale"  # how the summary names the command

    def __init__(self, cfg: Config, world: World, signals: InterruptOnSignal | None = None):
        self.cfg, self.world = cfg, world
        self.label = parse_strategy(cfg.strategy)
        self.strategy = strategy_class(self.label.family)(cfg, self.label, world)
        self.signals = signals or InterruptOnSignal()
        self.recorder: RunRecorder | None = None
        self.run_dir = ""
        self.meter: StepMeter | None = None  # made by the loop (`new_meter`)
        self.model_info: dict = {}
        self.peak_tflops = None
        self.plan = None
        self.nodes_health: dict | None = None  # the end record's, once `probe_nodes` has run

    # ------------------------------------------------------------ what a recipe says

    def train(self) -> None:
        """The loop. Returns when it is done or the recipe decided to stop (every rank together)."""
        raise NotImplementedError

    def finish(self) -> EndRecord:
        """The end record after `train` returned, on every rank (end-of-run collectives allowed)."""
        raise NotImplementedError

    def interrupted_end(self, status: str, error: str, failed_rank) -> EndRecord:
        """The end record of a run that did not reach `finish`: no collectives any more."""
        return self.end_record(status, error, failed_rank)

    def summary_lines(self, end: EndRecord) -> list[str]:
        """The summary's head line and a recipe's own lines after it."""
        world = self.world
        return [
            f"{self.command}: {self.cfg.model} {self.cfg.strategy} on {plural(world.world_size, 'rank')} "
            f"({plural(world.nodes, 'node')}, {world.device_type}): {end.status.upper()}"
        ]

    # ------------------------------------------------------------ the parts a recipe calls

    def new_meter(self, kind: type[StepMeter], images_per_step: int, total_steps: int, untimed_steps: int):
        """The loop's meter (`kind`: StepMeter or EventTimedMeter); the session reads its figures at the end."""
        self.meter = kind(self.world, self.recorder, self.cfg.train, images_per_step, total_steps, untimed_steps)
        return self.meter

    def probe_nodes(self) -> None:
        """Every rank, a collective, once the meter's timed window is closed (never inside it): each
        node's health for the end record (vit_scale.run.health). The window's figures are taken
        already and nothing here changes them; a probe that fails is recorded, never fatal."""
        budget = self.cfg.train.health_probe_s
        if self.meter is None or not self.meter.closed or budget <= 0:
            return
        from vit_scale.run.health import nodes_health

        train = self.cfg.train
        self.nodes_health = nodes_health(self.world, self.cfg.model, train.batch_size, train.precision, budget)

    def end_record(self, status: str, error=None, failed_rank=None, **kwargs) -> EndRecord:
        """The end record from the meter's figures (vit_scale.run.ending.end_record takes the rest)."""
        if self.nodes_health is not None:
            kwargs["extra"] = {**(kwargs.get("extra") or {}), "nodes_health": self.nodes_health}
        return end_record(
            status,
            error,
            failed_rank,
            self.meter.result() if self.meter else None,
            device_type=self.world.device_type,
            world_size=self.world.world_size,
            flops_per_image=self.model_info.get("flops_per_image", 0),
            peak_tflops=self.peak_tflops,
            launched=launched_at(),
            **kwargs,
        )

    @property
    def step_times(self) -> list[float]:
        """The timed steps' durations, as the meter booked them (the check compares them)."""
        return self.meter.result().step_times if self.meter else []

    # ------------------------------------------------------------ the start

    def prepare(self) -> None:
        import torch.distributed as dist

        from vit_scale import models
        from vit_scale.run.memory import device_memory_gib
        from vit_scale.run.peaks import math_precision, peak_tflops
        from vit_scale.run.start import device_name, start_record

        cfg, world = self.cfg, self.world
        if not dist.is_initialized():
            init_distributed(world, cfg.system.collective_timeout_s)
        if world.device_type != "cpu":
            import torch

            # set for every run: several runs in one process must not inherit each other's choice
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.train.tf32

        def directory(run_id):
            return run_directory(cfg.output.dir, cfg.output.study, cfg.model, cfg.strategy, world.nodes, run_id)

        # rank 0 names the run; everyone needs the directory (failing ranks write there)
        shared = [None]
        if world.is_main:
            base = cfg.output.run_id or make_run_id()
            run_id, n = base, 1
            while os.path.exists(directory(run_id)):  # never write into an earlier run's directory
                n += 1
                run_id = f"{base}-{n}"
            shared = [run_id]
        # each rank's node, and where its Python and vit_scale come from (a node-local copy or the shared
        # file system: docs/jobs.md, "Start-up at scale")
        facts = [None] * world.world_size
        dist.all_gather_object(facts, (world.node_name, sys.prefix, vit_scale_dir()))
        dist.broadcast_object_list(shared, src=0)
        run_id = shared[0]
        hosts = list(dict.fromkeys(node for node, _, _ in facts))
        self.environments = python_environments(facts)
        self.run_dir = directory(run_id)
        if not world.is_main:
            return
        self.recorder = RunRecorder(self.run_dir)
        if cfg.tracking.backend != "none":
            self.recorder.listeners.append(tracking.Tracker(cfg, self.run_dir, run_id).write)
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(cfg))
        for name, text in self.strategy.artifacts().items():  # e.g. deepspeed.json
            with open(os.path.join(self.run_dir, name), "w") as f:
                f.write(text)
        self.model_info = models.describe(cfg.model, cfg.train.num_classes)
        device = device_name(world)
        arithmetic = math_precision(cfg.train.precision, cfg.train.tf32, world.device_type)
        peak = peak_tflops(device, arithmetic, cfg.system.peak_tflops)
        self.peak_tflops = peak[0]
        memory = device_memory_gib(world.device_type, world.device_index)
        self.recorder.start(
            start_record(
                cfg,
                world,
                self.strategy,
                run_id,
                hosts,
                self.model_info,
                device,
                memory,
                peak,
                self._plan(memory),
                self.environments,
            )
        )
        say(
            world,
            f"{self.command}: {cfg.model} ({self.model_info['params'] / 1e6:.1f}M params) "
            f"{cfg.strategy} on {plural(world.world_size, 'rank')}, {plural(world.nodes, 'node')}, "
            f"{world.device_type} [{world.launcher}] -> {self.run_dir}",
        )

    def _plan(self, device_memory_gib):
        try:
            from vit_scale.planning import predict_for_run
        except ImportError:
            return None
        try:
            self.plan = predict_for_run(self.cfg, self.world, device_memory_gib)
        except Exception as exc:
            say(self.world, f"{self.command}: warning: no memory plan: {one_line(exc)}")
            self.plan = None
        return self.plan

    def _skip_if_not_fits(self, keep_process_group: bool) -> int | None:
        """plan.skip_if_not_fits: a run the planner says cannot fit ends as `skipped` (exit 6) before
        any model is built. Rank 0 made the plan (in prepare); its verdict goes to every rank."""
        if not self.cfg.plan.skip_if_not_fits:
            return None
        import torch.distributed as dist

        verdict = [None]
        if self.world.is_main and self.plan and self.plan.get("fits") is False:
            verdict = [
                f"does not fit: predicted {self.plan['memory_gib']:.3g} GiB > {self.plan['device_memory_gib']:.3g} GiB"
            ]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is None:
            return None
        if self.recorder:
            self._write_end(EndRecord("skipped", verdict[0]))
            self.recorder.close()
        if not keep_process_group:
            dist.destroy_process_group()
        return EXIT_CODES["skipped"]

    # ------------------------------------------------------------ the end

    def interrupted(self, status: str, error: str, failed_rank=None) -> EndRecord:
        """End record for a run that did not reach its end-of-run collectives."""
        # a peer that failed first says why: its reason beats our "connection closed"
        for peer in rank_errors(self.run_dir):
            if status != "timeout" or peer.get("status") in ("oom", "failed"):
                status, error, failed_rank = peer["status"], f"rank {peer['rank']}: {peer['error']}", peer["rank"]
                break
        return self.interrupted_end(status, error, failed_rank)

    def _write_end(self, end: EndRecord) -> None:
        """Write the end record unless another thread wrote one first; the summary goes with it."""
        if self.recorder.end(end.payload()):
            self.print_summary(end)

    def print_summary(self, end: EndRecord) -> None:
        lines = self.summary_lines(end)
        if end.error:
            lines.insert(1, f"  error: {end.error}")
        lines += [*figure_lines(end), f"  record: {os.path.join(self.run_dir, 'metrics.jsonl')}"]
        print("\n".join(lines), flush=True)

    def execute(self, keep_process_group: bool = False, return_on_failure: bool = False) -> int:
        """Run it: every status ends in one end record and an exit code. `keep_process_group`
        lets a caller run several in one launch. `return_on_failure` returns a failed run's code
        instead of leaving the process: only for a process group of one rank (the check's meter),
        which has no peer to leave it broken."""
        world = self.world
        # every rank: a kernel this run builds or loads is the one `vit-scale prepare` built (the venv's ninja)
        use_venv_tools()
        try:
            self.prepare()
        except Exception as exc:
            if world.is_main:
                print(
                    f"{self.command}: rank {world.rank}: could not start the run: {one_line(exc)}",
                    file=sys.stderr,
                    flush=True,
                )
            return 1
        skipped = self._skip_if_not_fits(keep_process_group)
        if skipped is not None:
            return skipped

        def on_stuck(signum):
            if self.recorder:
                self._write_end(
                    self.interrupted("timeout" if signum is not None else "failed", self.signals.stuck_error(signum))
                )

        # what rank 0's watcher polls to learn that another rank failed (other ranks poll nothing)
        peer_failure = (lambda: bool(rank_errors(self.run_dir))) if world.is_main else None
        self.signals.watch(on_stuck, peer_failure)
        end, code, together = None, 1, False
        try:
            self.train()
            end = self.finish()
            together = True  # every rank finished the loop and the end-of-run collectives
            code = exit_code(end)
        except RunInterrupted as exc:
            end = self.interrupted("timeout", str(exc))
            code = exit_code(end)
        except UserError as exc:  # e.g. a checkpoint that fails to load: the same on every rank
            if world.is_main:
                print(f"vit-scale: error: {exc}", file=sys.stderr, flush=True)
                end = self.interrupted("failed", str(exc))
            code = exc.exit_code
        except Exception as exc:
            status = classify(exc)
            code = EXIT_CODES[status]
            if not world.is_main:
                write_rank_error(self.run_dir, world.rank, status, one_line(exc))
                print(f"vit-scale: rank {world.rank}: {status}: {one_line(exc)}", file=sys.stderr, flush=True)
            else:
                time.sleep(1.0)  # let a peer that failed first leave its reason
                end = self.interrupted(status, one_line(exc), failed_rank=world.rank)
                code = exit_code(end)
            if status == "failed" and os.environ.get("VIT_SCALE_TRACEBACK"):
                raise
        if self.recorder and end is not None:
            self._write_end(end)
            self.recorder.close()
        self.signals.done()
        if together:
            import torch.distributed as dist

            # no rank leaves before rank 0 has written the end record: torchrun ends the other
            # ranks as soon as one exits with a non-zero code (a requeue's 7, say)
            dist.barrier()
            if not keep_process_group:
                dist.destroy_process_group()
            return code
        if return_on_failure:
            return code
        leave(code)  # a broken process group can hang in its destructor


def main(session_class, argv, parse_args, check_inputs=None) -> int:
    """The command: parse, validate before any process group (one line and exit 2 on bad input,
    on rank 0 only), run, leave. `check_inputs(cfg, world, family)` (family: the label's
    `Family`) adds a recipe's own checks and returns what its session needs besides cfg and world."""
    args = parse_args(argv)
    world = None
    try:
        cfg = load_config(args.config, args.overrides)
        label = parse_strategy(cfg.strategy)
        world = detect_world(cfg.system.launcher, cfg.system.ranks_per_node)
        choose_device(world, cfg.system.device)
        strategy_class(label.family).check(cfg, label, world)
        tracking.check(cfg)
        extra = check_inputs(cfg, world, FAMILIES[label.family]) if check_inputs else ()
    except UserError as exc:
        if (world.rank if world else launch_rank_guess()) == 0:
            print(f"vit-scale: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    code = session_class(cfg, world, *extra).execute()
    if world.launcher == "mpi":
        from mpi4py import MPI  # finalise MPI ourselves: interpreter shutdown is skipped below

        MPI.Finalize()
    leave(code)
