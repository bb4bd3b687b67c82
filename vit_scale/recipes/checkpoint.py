"""Resumable fine-tuning checkpoints: save (every rank together), find, verify and load.

One checkpoint is one directory, `<checkpoint.dir>/step-<8 digits>/`:

    meta.json          what wrote it: model, strategy, step, epoch, sampler position, world size,
                       batch, seed, and the size and sha256 of every other file
    model and optimizer state, as the strategy writes it (`Strategy.save_state`; this module names
    no family): state.pt ("full": DDP, rank 0's whole state dicts), state/ ("sharded": FSDP,
    torch.distributed.checkpoint), engine/ (DeepSpeed's own save_checkpoint), booster/
    (ColossalAI's Booster save_model and save_optimizer)
    rank-<k>.pt        per rank: RNG states (torch, CUDA, python, numpy) and the fp16 loss scale

and `<checkpoint.dir>/latest` names the newest. Every rank writes into a hidden temporary
directory; only when all ranks report success does rank 0 write meta.json there and rename the
directory into place, so a save that fails (or is killed) never replaces or damages an existing
checkpoint, and a directory without meta.json is never mistaken for one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass

from vit_scale.errors import UserError

FORMAT_VERSION = 1
META = "meta.json"
LATEST = "latest"
STEP_DIR = re.compile(r"step-(\d{8})")
# files up to this size are hashed when a checkpoint is verified; bigger ones (sharded and engine
# checkpoints of large models) are checked by size, and their loaders report what they find
HASH_LIMIT_BYTES = 256 * 1024**2


def _failures() -> tuple:
    """What a failed save or load raises: DCP's CheckpointException (one rank's failure, raised on
    every rank) is a BaseException, so `except Exception` alone would let it through."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


@dataclass
class Position:
    """Where training stands: optimizer steps done, the epoch in progress (0-based) and how many
    of its optimizer steps are done (which fixes the sampler position)."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0


def step_name(step: int) -> str:
    return f"step-{step:08d}"


# ---------------------------------------------------------------- finding


def complete_checkpoints(directory: str) -> list[str]:
    """Checkpoint directories under `directory`, oldest first (only those with meta.json)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = sorted(n for n in names if STEP_DIR.fullmatch(n) and os.path.isfile(os.path.join(directory, n, META)))
    return [os.path.join(directory, n) for n in found]


def latest(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, LATEST)) as f:
            name = f.read().strip()
        if STEP_DIR.fullmatch(name) and os.path.isfile(os.path.join(directory, name, META)):
            return os.path.join(directory, name)
    except OSError:
        pass
    found = complete_checkpoints(directory)  # `latest` lost or stale: the highest complete step
    return found[-1] if found else None


def resolve_resume(resume: str, directory: str) -> str | None:
    """The checkpoint `checkpoint.resume` names: None for a fresh start."""
    if not resume:
        return None
    if resume == "auto":
        if not directory:
            raise UserError(
                "checkpoint.resume: auto needs checkpoint.dir (each run's own directory is new, so there "
                "is nothing to resume in it); set checkpoint.dir to a directory that outlives the job"
            )
        return latest(directory)  # nothing saved yet: the first run of a requeued job starts fresh
    if os.path.isfile(os.path.join(resume, META)):
        return resume
    if os.path.isdir(resume):
        found = latest(resume)
        if found:
            return found
        raise UserError(
            f"checkpoint.resume: {resume} holds no checkpoint (no {META} there, and no step-* "
            f"checkpoint directories inside)"
        )
    raise UserError(f"checkpoint.resume: no such checkpoint: {resume}")


# ---------------------------------------------------------------- verifying (before any process group)


