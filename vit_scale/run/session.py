"""What every run does, whatever it trains: the run session.

A recipe (`vit_scale.recipes.train`, the benchmark on synthetic data; `vit_scale.recipes.finetune`, real data
with evaluation and checkpoints) subclasses RunSession and says only what differs: its loop
(`train`), its end record after the loop (`finish`), its extra summary lines, its signal model
and its exit code for a stopped run. The session owns the rest: the command line, the checks
before any process group, the process group, the run directory and start record, the planner's
verdict (`plan.skip_if_not_fits`), the signal watcher, the end record for every status, the
summary printed at the end, the exit code and the exit itself (MPI included).

Exit codes: 0 ok, 1 failed, 2 bad input, 3 oom, 4 diverged, 5 timeout (a signal), 6 skipped,
and for a recipe that saves on a signal, 7: stopped after saving a checkpoint (requeue).
"""
from __future__ import annotations

import collections
import math
import os
import statistics
import sys
import time

from vit_scale.config import Config, load_config, to_yaml
from vit_scale.distributed import parse_strategy, strategy_class
from vit_scale.distributed.kernels import use_venv_tools
from vit_scale.errors import UserError
from vit_scale.run import tracking
from vit_scale.launch.world import MPI_RANK_VARS, World, choose_device, detect_world, init_distributed, leave, slurm_facts
from vit_scale.record.reader import rank_errors
from vit_scale.record.writer import EXIT_CODES, RunRecorder, make_run_id, run_directory, write_rank_error
from vit_scale.launch.signals import RunInterrupted, SignalWatcher
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


def memory_summary(device_type: str, peaks: list[dict], window: str) -> dict:
    summary = {"device_kind": device_type, "window": window}
    for key in peaks[0]:
        values = [p[key] for p in peaks]
        summary[key] = {"max": max(values), "mean": statistics.fmean(values), "per_rank": values}
    return summary


def images_per_s(step_times: list[float], images_per_step: int, window_s: float | None = None) -> dict | None:
    """images/s over the timed steps: the mean is the images of all timed steps over the timed
    window (the slowest rank's, synchronised at its ends) when there is one, else the mean of
    the per-step figures; the spread is always the per-step figures'."""
    per_step = [images_per_step / t for t in step_times if t > 0]
    if not per_step:
        return None
    mean = len(step_times) * images_per_step / window_s if window_s else statistics.fmean(per_step)
    return {"mean": mean, "std": statistics.pstdev(per_step), "min": min(per_step), "max": max(per_step),
            "median": statistics.median(per_step)}


