"""Fine-tune a ViT on real images under any fine-tuning strategy, with evaluation and resumable checkpoints.

    python -m vit_scale finetune [--config FILE] [key=value ...]
    vit-scale finetune [--config FILE] [key=value ...]

e.g. `data.path=~/data/pets model=vit_base strategy=FULL_SHARD finetune.pretrained=vit_base.safetensors`.
Same launchers, strategies, run directory and run record as `vit-scale train` (docs/run_record.md,
plus `eval` records); guide in docs/finetune.md. Exit codes: 0 ok, 1 failed, 2 bad input, 3 oom,
4 diverged, 5 stopped by a signal without a checkpoint, 7 stopped by a signal (Slurm's time
limit) after saving a checkpoint: requeue the job with checkpoint.resume=auto and it continues.

The benchmark loop (vit_scale.recipes.train) stays as it is; this loop adds a real input pipeline,
a learning-rate schedule, gradient accumulation and clipping, evaluation and checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, replace

from vit_scale.config import Config, parse_command_line
from vit_scale.errors import UserError
from vit_scale.launch.world import World
from vit_scale.recipes import checkpoint as ckpt
from vit_scale.recipes import lora
from vit_scale.record.end import EndRecord
from vit_scale.run.meter import StepMeter
from vit_scale.run.session import RunSession, say
from vit_scale.run.session import main as session_main
from vit_scale.run.stopping import SaveThenStop
from vit_scale.text import plural

# tests stop a run at an exact step through the real signal path: rank 0 signals itself after
# that optimizer step (the other ranks learn of it through the per-step agreement, as they
# would when Slurm's signal reaches only some of them)
TEST_SIGNAL_ENV = "VIT_SCALE_TEST_SIGNAL_AT_STEP"


def _parse_args(argv):
    return parse_command_line(
        argv,
        "vit-scale finetune",
        __doc__.split("\n\n")[0],
        "configs/finetune/",
        "data.path=DIR model=vit_micro strategy=FULL_SHARD finetune.epochs=5",
    )


def learning_rate(step: int, total: int, base: float, warmup: int, min_lr: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay towards min_lr; `step` is 1-based."""
    if warmup and step <= warmup:
        return base * step / warmup
    progress = (step - 1 - warmup) / max(1, total - warmup)
    return min_lr + (base - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- inputs, checked before any process group


@dataclass
class Inputs:
    splits: object  # datasets.Splits
    pretrained_state: dict | None
    head_replaced: bool
    resume_path: str | None
    resume_meta: dict | None


def check_inputs(cfg: Config, world: World) -> Inputs:
    """Everything a user can get wrong, found on every rank before any collective: a bad dataset,
    pretrained file or checkpoint is a one-line error and exit code 2 on every rank."""
    from vit_scale.distributed.base import META_INIT_ABOVE_PARAMS
    from vit_scale.models import build_model, count_params, get_spec
    from vit_scale.recipes import datasets

    splits = datasets.load_splits(cfg.data, cfg.train.seed)
    cfg.train.num_classes = len(splits.classes)  # the dataset decides; the resolved config records it
    per_rank = len(splits.train) // world.world_size
    micro_batches = per_rank // cfg.train.batch_size
    if micro_batches // cfg.finetune.accumulation_steps < 1:
        raise UserError(
            f"train.batch_size: {splits.train.where} has {len(splits.train)} training images, "
            f"{per_rank} per rank on {plural(world.world_size, 'rank')}: too few for one step of "
            f"{cfg.train.batch_size} x {cfg.finetune.accumulation_steps} (accumulation) per rank"
        )
    spec = get_spec(cfg.model)
    state, head_replaced = None, False
    if cfg.finetune.pretrained:
        params = count_params(cfg.model, cfg.train.num_classes)
        if cfg.train.init == "meta" or (cfg.train.init == "auto" and params > META_INIT_ABOVE_PARAMS):
            raise UserError(
                f"finetune.pretrained: {cfg.model} would be built on the meta device (train.init="
                f"{cfg.train.init}), which cannot take pretrained weights yet; set train.init=device"
            )
        from vit_scale.recipes import pretrained

        state, head_replaced = pretrained.prepare(
            cfg.finetune.pretrained, build_model(spec, cfg.train.num_classes, device="meta")
        )
    resume_path = ckpt.resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.dir)
    meta = None
    if resume_path:
        meta = ckpt.read_meta(resume_path)
        ckpt.verify(resume_path, meta, _checkpoint_facts(cfg, world))
    return Inputs(splits, state, head_replaced, resume_path, meta)


