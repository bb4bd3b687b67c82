"""The end record: the one shape every run's last line has, whichever way the run ended.

`EndRecord`'s fields are the keys every end record carries, in the order they are written; the
schema's required end keys (schema.py) are these fields' names. A recipe's own keys (the
benchmark's `compile` and `profile`, fine-tuning's position, evaluation and checkpoint) follow
them in `extra`, in the recipe's order. Torch-free: the analysis and the schema read it too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class EndRecord:
    status: str
    error: str | None = None
    failed_rank: int | None = None
    steps_done: int = 0
    timed_steps: int = 0
    wall_time_s: float | None = None
    images_per_s: dict | None = None
    images_per_s_per_device: float | None = None
    memory: dict | None = None
    tflops_per_device: float | None = None
    mfu: float | None = None
    replicas_agree: bool | None = None
    replica_checksums: list | None = None
    final_loss: float | None = None
    extra: dict = field(default_factory=dict)  # the recipe's own keys, written after the fields above

    def payload(self) -> dict:
        """What the recorder writes after `event` and `time`: the fields in order, then `extra`."""
        return {**{name: getattr(self, name) for name in END_KEYS}, **self.extra}

    def get(self, key: str, default=None):
        """A field or an extra key by name, as the summary lines read them."""
        if key in END_KEYS:
            return getattr(self, key)
        return self.extra.get(key, default)


END_KEYS = tuple(f.name for f in dataclasses.fields(EndRecord) if f.name != "extra")