class StepMeter:
    """The step bookkeeping every loop shares: warm-up, the timed window and its memory window,
    step records, progress lines.

    The timed window opens before the first step after the warm-up, with the device synchronised
    and every rank at a barrier, so all ranks enter it together; the memory probe's peak is reset
    there. `window_s()` (every rank, a collective) synchronises and closes it. `window` says what
    its length is: "wall" (the benchmark: the wall time from its opening to the end of the loop)
    or "steps" (fine-tuning: the sum of the timed steps' own times, since evaluations and
    checkpoints happen in between); either way the slowest rank's.

    Two ways to time a step:
    - `start()` ... `stop(step, loss)` (the benchmark): no host synchronisation inside the window.
      On a GPU two device events recorded on the stream bracket the step and its loss is copied
      to pinned host memory behind the step's kernels. Steps are booked lagged: after queueing
      step k, every earlier step whose end event the device has passed is booked (a query, no
      wait), and the host waits only for step k - LAG, so the device always has work queued and
      the host's own time per step (Python, the wrapper's hooks, launches) hides behind it. The
      progress line therefore shows the last completed step. On a CPU a step is done when it
      returns: host clock, booked at once, as before.
    - `before_step()` ... `after_step(step, loss, seconds, record, progress)` (fine-tuning): the
      loop times the step itself; it needs each loss at once (the ranks agree on divergence and
      stop requests every step), so it synchronises anyway."""

    LAG = 2  # steps the host may run ahead of the device before it waits for the oldest

    def __init__(self, session: "RunSession", images_per_step: int, total_steps: int, untimed_steps: int,
                 window: str = "wall"):
        import torch

        from vit_scale.run.memory import MemoryProbe

        self.session, self.world = session, session.world
        self.images_per_step, self.total_steps, self.untimed = images_per_step, total_steps, untimed_steps
        self.window = window
        self.probe = session.probe = MemoryProbe(self.world.device_type)
        self.device_events = self.world.device_type != "cpu"
        self.sync = torch.cuda.synchronize if self.device_events else (lambda: None)
        self.steps_started = 0
        self.first_step_s = None    # train.compile: the first step holds the compilation
        self.graphs_at_open = None  # graphs torch.compile had made when the timed window opened
        self.graphs_before = compiled_graphs()  # the count is the process's: several runs may share one
        self.steps_this_run = 0   # booked
        self.opened_at = None
        self._pending = collections.deque()  # (step, start event, end event, pinned loss)
        self._start = None
        session.first_step_at = time.perf_counter()

    # ------------------------------------------------------------ the window

    def before_step(self) -> None:
        if self.steps_started == self.untimed and self.opened_at is None:
            import torch.distributed as dist

            self.drain()
            dist.barrier()  # all ranks enter the timed window together
            self.probe.reset()
            self.graphs_at_open = compiled_graphs()
            self.opened_at = time.perf_counter()
        self.steps_started += 1

    def window_s(self) -> float | None:
        """The timed window's length on the slowest rank (every rank calls it: an all-reduce)."""
        import torch
        import torch.distributed as dist

        self.drain()
        if self.probe is not None:
            self.probe.close()  # before the end-of-run work allocates (replica check, profiled steps)
        if self.window == "wall":
            mine = time.perf_counter() - self.opened_at if self.opened_at is not None else 0.0
        else:
            mine = sum(self.session.step_times)
        window = torch.tensor([mine], dtype=torch.float64, device=self.world.device)
        dist.all_reduce(window, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        return window.item() or None

    def compile_facts(self) -> dict | None:
        """train.compile: the first step's time (compilation included), the graphs made, and whether
        any was made inside the timed window (a recompile there is in the images/s)."""
        if not self.session.cfg.train.compile:
            return None
        now = compiled_graphs()
        in_window = now - self.graphs_at_open if self.graphs_at_open is not None else None
        return {"first_step_s": self.first_step_s, "graphs": now - self.graphs_before, "graphs_in_window": in_window,
                "recompiled_in_window": bool(in_window) if in_window is not None else None}

    # ------------------------------------------------------------ steps without host syncs

    def start(self) -> None:
        """Before a step's work is queued."""
        self.before_step()
        if self.device_events:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self, step: int, loss) -> None:
        """After a step's work is queued; `loss` is its 0-d tensor, still on the device."""
        if not self.device_events:
            seconds = time.perf_counter() - self._start
            self._book(step, loss.item(), seconds)
            return
        import torch

        host_loss = self._to_host(loss)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((step, self._start, end, host_loss))
        self._book_done(must=len(self._pending) - self.LAG)

    @staticmethod
    def _to_host(loss):
        """A copy queued behind the step's kernels into pinned memory: valid once its end event is passed."""
        import torch

        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(loss.detach().float(), non_blocking=True)
        return host

    def drain(self) -> None:
        """Synchronise and book every step still on the device."""
        self.sync()
        self._book_done(must=len(self._pending))

    def _book_done(self, must: int) -> None:
        while self._pending:
            step, start, end, host_loss = self._pending[0]
            if must > 0:
                end.synchronize()
                must -= 1
            elif not end.query():
                break
            self._pending.popleft()
            self._book(step, host_loss.item(), start.elapsed_time(end) / 1e3)

    def _book(self, step: int, loss: float, seconds: float) -> None:
        ips = self.images_per_step / seconds if seconds > 0 else float("nan")
        self.after_step(step, loss, seconds, {"step_time_s": seconds, "images_per_s": ips}, f"{ips:10.1f} img/s")

    # ------------------------------------------------------------ booking

    def after_step(self, step: int, loss: float, seconds: float, record: dict, progress: str) -> bool:
        """Book one finished step (`seconds`: its timed duration); True while warming up."""
        s, cfg = self.session, self.session.cfg
        self.steps_this_run += 1
        warmup = self.steps_this_run <= self.untimed
        if self.steps_this_run == 1:
            self.first_step_s = seconds
        s.steps_done, s.last_loss = step, loss
        if not math.isfinite(loss) and s.nonfinite_step is None:
            s.nonfinite_step = step
        if not warmup:
            s.step_times.append(seconds)
        if s.recorder and step % cfg.train.log_every == 0:
            s.recorder.step({"step": step, "loss": loss, **record, "warmup": warmup})
        if self.world.is_main and (step % cfg.train.print_every == 0 or step == self.total_steps):
            say(self.world, f"  step {step:>6}/{self.total_steps}  loss {loss:.4f}  {progress}"
                            f"{'  (warm-up)' if warmup else ''}")
        return warmup


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (0 when it was never used)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def launch_rank_guess() -> int:
    """Before the launcher is decoded: which rank we probably are, so only one prints an error."""
    for key in ("RANK", "SLURM_PROCID", *MPI_RANK_VARS):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


