"""One run: one model under one strategy on however many ranks this job was launched with.

    python -m vit_scale.train [--config FILE] [key=value ...]
    vit-scale train [--config FILE] [key=value ...]

Rank 0 writes the run record (docs/run_record.md) and prints progress; every rank exits with the
run's status code (0 ok, 1 failed, 2 bad input, 3 oom, 4 diverged, 5 timeout, 6 skipped).
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time

from .config import BENCHMARK_SECTIONS, Config, load_config, parse_command_line, to_yaml
from .distributed import parse_strategy, strategy_class
from .errors import UserError
from .text import plural
from .launch import MPI_RANK_VARS, World, choose_device, detect_world, init_distributed, leave, slurm_facts
from .record import (EXIT_CODES, RunRecorder, make_run_id, read_rank_errors, run_directory,
                     write_rank_error)
from .signals import RunInterrupted, SignalWatcher


def _parse_args(argv):
    return parse_command_line(argv, "vit-scale train", __doc__.split("\n\n")[0], "configs/",
                              "model=vit_micro strategy=HYBRID_2GPU train.batch_size=8 train.steps=30",
                              sections=BENCHMARK_SECTIONS)


def _launch_rank_guess() -> int:
    """Before the launcher is decoded: which rank we probably are, so only one prints an error."""
    for key in ("RANK", "SLURM_PROCID", *MPI_RANK_VARS):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def say(world: World | None, message: str) -> None:
    if world is None or world.is_main:
        print(message, flush=True)


# ---------------------------------------------------------------- the run

class Run:
    def __init__(self, cfg: Config, world: World):
        self.cfg, self.world = cfg, world
        self.label = parse_strategy(cfg.strategy)
        self.strategy = strategy_class(self.label.family)(cfg, self.label, world)
        self.recorder: RunRecorder | None = None
        self.run_dir = ""
        self.steps_done = 0
        self.step_times: list[float] = []
        self.timed_window_s = None
        self.first_step_at = None
        self.last_loss = None
        self.nonfinite_step = None
        self.model_info: dict = {}
        self.peak_tflops = None

    # ------------------------------------------------------------ phases

    def prepare(self) -> None:
        import torch.distributed as dist

        from . import models
        from .memory import device_memory_gib
        from .peaks import peak_tflops

        if not dist.is_initialized():
            init_distributed(self.world, self.cfg.system.collective_timeout_s)
        # rank 0 names the run; everyone needs the directory (failing ranks write there)
        def directory(run_id):
            return run_directory(self.cfg.output.dir, self.cfg.output.study, self.cfg.model,
                                 self.cfg.strategy, self.world.nodes, run_id)

        shared = [None]
        if self.world.is_main:
            base = self.cfg.output.run_id or make_run_id()
            run_id, n = base, 1
            while os.path.exists(directory(run_id)):  # never write into an earlier run's directory
                n += 1
                run_id = f"{base}-{n}"
            shared = [run_id]
        names = [None] * self.world.world_size
        dist.all_gather_object(names, self.world.node_name)
        dist.broadcast_object_list(shared, src=0)
        run_id = shared[0]
        hosts = list(dict.fromkeys(names))
        self.run_dir = directory(run_id)
        if not self.world.is_main:
            return
        self.recorder = RunRecorder(self.run_dir)
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(self.cfg))
        for name, text in self.strategy.artifacts().items():  # e.g. deepspeed.json
            with open(os.path.join(self.run_dir, name), "w") as f:
                f.write(text)
        self.model_info = models.describe(self.cfg.model, self.cfg.train.num_classes)
        device_name = self._device_name()
        self.peak_tflops, peak_source = peak_tflops(device_name, self.cfg.train.precision, self.cfg.system.peak_tflops)
        from .versions import git_revision, software_versions

        self.recorder.start({
            "run_id": run_id, "study": self.cfg.output.study,
            "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": self.cfg.to_dict(), "model": self.model_info,
            "strategy": self.strategy.describe(),
            "world": {"world_size": self.world.world_size, "nodes": self.world.nodes,
                      "ranks_per_node": self.world.local_world_size, "device_type": self.world.device_type,
                      "device_name": device_name,
                      "device_memory_gib": device_memory_gib(self.world.device_type, self.world.device_index),
                      "backend": self.world.backend, "peak_tflops_per_device": self.peak_tflops,
                      "peak_tflops_source": peak_source},
            "batch": {"per_device": self.cfg.train.batch_size,
                      "global": self.cfg.train.batch_size * self.world.world_size},
            "launcher": self.world.launcher, "slurm": slurm_facts(), "hosts": hosts,
            "versions": software_versions(), "git_revision": git_revision(), "plan": self._plan(),
        })
        say(self.world, f"vit-scale: {self.cfg.model} ({self.model_info['params'] / 1e6:.1f}M params) "
                        f"{self.cfg.strategy} on {plural(self.world.world_size, 'rank')}, {plural(self.world.nodes, 'node')}, "
                        f"{self.world.device_type} [{self.world.launcher}] -> {self.run_dir}")

    def _device_name(self) -> str:
        if self.world.device_type == "cpu":
            import platform

            from .versions import cpu_model

            return cpu_model() or platform.machine() or "cpu"
        import torch

        return torch.cuda.get_device_name(self.world.device_index)

    def _plan(self):
        try:
            from .plan import predict_for_run
        except ImportError:
            return None
        try:
            self.plan = predict_for_run(self.cfg, self.world)
        except Exception as exc:  # noqa: BLE001 - a planner bug must not cost the run
            say(self.world, f"vit-scale: warning: no memory plan: {_one_line(exc)}")
            self.plan = None
        return self.plan

    def train(self) -> None:
        import torch

        from .data import SyntheticBatches
        from .distributed.base import ModelFactory
        from .memory import MemoryProbe
        from .models import count_params, get_spec

        cfg, world = self.cfg, self.world
        spec = get_spec(cfg.model)
        factory = ModelFactory(spec, cfg.train.num_classes, cfg.train.seed, cfg.train.init,
                               count_params(cfg.model, cfg.train.num_classes))
        self.strategy.setup(factory)
        data = SyntheticBatches(cfg.train.batch_size, spec.img_size, cfg.train.num_classes, world.device,
                                cfg.train.seed, world.rank, cfg.train.synthetic_batches)
        self.probe = MemoryProbe(world.device_type)
        sync = torch.cuda.synchronize if world.device_type != "cpu" else (lambda: None)
        global_batch = cfg.train.batch_size * world.world_size
        window_start = None
        self.first_step_at = time.perf_counter()
        for step in range(1, cfg.train.steps + 1):
            warmup = step <= cfg.train.warmup_steps
            if step == cfg.train.warmup_steps + 1:
                sync()
                torch.distributed.barrier()  # all ranks enter the timed window together
                self.probe.reset()
                window_start = time.perf_counter()
            images, labels = data[step - 1]
            sync()
            t0 = time.perf_counter()
            loss = self.strategy.train_step(images, labels)
            sync()
            step_time = time.perf_counter() - t0
            loss_value = loss.item()
            self.steps_done, self.last_loss = step, loss_value
            if not math.isfinite(loss_value) and self.nonfinite_step is None:
                self.nonfinite_step = step
            if not warmup:
                self.step_times.append(step_time)
            if self.recorder and step % cfg.train.log_every == 0:
                self.recorder.step({"step": step, "loss": loss_value, "step_time_s": step_time,
                                    "images_per_s": global_batch / step_time, "warmup": warmup})
            if world.is_main and (step % cfg.train.print_every == 0 or step == cfg.train.steps):
                say(world, f"  step {step:>5}/{cfg.train.steps}  loss {loss_value:.4f}  "
                           f"{global_batch / step_time:10.1f} img/s{'  (warm-up)' if warmup else ''}")
        sync()
        window = torch.tensor([time.perf_counter() - window_start], dtype=torch.float64, device=world.device)
        torch.distributed.all_reduce(window, op=torch.distributed.ReduceOp.MAX)  # the slowest rank sets the pace
        self.timed_window_s = window.item()

    def finish_ok(self) -> dict:
        """End-of-run collectives (every rank): replica check and memory; rank 0 builds the summary."""
        import torch.distributed as dist

        from .replicas import replica_checksums, replicas_agree

        checksums = replica_checksums(self.strategy, self.world.device)
        peaks = [None] * self.world.world_size
        dist.all_gather_object(peaks, self.probe.peak())
        agree = replicas_agree(checksums)
        status, error = "ok", None
        if not agree:
            status, error = "diverged", (f"replicas differ at the end: parameter checksums "
                                         f"{sorted({round(c[0], 6) for c in checksums})} across ranks")
        elif self.nonfinite_step is not None:
            status, error = "diverged", f"loss was not finite from step {self.nonfinite_step}"
        timed = len(self.step_times)
        global_batch = self.cfg.train.batch_size * self.world.world_size
        per_step = [global_batch / t for t in self.step_times]
        mean_ips = timed * global_batch / self.timed_window_s
        tflops = self.model_info.get("flops_per_image", 0) * mean_ips / self.world.world_size / 1e12 \
            if self.world.is_main else None
        return {
            "status": status, "error": error, "failed_rank": None,
            "steps_done": self.steps_done, "timed_steps": timed,
            "wall_time_s": time.perf_counter() - self.first_step_at,
            "images_per_s": {"mean": mean_ips, "std": statistics.pstdev(per_step), "min": min(per_step),
                             "max": max(per_step), "median": statistics.median(per_step)},
            "images_per_s_per_device": mean_ips / self.world.world_size,
            "memory": _memory_summary(self.world.device_type, peaks, self.probe.window),
            "tflops_per_device": tflops,
            "mfu": tflops / self.peak_tflops if tflops is not None and self.peak_tflops else None,
            "replicas_agree": agree, "replica_checksums": checksums, "final_loss": self.last_loss,
        }

    def interrupted_end(self, status: str, error: str, failed_rank=None) -> dict:
        """End record for a run that did not reach its end-of-run collectives."""
        # a peer that failed first says why: its reason beats our "connection closed"
        for peer in read_rank_errors(self.run_dir):
            if status != "timeout" or peer.get("status") in ("oom", "failed"):
                status, error, failed_rank = peer["status"], f"rank {peer['rank']}: {peer['error']}", peer["rank"]
                break
        mem = None
        if getattr(self, "probe", None) is not None:
            mem = _memory_summary(self.world.device_type, [self.probe.peak()], self.probe.window)
        per_step = [self.cfg.train.batch_size * self.world.world_size / t for t in self.step_times]
        return {"status": status, "error": error, "failed_rank": failed_rank, "steps_done": self.steps_done,
                "timed_steps": len(self.step_times),
                "wall_time_s": time.perf_counter() - self.first_step_at if self.first_step_at else None,
                "images_per_s": ({"mean": statistics.fmean(per_step), "std": statistics.pstdev(per_step),
                                  "min": min(per_step), "max": max(per_step),
                                  "median": statistics.median(per_step)} if per_step else None),
                "images_per_s_per_device": (statistics.fmean(per_step) / self.world.world_size
                                            if per_step else None),
                "memory": mem, "tflops_per_device": None, "mfu": None,
                "replicas_agree": None, "replica_checksums": None, "final_loss": self.last_loss}


def _memory_summary(device_type: str, peaks: list[dict], window: str) -> dict:
    summary = {"device_kind": device_type, "window": window}
    for key in peaks[0]:
        values = [p[key] for p in peaks]
        summary[key] = {"max": max(values), "mean": statistics.fmean(values), "per_rank": values}
    return summary


def _classify(exc: BaseException) -> str:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower():
        return "oom"
    return "failed"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]


def _print_summary(run: Run, end: dict) -> None:
    world = run.world
    lines = [f"vit-scale: {run.cfg.model} {run.cfg.strategy} on {plural(world.world_size, 'rank')} "
             f"({plural(world.nodes, 'node')}, {world.device_type}): {end['status'].upper()}"]
    if end.get("error"):
        lines.append(f"  error: {end['error']}")
    ips = end.get("images_per_s")
    if ips:
        lines.append(f"  images/s {ips['mean']:.1f} ± {ips['std']:.1f} "
                     f"({end['images_per_s_per_device']:.1f} per device) over {end['timed_steps']} timed steps")
    mem = end.get("memory") or {}
    for key, label in (("peak_allocated_gib", "peak allocated"), ("peak_reserved_gib", "peak reserved"),
                       ("peak_rss_gib", "peak RSS")):
        if key in mem:
            lines.append(f"  {label} per rank: max {mem[key]['max']:.2f} GiB, mean {mem[key]['mean']:.2f} GiB")
    if end.get("tflops_per_device") is not None:
        mfu = f"{end['mfu'] * 100:.1f}%" if end.get("mfu") is not None else "n/a (no peak known; set system.peak_tflops)"
        lines.append(f"  {end['tflops_per_device']:.3f} TFLOP/s per device, MFU {mfu}")
    if end.get("replicas_agree") is not None:
        lines.append(f"  replicas agree: {'yes' if end['replicas_agree'] else 'NO'}")
    lines.append(f"  record: {os.path.join(run.run_dir, 'metrics.jsonl')}")
    print("\n".join(lines), flush=True)


def _skip_if_not_fits(run: Run, keep_process_group: bool) -> int | None:
    """plan.skip_if_not_fits: a run the planner says cannot fit ends as `skipped` (exit 6) before
    any model is built. Rank 0 made the plan (in prepare); its verdict goes to every rank."""
    if not run.cfg.plan.skip_if_not_fits:
        return None
    import torch.distributed as dist

    plan = getattr(run, "plan", None)
    verdict = [None]
    if run.world.is_main and plan and plan.get("fits") is False:
        verdict = [f"does not fit: predicted {plan['memory_gib']:.3g} GiB > {plan['device_memory_gib']:.3g} GiB"]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is None:
        return None
    if run.recorder:
        end = {"status": "skipped", "error": verdict[0], "failed_rank": None, "steps_done": 0, "timed_steps": 0,
               "wall_time_s": None, "images_per_s": None, "images_per_s_per_device": None, "memory": None,
               "tflops_per_device": None, "mfu": None, "replicas_agree": None, "replica_checksums": None,
               "final_loss": None}
        if run.recorder.end(end):
            _print_summary(run, end)
        run.recorder.close()
    if not keep_process_group:
        dist.destroy_process_group()
    return EXIT_CODES["skipped"]


def execute(cfg: Config, world: World, keep_process_group: bool = False) -> int:
    """Run one configuration. `keep_process_group` lets a caller run several in one launch."""
    run = Run(cfg, world)
    try:
        run.prepare()
    except Exception as exc:  # noqa: BLE001 - e.g. a rendezvous that never completes
        if world.is_main:
            print(f"vit-scale: rank {world.rank}: could not start the run: {_one_line(exc)}", file=sys.stderr,
                  flush=True)
        return 1
    skipped = _skip_if_not_fits(run, keep_process_group)
    if skipped is not None:
        return skipped

    def on_stuck(signum):
        if run.recorder:
            status = "timeout" if signum is not None else "failed"
            error = "stopped by a signal while blocked in a collective" if signum else "a peer rank failed"
            end = run.interrupted_end(status, error)
            if run.recorder.end(end):
                _print_summary(run, end)

    def peer_failed() -> bool:
        return bool(read_rank_errors(run.run_dir))

    watcher = SignalWatcher(on_stuck, peer_failure=peer_failed if world.is_main else None)
    end = None
    try:
        run.train()
        end = run.finish_ok()
    except RunInterrupted as exc:
        end = run.interrupted_end("timeout", str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure becomes a record, not a traceback wall
        status = _classify(exc)
        if not world.is_main:
            write_rank_error(run.run_dir, world.rank, status, _one_line(exc))
        else:
            time.sleep(1.0)  # let a peer that failed first leave its reason
            end = run.interrupted_end(status, _one_line(exc), failed_rank=world.rank)
        if status == "failed" and os.environ.get("VIT_SCALE_TRACEBACK"):
            raise
        if not world.is_main:
            print(f"vit-scale: rank {world.rank}: {status}: {_one_line(exc)}", file=sys.stderr, flush=True)
            end = {"status": status}
    code = EXIT_CODES.get(end["status"], 1) if end else 1
    if run.recorder:
        if run.recorder.end(end):
            _print_summary(run, end)
        run.recorder.close()
    watcher.done()
    if end["status"] in ("ok", "diverged"):
        import torch.distributed as dist

        if not keep_process_group:
            dist.destroy_process_group()
        return code
    leave(code)  # a broken process group can hang in its destructor


def main(argv=None) -> int:
    args = _parse_args(argv)
    world = None
    try:
        cfg = load_config(args.config, args.overrides)
        label = parse_strategy(cfg.strategy)
        world = detect_world(cfg.system.launcher, cfg.system.ranks_per_node)
        choose_device(world, cfg.system.device)
        strategy_class(label.family).check(cfg, label, world)
    except UserError as exc:
        if (world.rank if world else _launch_rank_guess()) == 0:
            print(f"vit-scale: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    code = execute(cfg, world)
    if world.launcher == "mpi":
        from mpi4py import MPI

        MPI.Finalize()
    leave(code)


if __name__ == "__main__":
    sys.exit(main())
