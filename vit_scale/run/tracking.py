"""tracking.backend: the run's figures also sent to TensorBoard or W&B, by rank 0, as its record is
written (loss and images/s each step, evaluation metrics of fine-tuning, the end summary with
memory and MFU). The record stays the source of truth; a tracker that fails mid-run is dropped with
one warning, never the run."""

from __future__ import annotations

import sys

from vit_scale.errors import UserError

INSTALL = {"tensorboard": "pip install 'vit-scale[tensorboard]'", "wandb": "pip install 'vit-scale[wandb]'"}


def check(cfg) -> None:
    """Before anything starts: the backend's package is there, or one line naming it."""
    backend = cfg.tracking.backend
    if backend == "none":
        return
    import importlib.util

    if importlib.util.find_spec(backend) is None:
        raise UserError(
            f"tracking.backend: {backend} needs the {backend} package, which is not installed; "
            f"{INSTALL[backend]}, or tracking.backend=none"
        )


class Tracker:
    """Turns record lines into tracked scalars; `write(event, payload)` is a RunRecorder listener."""

    def __init__(self, cfg, run_dir: str, run_id: str):
        self.backend = cfg.tracking.backend
        if self.backend == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=run_dir)
        else:
            import wandb

            self.run = wandb.init(
                project=cfg.tracking.project,
                name=run_id,
                dir=run_dir,
                mode=cfg.tracking.wandb_mode,
                config=cfg.to_dict(),
            )

    def _scalars(self, step: int, values: dict) -> None:
        values = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not values:
            return
        if self.backend == "tensorboard":
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)
        else:
            self.run.log(values, step=step)

    def write(self, event: str, payload: dict) -> None:
        try:
            if event == "step":
                self._scalars(
                    payload["step"],
                    {
                        "train/loss": payload.get("loss"),
                        "train/images_per_s": payload.get("images_per_s"),
                        "train/lr": payload.get("lr"),
                    },
                )
            elif event == "eval":
                self._scalars(payload["step"], {f"eval/{k}": payload.get(k) for k in ("loss", "top1", "top5")})
            elif event == "end":
                memory = payload.get("memory") or {}
                peak = next((memory[k]["max"] for k in ("peak_allocated_gib", "peak_rss_gib") if memory.get(k)), None)
                stats = payload.get("images_per_s")
                ips = stats.get("mean") if isinstance(stats, dict) else None
                self._scalars(
                    payload.get("steps_done") or 0,
                    {
                        "end/images_per_s": ips,
                        "end/peak_memory_gib": peak,
                        "end/mfu": payload.get("mfu"),
                        "end/final_loss": payload.get("final_loss"),
                    },
                )
                self.close()
        except Exception as exc:  # the record has it all; a tracker must never end a run
            print(
                f"vit-scale: warning: tracking.backend={self.backend} failed ({type(exc).__name__}: {exc}); "
                f"the run goes on without it",
                file=sys.stderr,
                flush=True,
            )
            self.backend = "broken"

    def close(self) -> None:
        if self.backend == "tensorboard":
            self.writer.close()
        elif self.backend == "wandb":
            self.run.finish()