class RunSession:
    """One run of one model under one strategy on the launched ranks; see the module doc."""

    command = "vit-scale"            # how the summary names the command

    def __init__(self, cfg: Config, world: World):
        self.cfg, self.world = cfg, world
        self.label = parse_strategy(cfg.strategy)
        self.strategy = strategy_class(self.label.family)(cfg, self.label, world)
        self.recorder: RunRecorder | None = None
        self.run_dir = ""
        self.steps_done = 0
        self.step_times: list[float] = []
        self.first_step_at = None
        self.last_loss = None
        self.nonfinite_step = None
        self.model_info: dict = {}
        self.peak_tflops = None
        self.plan = None
        self.probe = None                # the memory probe, once the loop has started

    # ------------------------------------------------------------ what a recipe says

    def train(self) -> None:
        """The loop. Returns when it is done or the recipe decided to stop (every rank together)."""
        raise NotImplementedError

    def finish(self) -> dict:
        """The end record after `train` returned, on every rank (end-of-run collectives allowed)."""
        raise NotImplementedError

    def interrupted_summary(self, status: str, error: str, failed_rank) -> dict:
        """The end record of a run that did not reach `finish`: no collectives any more."""
        raise NotImplementedError

    def summary_head(self, end: dict) -> str:
        world = self.world
        return (f"{self.command}: {self.cfg.model} {self.cfg.strategy} on {plural(world.world_size, 'rank')} "
                f"({plural(world.nodes, 'node')}, {world.device_type}): {end['status'].upper()}")

    def summary_extra(self, end: dict) -> list[str]:
        return []

    def watcher(self, on_stuck) -> SignalWatcher:
        """The signal model: by default a signal interrupts the loop (RunInterrupted) and the run
        ends as `timeout`; a recipe that saves first notes the signal instead (finetune)."""
        return SignalWatcher(on_stuck, peer_failure=self.peer_failure_check())

    def peer_failure_check(self):
        """What rank 0's watcher polls to learn that another rank failed (other ranks poll nothing)."""
        return (lambda: bool(rank_errors(self.run_dir))) if self.world.is_main else None

    def stuck_error(self, signum) -> str:
        return "stopped by a signal while blocked in a collective" if signum else "a peer rank failed"

    def exit_code(self, end: dict) -> int:
        return EXIT_CODES.get(end["status"], 1)

    # ------------------------------------------------------------ the start

    def prepare(self) -> None:
        import torch.distributed as dist

        from vit_scale import models
        from vit_scale.run.memory import device_memory_gib
        from vit_scale.run.peaks import math_precision, peak_tflops

        if not dist.is_initialized():
            init_distributed(self.world, self.cfg.system.collective_timeout_s)
        if self.world.device_type != "cpu":
            import torch

            # set for every run: several runs in one process must not inherit each other's choice
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.cfg.train.tf32

        def directory(run_id):
            return run_directory(self.cfg.output.dir, self.cfg.output.study, self.cfg.model,
                                 self.cfg.strategy, self.world.nodes, run_id)

        # rank 0 names the run; everyone needs the directory (failing ranks write there)
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
        if self.cfg.tracking.backend != "none":
            from vit_scale.run.tracking import Tracker

            self.recorder.listeners.append(Tracker(self.cfg, self.run_dir, run_id).write)
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(self.cfg))
        for name, text in self.strategy.artifacts().items():  # e.g. deepspeed.json
            with open(os.path.join(self.run_dir, name), "w") as f:
                f.write(text)
        self.model_info = models.describe(self.cfg.model, self.cfg.train.num_classes)
        device_name = self._device_name()
        arithmetic = math_precision(self.cfg.train.precision, self.cfg.train.tf32, self.world.device_type)
        self.peak_tflops, peak_source = peak_tflops(device_name, arithmetic, self.cfg.system.peak_tflops)
        from vit_scale.record.versions import git_revision, software_versions

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
            "kernels_prebuilt": self._kernels_prebuilt(),
        })
        say(self.world, f"{self.command}: {self.cfg.model} ({self.model_info['params'] / 1e6:.1f}M params) "
                        f"{self.cfg.strategy} on {plural(self.world.world_size, 'rank')}, "
                        f"{plural(self.world.nodes, 'node')}, {self.world.device_type} [{self.world.launcher}] "
                        f"-> {self.run_dir}")

    def _kernels_prebuilt(self) -> dict:
        """Each JIT kernel this strategy needs and whether `vit-scale prepare` (or an earlier run)
        built it before this run: false means this run's first step includes compiling it."""
        from vit_scale.distributed.kernels import prebuilt

        try:
            return prebuilt(self.cfg.strategy, self.world.device_type)
        except Exception as exc:  # never lose a run over this fact; say why it is missing
            return {"unknown": f"{type(exc).__name__}: {exc}"}

    def _device_name(self) -> str:
        if self.world.device_type == "cpu":
            import platform

            from vit_scale.record.versions import cpu_model

            return cpu_model() or platform.machine() or "cpu"
        import torch

        return torch.cuda.get_device_name(self.world.device_index)

    def _plan(self):
        try:
            from vit_scale.planning import predict_for_run
        except ImportError:
            return None
        try:
            self.plan = predict_for_run(self.cfg, self.world)
        except Exception as exc:  # noqa: BLE001 - a planner bug must not cost the run
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
            verdict = [f"does not fit: predicted {self.plan['memory_gib']:.3g} GiB > "
                       f"{self.plan['device_memory_gib']:.3g} GiB"]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is None:
            return None
        if self.recorder:
            end = {"status": "skipped", "error": verdict[0], "failed_rank": None, "steps_done": 0, "timed_steps": 0,
                   "wall_time_s": None, "images_per_s": None, "images_per_s_per_device": None, "memory": None,
                   "tflops_per_device": None, "mfu": None, "replicas_agree": None, "replica_checksums": None,
                   "final_loss": None}
            if self.recorder.end(end):
                self.print_summary(end)
            self.recorder.close()
        if not keep_process_group:
            dist.destroy_process_group()
        return EXIT_CODES["skipped"]

    # ------------------------------------------------------------ the end

    def interrupted(self, status: str, error: str, failed_rank=None) -> dict:
        """End record for a run that did not reach its end-of-run collectives."""
        # a peer that failed first says why: its reason beats our "connection closed"
        for peer in rank_errors(self.run_dir):
            if status != "timeout" or peer.get("status") in ("oom", "failed"):
                status, error, failed_rank = peer["status"], f"rank {peer['rank']}: {peer['error']}", peer["rank"]
                break
        end = self.interrupted_summary(status, error, failed_rank)
        if self.probe is not None:
            end["memory"] = memory_summary(self.world.device_type, [self.probe.peak()], self.probe.window)
        return end

    def print_summary(self, end: dict) -> None:
        lines = [self.summary_head(end)]
        if end.get("error"):
            lines.append(f"  error: {end['error']}")
        lines += self.summary_extra(end)
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
            mfu = (f"{end['mfu'] * 100:.1f}%" if end.get("mfu") is not None
                   else "n/a (no peak known; set system.peak_tflops)")
            lines.append(f"  {end['tflops_per_device']:.3f} TFLOP/s per device, MFU {mfu}")
        if end.get("replicas_agree") is not None:
            lines.append(f"  replicas agree: {'yes' if end['replicas_agree'] else 'NO'}")
        if end.get("checkpoint"):
            lines.append(f"  checkpoint: {end['checkpoint']}")
        lines.append(f"  record: {os.path.join(self.run_dir, 'metrics.jsonl')}")
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
        except Exception as exc:  # noqa: BLE001 - e.g. a rendezvous that never completes
            if world.is_main:
                print(f"{self.command}: rank {world.rank}: could not start the run: {one_line(exc)}",
                      file=sys.stderr, flush=True)
            return 1
        skipped = self._skip_if_not_fits(keep_process_group)
        if skipped is not None:
            return skipped

        def on_stuck(signum):
            if self.recorder:
                end = self.interrupted("timeout" if signum is not None else "failed", self.stuck_error(signum))
                if self.recorder.end(end):
                    self.print_summary(end)

        watcher = self.watcher(on_stuck)
        end, code, together = None, 1, False
        try:
            self.train()
            end = self.finish()
            together = True  # every rank finished the loop and the end-of-run collectives
            code = self.exit_code(end)
        except RunInterrupted as exc:
            end = self.interrupted("timeout", str(exc))
            code = EXIT_CODES.get(end["status"], 1)
        except UserError as exc:  # e.g. a checkpoint that fails to load: the same on every rank
            if world.is_main:
                print(f"vit-scale: error: {exc}", file=sys.stderr, flush=True)
                end = self.interrupted("failed", str(exc))
            code = exc.exit_code
        except Exception as exc:  # noqa: BLE001 - any failure becomes a record, not a traceback wall
            status = classify(exc)
            code = EXIT_CODES[status]
            if not world.is_main:
                write_rank_error(self.run_dir, world.rank, status, one_line(exc))
                print(f"vit-scale: rank {world.rank}: {status}: {one_line(exc)}", file=sys.stderr, flush=True)
            else:
                time.sleep(1.0)  # let a peer that failed first leave its reason
                end = self.interrupted(status, one_line(exc), failed_rank=world.rank)
                code = EXIT_CODES.get(end["status"], 1)
            if status == "failed" and os.environ.get("VIT_SCALE_TRACEBACK"):
                raise
        if self.recorder and end is not None:
            if self.recorder.end(end):
                self.print_summary(end)
            self.recorder.close()
        watcher.done()
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
    on rank 0 only), run, leave. `check_inputs(cfg, world, family)` adds a recipe's own checks
    and returns what its session needs besides cfg and world."""
    args = parse_args(argv)
    world = None
    try:
        cfg = load_config(args.config, args.overrides)
        label = parse_strategy(cfg.strategy)
        family = strategy_class(label.family)
        world = detect_world(cfg.system.launcher, cfg.system.ranks_per_node)
        choose_device(world, cfg.system.device)
        family.check(cfg, label, world)
        tracking.check(cfg)
        extra = check_inputs(cfg, world, family) if check_inputs else ()
    except UserError as exc:
        if (world.rank if world else launch_rank_guess()) == 0:
            print(f"vit-scale: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    code = session_class(cfg, world, *extra).execute()
    if world.launcher == "mpi":
        from mpi4py import MPI  # finalise MPI ourselves: interpreter shutdown is skipped below

        MPI.Finalize()
    leave(code)