def _checkpoint_facts(cfg: Config, world: World) -> dict:
    """What a checkpoint records about its run, and a resumed run must match."""
    return {
        "model": cfg.model,
        "strategy": cfg.strategy,
        "world_size": world.world_size,
        "batch_size": cfg.train.batch_size,
        "accumulation_steps": cfg.finetune.accumulation_steps,
        "seed": cfg.train.seed,
        "num_classes": cfg.train.num_classes,
        "lora": lora.describe(cfg.finetune.lora),
    }


# ---------------------------------------------------------------- the run


class FinetuneRun(RunSession):
    """The fine-tuning recipe: real data, a schedule, accumulation, evaluation, checkpoints; and
    signals as requests to save and stop (SaveThenStop), agreed by the ranks every step."""

    command = "vit-scale finetune"

    def __init__(self, cfg: Config, world: World, inputs: Inputs):
        super().__init__(cfg, world, signals=SaveThenStop(cfg.checkpoint.signal_grace_s))
        self.strategy.configure_finetune(cfg.finetune)  # before prepare writes deepspeed.json
        self.inputs = inputs
        self.position = ckpt.Position()
        self.total_steps = 0
        self.data_times: list[float] = []
        self.images_per_step = cfg.train.batch_size * world.world_size * cfg.finetune.accumulation_steps
        self.final_eval = None
        self.best_top1 = None
        self.saved: str | None = None
        self.stop_signal: int | None = None
        self.diverged_at: int | None = None  # the step at which the ranks agreed the loss was not finite
        self.checkpoint_dir = cfg.checkpoint.dir
        self.lora_facts: dict | None = None  # adapters and parameter counts, when finetune.lora.rank > 0

    def prepare(self) -> None:
        super().prepare()
        self.checkpoint_dir = self.cfg.checkpoint.dir or os.path.join(self.run_dir, "checkpoints")
        facts = self.inputs.splits.describe()
        say(
            self.world,
            f"  data: {facts['format']} {facts['classes']} classes, {facts['train_images']} train images "
            f"({facts['train']}), {facts['val_images']} validation ({facts['val']})",
        )
        if self.cfg.finetune.pretrained:
            say(
                self.world,
                f"  pretrained: {self.cfg.finetune.pretrained}"
                f"{' (classifier head replaced)' if self.inputs.head_replaced else ''}",
            )

    # ------------------------------------------------------------ training

    def train(self) -> None:
        import torch.nn.functional as F

        from vit_scale.distributed.base import ModelFactory
        from vit_scale.models import count_params, get_spec
        from vit_scale.recipes import datasets

        cfg, world, ft = self.cfg, self.world, self.cfg.finetune
        spec = get_spec(cfg.model)
        nc = cfg.train.num_classes
        args = (spec, nc, cfg.train.seed, cfg.train.init, count_params(cfg.model, nc))
        if self.inputs.pretrained_state is not None:
            from vit_scale.recipes.pretrained import PretrainedFactory

            factory = PretrainedFactory(*args, state=self.inputs.pretrained_state)
        else:
            factory = ModelFactory(*args)
        base_factory = factory
        if lora.enabled(ft.lora):
            factory = lora.LoraFactory(base_factory, ft.lora)
        self.strategy.setup(factory)
        self.inputs.pretrained_state = None  # the model holds the weights now; free the host copy
        if hasattr(base_factory, "state"):
            base_factory.state = None
        if lora.enabled(ft.lora):
            self.lora_facts = facts = factory.facts
            say(
                world,
                f"  LoRA {lora.describe(ft.lora)}: {facts['adapted_layers']} layers adapted, "
                f"{facts['trainable_params'] / 1e6:.3f}M of {facts['total_params'] / 1e6:.2f}M parameters train "
                f"({100 * facts['trainable_params'] / facts['total_params']:.2f}%: adapters and head)",
            )

        splits, data = self.inputs.splits, cfg.data
        # seeded per sample only where the transform is random: with augment=none it draws nothing, and
        # fork_rng with manual_seed took 0.13 ms an image (a 32 px PNG's whole read and transform took 0.15 ms)
        self.train_set = datasets.ImageDataset(
            splits.train,
            datasets.build_transform(data, spec.img_size, True),
            cfg.train.seed,
            train=datasets.random_augmentation(data, True),
        )
        val_set = datasets.ImageDataset(
            splits.val, datasets.build_transform(data, spec.img_size, False), cfg.train.seed, train=False
        )
        self.sampler = datasets.ResumableDistributedSampler(
            len(self.train_set), world.rank, world.world_size, cfg.train.seed
        )
        pin = data.pin_memory and world.device_type != "cpu"
        self.train_loader = datasets.make_loader(
            self.train_set, self.sampler, cfg.train.batch_size, data.workers, pin, drop_last=True
        )
        self.eval_loader = datasets.make_loader(
            val_set,
            datasets.ShardedEvalSampler(len(val_set), world.rank, world.world_size),
            ft.eval_batch_size or cfg.train.batch_size,
            data.workers,
            pin,
            drop_last=False,
        )
        accum, batch = ft.accumulation_steps, cfg.train.batch_size
        self.steps_per_epoch = self.sampler.num_samples // batch // accum
        self.total_steps = ft.steps or ft.epochs * self.steps_per_epoch
        epochs = math.ceil(self.total_steps / self.steps_per_epoch)

        if self.inputs.resume_path:
            self.position = ckpt.load(self.strategy, self.inputs.resume_path, self.inputs.resume_meta)
            say(
                world,
                f"  resumed from {self.inputs.resume_path}: step {self.position.step}, epoch "
                f"{self.position.epoch + 1}, {self.position.step_in_epoch}/{self.steps_per_epoch} steps into it",
            )
        smoothing = ft.label_smoothing
        self.criterion = lambda logits, labels: F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
        untimed = min(cfg.train.warmup_steps, max(0, self.total_steps - self.position.step - 1))
        self.sync = self.new_meter(StepMeter, self.images_per_step, self.total_steps, untimed).sync

        pos = self.position
        for epoch in range(pos.epoch, epochs):
            if epoch > pos.epoch:
                pos.epoch, pos.step_in_epoch = epoch, 0
            self.sampler.set_position(epoch, pos.step_in_epoch * accum * batch)
            batches = None
            while pos.step_in_epoch < self.steps_per_epoch and pos.step < self.total_steps:
                if batches is None:
                    batches = iter(self.train_loader)  # starts this epoch's loader workers
                if self._step(batches):
                    return
            batches = None  # stops them before the evaluation starts its own
            self._evaluate(epoch + 1)
        if self.cfg.checkpoint.at_end:
            self._save("end")

    def _step(self, batches) -> bool:
        """One optimizer step over `accumulation_steps` micro-batches; True when the run must stop."""
        import torch
        import torch.distributed as dist

        cfg, ft, world, strategy, pos = self.cfg, self.cfg.finetune, self.world, self.strategy, self.position
        accum = ft.accumulation_steps
        step = pos.step + 1
        lr = learning_rate(step, self.total_steps, cfg.train.lr, ft.lr_warmup_steps, ft.min_lr)
        strategy.set_lr(lr)
        self.meter.before_step()
        data_time = compute_time = 0.0
        loss_sum = torch.zeros((), dtype=torch.float32, device=world.device)
        for micro in range(accum):
            t0 = time.perf_counter()
            images, labels, _ = next(batches)
            images = images.to(world.device, non_blocking=True)
            labels = labels.to(world.device, non_blocking=True)
            self.sync()
            t1 = time.perf_counter()
            data_time += t1 - t0
            # gradients are synchronised once per optimizer step, on its last micro-batch
            with strategy.no_sync() if micro < accum - 1 else contextlib.nullcontext():
                loss = self.criterion(strategy.forward(images), labels)
                strategy.backward(loss / accum)
            loss_sum += loss.detach()
            self.sync()
            compute_time += time.perf_counter() - t1
        t2 = time.perf_counter()
        grad_norm = strategy.clip_grad_norm(ft.clip_grad_norm) if ft.clip_grad_norm > 0 else None
        strategy.optimizer_step()
        self.sync()
        compute_time += time.perf_counter() - t2
        loss_value = (loss_sum / accum).item()
        pos.step, pos.step_in_epoch = step, pos.step_in_epoch + 1
        warmup = self.meter.book(
            step,
            loss_value,
            data_time + compute_time,
            {
                "epoch": pos.epoch + 1,
                "lr": lr,
                "grad_norm": grad_norm,
                "step_time_s": compute_time,
                "data_time_s": data_time,
                "images_per_s": self.images_per_step / compute_time,
            },
            f"epoch {pos.epoch + 1}  lr {lr:.2e}  data {data_time * 1e3:6.1f} ms  "
            f"compute {compute_time * 1e3:7.1f} ms  "
            f"{self.images_per_step / (data_time + compute_time):9.1f} img/s",
        )
        if not warmup:
            self.data_times.append(data_time)

        if world.is_main and os.environ.get(TEST_SIGNAL_ENV) == str(step):
            self._signal_myself()
        # the ranks agree, every step, on whether to stop: a signal may reach only some of them
        received = self.signals.received is not None
        flags = torch.tensor(
            [int(received), int(not math.isfinite(loss_value))], dtype=torch.int32, device=world.device
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        signalled, diverged = bool(flags[0]), bool(flags[1])

        if diverged:
            self.diverged_at = step
            say(world, f"  loss is not finite at step {step}: stopping")
            return True
        if signalled:
            # the signal this rank received, or the usual one when it reached another rank only
            self.stop_signal = (self.signals.received if received else None) or signal.SIGUSR1
            say(
                world,
                f"  {signal.Signals(self.stop_signal).name if received else 'a signal on another rank'}: "
                f"stopping after step {step}",
            )
            if cfg.checkpoint.on_signal:
                self._save("signal")
            return True
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and step < self.total_steps:
            self._save("every_steps")
        return False

    def _signal_myself(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.time() + 10
        while self.signals.received is None and time.time() < deadline:
            time.sleep(0.01)  # the handler runs in this thread between bytecodes; give it the chance

    def _evaluate(self, epoch: int) -> None:
        from vit_scale.recipes.evaluate import evaluate

        t0 = time.perf_counter()
        result = evaluate(self.strategy, self.eval_loader, self.cfg.train.num_classes, self.world.device)
        seconds = time.perf_counter() - t0
        self.final_eval = result
        self.best_top1 = max(self.best_top1 or 0.0, result.top1)
        if self.recorder:
            self.recorder.event(
                "eval",
                {
                    "epoch": epoch,
                    "step": self.position.step,
                    "loss": result.loss,
                    "top1": result.top1,
                    "top5": result.top5,
                    "images": result.images,
                    "eval_time_s": seconds,
                },
            )
        say(
            self.world,
            f"  eval  epoch {epoch}  loss {result.loss:.4f}  top-1 {result.top1 * 100:6.2f}%  "
            f"top-5 {result.top5 * 100:6.2f}%  ({result.images} images, {seconds:.1f} s)",
        )

    def _save(self, reason: str) -> None:
        pos = self.position
        facts = {
            **_checkpoint_facts(self.cfg, self.world),
            "family": self.label.family,
            "reason": reason,
            "total_steps": self.total_steps,
            "classes": self.inputs.splits.classes,
            "sampler": {
                "epoch": pos.epoch,
                "start_sample_per_rank": pos.step_in_epoch
                * self.cfg.finetune.accumulation_steps
                * self.cfg.train.batch_size,
            },
        }
        t0 = time.perf_counter()
        self.saved = ckpt.save(self.strategy, self.checkpoint_dir, replace(pos), facts, self.cfg.checkpoint.keep)
        say(self.world, f"  checkpoint ({reason}) {self.saved} in {time.perf_counter() - t0:.1f} s")

    # ------------------------------------------------------------ the end

    def finish(self) -> EndRecord:
        """End record after train() returned (every rank, all still in step): ok, diverged or stopped."""
        import torch.distributed as dist

        from vit_scale.run.replicas import replica_checksums, replicas_agree

        stopped = self.stop_signal is not None
        self.meter.window_s()  # closes the memory window before the replica check allocates
        if not stopped:  # a stopped run has its signal's grace to spend on the checkpoint
            self.probe_nodes()
        checksums = None if stopped else replica_checksums(self.strategy, self.world.device)
        peaks = [None] * self.world.world_size
        dist.all_gather_object(peaks, self.meter.result().memory)
        agree = None if stopped else replicas_agree(checksums)
        status, error = "ok", None
        if stopped:
            name = signal.Signals(self.stop_signal).name
            status = "timeout"
            error = f"stopped by {name} after step {self.position.step} of {self.total_steps}; " + (
                f"checkpoint saved: {self.saved}; resume with checkpoint.resume=auto (or this path)"
                if self.saved and self.cfg.checkpoint.on_signal
                else "no checkpoint saved"
            )
        elif not agree:
            status, error = (
                "diverged",
                (
                    f"replicas differ at the end: parameter checksums "
                    f"{sorted({round(c[0], 6) for c in checksums})} across ranks"
                ),
            )
        elif self.diverged_at is not None:
            status, error = "diverged", f"loss was not finite at step {self.diverged_at}"
        end = self._end(status, error, None, peaks=peaks, replicas_agree=agree, replica_checksums=checksums)
        if self.world.is_main and self.final_eval is not None and self.cfg.finetune.confusion_matrix and not stopped:
            end.extra["files"] = self._write_eval_files()
        return end

    def _end(self, status: str, error, failed_rank, **figures) -> EndRecord:
        """The end record with fine-tuning's keys after the common ones (docs/run_record.md, "Fine-tuning runs")."""
        data = None
        if self.data_times:
            data = {
                "mean": statistics.fmean(self.data_times),
                "max": max(self.data_times),
                "fraction": sum(self.data_times) / sum(self.meter.result().step_times),
            }
        result = self.final_eval
        extra = {
            "step": self.position.step,
            "total_steps": self.total_steps,
            "epoch": self.position.epoch + 1,
            "data_time_s": data,
            "eval": (
                {"loss": result.loss, "top1": result.top1, "top5": result.top5, "images": result.images}
                if result
                else None
            ),
            "best_top1": self.best_top1,
            "checkpoint": self.saved,
            "lora": self.lora_facts,
            "resumed_from": (
                {"path": self.inputs.resume_path, "step": self.inputs.resume_meta["step"]}
                if self.inputs.resume_path
                else None
            ),
            "requeue": bool(
                self.stop_signal is not None and self.saved and self.cfg.checkpoint.on_signal and status == "timeout"
            ),
        }
        return self.end_record(status, error, failed_rank, extra=extra, **figures)

    def interrupted_end(self, status: str, error: str, failed_rank) -> EndRecord:
        return self._end(status, error, failed_rank)

    # ------------------------------------------------------------ the summary

    def summary_lines(self, end: EndRecord) -> list[str]:
        step = end.get("step")
        where = f" at step {step}/{end.get('total_steps')}" if step is not None else ""
        lines = [
            f"{self.command}: {self.cfg.model} {self.cfg.strategy} on {plural(self.world.world_size, 'rank')}: "
            f"{end.status.upper()}{where}"
        ]
        if end.get("eval"):
            e = end.get("eval")
            lines.append(
                f"  validation: top-1 {e['top1'] * 100:.2f}%  top-5 {e['top5'] * 100:.2f}%  "
                f"loss {e['loss']:.4f}  ({e['images']} images; best top-1 {end.get('best_top1') * 100:.2f}%)"
            )
        if end.get("lora"):
            f = end.get("lora")
            lines.append(
                f"  LoRA r={f['rank']}: {f['trainable_params']:,} of {f['total_params']:,} parameters trained "
                f"({100 * f['trainable_params'] / f['total_params']:.2f}%)"
            )
        data = end.get("data_time_s")
        if data:
            lines.append(
                f"  waiting for data: {data['fraction'] * 100:.1f}% of the step time"
                + ("  (input-bound: raise data.workers)" if data["fraction"] > 0.2 else "")
            )
        return lines

    def _write_eval_files(self) -> dict:
        from vit_scale.recipes.evaluate import plot_confusion, write_confusion_csv, write_per_class_csv

        classes = self.inputs.splits.classes
        files = {
            "confusion_matrix_csv": "confusion_matrix.csv",
            "confusion_matrix_png": "confusion_matrix.png",
            "per_class_accuracy_csv": "per_class_accuracy.csv",
        }
        write_confusion_csv(os.path.join(self.run_dir, files["confusion_matrix_csv"]), self.final_eval, classes)
        write_per_class_csv(os.path.join(self.run_dir, files["per_class_accuracy_csv"]), self.final_eval, classes)
        plot_confusion(
            os.path.join(self.run_dir, files["confusion_matrix_png"]),
            self.final_eval,
            classes,
            f"{self.cfg.model} {self.cfg.strategy}, step {self.position.step}",
        )
        return files


def check_inputs_of_strategy(cfg: Config, world: World, family) -> tuple:
    """The recipe's checks before any process group, for the strategy family `family` (its
    `Family`): what FinetuneRun takes besides cfg and world."""
    if not family.supports_finetune:
        from vit_scale.distributed import allowed_text, labels_where

        can = labels_where(lambda other, label: other.supports_finetune)
        raise UserError(
            f"strategy: {cfg.strategy} cannot fine-tune yet (the {family.name} strategy has no "
            f"fine-tuning support); allowed: {allowed_text(can)}"
        )
    lora.check(cfg, world, family)
    return (check_inputs(cfg, world),)


def main(argv=None) -> int:
    return session_main(FinetuneRun, sys.argv[1:] if argv is None else argv, _parse_args, check_inputs_of_strategy)


if __name__ == "__main__":
    sys.exit(main())