def read_meta(path: str) -> dict:
    file = os.path.join(path, META)
    try:
        with open(file) as f:
            meta = json.load(f)
    except OSError as exc:
        raise UserError(f"checkpoint: cannot read {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(f"checkpoint: {file} is corrupt (not JSON: {exc})") from None
    needed = ("format_version", "model", "strategy", "step", "epoch", "step_in_epoch", "files")
    if not isinstance(meta, dict) or any(k not in meta for k in needed):
        raise UserError(f"checkpoint: {file} is corrupt or not a vit-scale checkpoint's (needs {', '.join(needed)})")
    if meta["format_version"] > FORMAT_VERSION:
        raise UserError(
            f"checkpoint: {file} has format version {meta['format_version']}; this vit-scale reads up to "
            f"{FORMAT_VERSION}"
        )
    return meta


def verify(path: str, meta: dict, expected: dict) -> None:
    """Refuse a checkpoint this run cannot continue from, naming the file and the difference.
    `expected` holds this run's model, strategy, world_size, batch_size, accumulation_steps,
    seed, num_classes and lora (recipes/lora.describe)."""
    file = os.path.join(path, META)
    if meta["model"] != expected["model"] or meta["strategy"] != expected["strategy"]:
        raise UserError(
            f"checkpoint: {file} is from model {meta['model']} under {meta['strategy']}; this run is "
            f"{expected['model']} under {expected['strategy']} (resume with the same model and strategy)"
        )
    # "none" for checkpoints written before LoRA existed, and for callers without adapters
    theirs, ours = meta.get("lora", "none"), expected.get("lora", "none")
    if theirs != ours:
        raise UserError(
            f"checkpoint: {file} holds LoRA adapters {theirs}; this run has {ours} (finetune.lora); "
            f"resume with the same adapters"
        )
    for name, facts in meta["files"].items():
        target = os.path.join(path, name)
        if not os.path.isfile(target):
            raise UserError(f"checkpoint: {target} is missing (the checkpoint is incomplete)")
        size = os.path.getsize(target)
        if size != facts["size"]:
            raise UserError(f"checkpoint: {target} is corrupt ({size} bytes, {facts['size']} when saved)")
        if facts.get("sha256") and size <= HASH_LIMIT_BYTES and _sha256(target) != facts["sha256"]:
            raise UserError(f"checkpoint: {target} is corrupt (its sha256 differs from the one recorded at save)")
    why = {
        "world_size": "ranks",
        "batch_size": "train.batch_size",
        "accumulation_steps": "finetune.accumulation_steps",
        "seed": "train.seed",
        "num_classes": "classes in the dataset",
    }
    for key, name in why.items():
        if key in meta and meta[key] != expected[key]:
            raise UserError(
                f"checkpoint: {file} was written with {meta[key]} {name}, this run has {expected[key]}; "
                f"the data order and the loss curve depend on it, so resume with {meta[key]}"
            )


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- saving (collective)


def save(strategy, directory: str, position: Position, facts: dict, keep: int) -> str:
    """Every rank calls this at the same step. Returns the checkpoint's path; raises (on every rank)
    if any rank failed, leaving existing checkpoints as they were."""
    import torch
    import torch.distributed as dist

    world = strategy.world
    name = step_name(position.step)
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp")
    if world.is_main:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        os.makedirs(tmp)
    dist.barrier()
    error = None
    try:
        torch.save(
            {"rng": _rng_state(world), "strategy": strategy.rank_state()},
            os.path.join(tmp, f"rank-{world.rank:05d}.pt"),
        )
        strategy.save_state(tmp)
    except _failures() as exc:  # reported to every rank below
        error = exc
    ok = _all_ranks_ok(error is None, world)
    if ok and world.is_main:
        try:
            _finalise(tmp, final, directory, name, position, facts, strategy, keep)
        except _failures() as exc:
            error, ok = exc, False
    ok = _all_ranks_ok(ok, world, src=0)
    if not ok:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        detail = f": {' '.join(str(error).split())[:500]}" if error else " on another rank"
        raise RuntimeError(f"saving checkpoint {final} failed{detail}; earlier checkpoints are untouched")
    return final


def _all_ranks_ok(ok: bool, world, src: int | None = None) -> bool:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=world.device)
    if src is None:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    else:
        dist.broadcast(flag, src=src)
    return bool(flag.item())


def _finalise(tmp, final, directory, name, position, facts, strategy, keep) -> None:
    files = {}
    for root, _, names in os.walk(tmp):
        for file in names:
            full = os.path.join(root, file)
            size = os.path.getsize(full)
            files[os.path.relpath(full, tmp)] = {
                "size": size,
                "sha256": _sha256(full) if size <= HASH_LIMIT_BYTES else None,
            }
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": "vit-scale fine-tuning checkpoint",
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "step": position.step,
        "epoch": position.epoch,
        "step_in_epoch": position.step_in_epoch,
        "checkpoint_format": strategy.checkpoint_format,
        "implementation": strategy.implementation,
        **facts,
        "files": files,
    }
    _write_durably(os.path.join(tmp, META), json.dumps(meta, indent=1) + "\n")
    if os.path.exists(final):
        # the same step saved again (e.g. a signal right after a resume): swap only now that the
        # new one is complete
        old = os.path.join(directory, f".{name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _write_durably(os.path.join(directory, LATEST + ".tmp"), name + "\n")
    os.replace(os.path.join(directory, LATEST + ".tmp"), os.path.join(directory, LATEST))
    _fsync_dir(directory)
    if keep:
        for path in complete_checkpoints(directory)[:-keep]:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)


def _write_durably(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not sync directories; the rename is still atomic
    finally:
        os.close(fd)


# ---------------------------------------------------------------- loading (collective)


def load(strategy, path: str, meta: dict) -> Position:
    """Restore model, optimizer, RNG states and loss scale on every rank; UserError names the file."""
    import torch

    world = strategy.world
    fmt = meta.get("checkpoint_format", strategy.checkpoint_format)
    if fmt != strategy.checkpoint_format:
        raise UserError(
            f"checkpoint: {os.path.join(path, META)} holds a {fmt} checkpoint; {strategy.label.label} "
            f"reads {strategy.checkpoint_format} ones"
        )
    file = strategy.state_path(path)
    with _names_file(file):
        strategy.load_state(path)
    file = os.path.join(path, f"rank-{world.rank:05d}.pt")
    with _names_file(file):
        rank_state = torch.load(file, map_location="cpu", weights_only=True)
        strategy.load_rank_state(rank_state.get("strategy", {}))
        _set_rng_state(rank_state["rng"], world)
    return Position(meta["step"], meta["epoch"], meta["step_in_epoch"])


class _names_file:
    """Any failure while reading a checkpoint file becomes a one-line error naming that file."""

    def __init__(self, file: str):
        self.file = file

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, UserError) or not isinstance(exc, _failures()):
            return False
        text = " ".join(str(exc).split())[:400] or type(exc).__name__
        raise UserError(
            f"checkpoint: cannot load {self.file} (corrupt, or not written for this model): {text}"
        ) from None


# ---------------------------------------------------------------- RNG states


def _rng_state(world) -> dict:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # as plain lists: checkpoints load with weights_only=True, which refuses numpy arrays
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
    }
    if world.device_type != "cpu":
        state["cuda"] = torch.cuda.get_rng_state(world.device)
    return state


def _set_rng_state(state: dict, world) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and world.device_type != "cpu":
        torch.cuda.set_rng_state(state["cuda"], world.device)
