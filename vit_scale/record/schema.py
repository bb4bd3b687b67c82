"""JSON Schema of the run record (docs/run_record.md), used by the tests to check every record
they make, and available to users who write their own readers."""

from __future__ import annotations

from vit_scale.record.end import END_KEYS
from vit_scale.record.writer import STATUSES

NUM = {"type": ["number", "null"]}
# emulated nodes' own link rate and CPU share, by host (vit_scale.cluster.emulation; check.json has them too)
EMULATION_NODES = {
    "type": "object",
    "propertyNames": {"pattern": "^local(0|[1-9][0-9]*)$"},
    "additionalProperties": {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "inter_node_gbps": {"type": "number", "exclusiveMinimum": 0},
            "cpus_per_node": {"type": "number", "exclusiveMinimum": 0},
        },
    },
}
STR = {"type": ["string", "null"]}
STATS = {
    "type": ["object", "null"],
    "required": ["mean", "std", "min", "max", "median"],
    "properties": {k: {"type": "number"} for k in ("mean", "std", "min", "max", "median")},
}
OVER_RANKS = {
    "type": "object",
    "required": ["max", "mean", "per_rank"],
    "properties": {
        "max": {"type": "number"},
        "mean": {"type": "number"},
        "per_rank": {"type": "array", "items": {"type": "number"}},
    },
}

START = {
    "type": "object",
    "required": [
        "event",
        "time",
        "schema",
        "run_id",
        "study",
        "time_iso",
        "config",
        "model",
        "strategy",
        "world",
        "batch",
        "launcher",
        "slurm",
        "hosts",
        "versions",
        "git_revision",
        "plan",
    ],
    "properties": {
        "event": {"const": "start"},
        "time": {"type": "number"},
        "schema": {"const": 1},
        "run_id": {"type": "string"},
        "study": {"type": "string"},
        "config": {"type": "object", "required": ["model", "strategy", "train"]},
        "model": {
            "type": "object",
            "required": [
                "name",
                "params",
                "flops_per_image",
                "img_size",
                "patch_size",
                "embed_dim",
                "depth",
                "num_heads",
                "mlp_dim",
                "num_classes",
            ],
            "properties": {
                "params": {"type": "integer", "minimum": 1},
                "flops_per_image": {"type": "integer", "minimum": 1},
            },
        },
        "strategy": {
            "type": "object",
            "required": [
                "label",
                "family",
                "implementation",
                "shard_group_size",
                "replicate_group_size",
                "options",
                "notes",
            ],
            "properties": {
                # a family's name; which ones exist is the registry's (vit_scale.distributed.FAMILIES),
                # which this layer cannot import: validate_record_file(path, families=...) checks it
                "family": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                "options": {"type": "object"},
                "notes": {"type": "array"},
            },
        },
        "world": {
            "type": "object",
            "required": [
                "world_size",
                "nodes",
                "ranks_per_node",
                "device_type",
                "device_name",
                "device_memory_gib",
                "backend",
                "peak_tflops_per_device",
                "peak_tflops_source",
            ],
            "properties": {
                "world_size": {"type": "integer", "minimum": 1},
                "nodes": {"type": "integer", "minimum": 1},
                "emulation": {"enum": ["isolated", "shared", None]},
                # host -> its own link rate and CPU share (docs/run_record.md); absent from older records
                "emulation_nodes": {**EMULATION_NODES, "type": ["object", "null"]},
                "device_type": {"enum": ["cuda", "rocm", "cpu"]},
                "backend": {"enum": ["nccl", "gloo"]},
                "peak_tflops_per_device": NUM,
                "device_memory_gib": NUM,
            },
        },
        "batch": {"type": "object", "required": ["per_device", "global"]},
        "launcher": {"enum": ["torchrun", "srun", "mpi", "single"]},
        "slurm": {"type": ["object", "null"]},
        "hosts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "versions": {
            "type": "object",
            "required": ["python", "torch", "timm", "deepspeed", "colossalai", "cuda", "hip", "nccl"],
        },
        "git_revision": STR,
        "python_environments": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["python_prefix", "vit_scale_dir", "ranks"],
                "properties": {"ranks": {"type": "integer", "minimum": 1}},
            },
        },
        "plan": {"type": ["object", "null"]},
    },
}

STEP = {
    "type": "object",
    "required": ["event", "time", "step", "loss", "step_time_s", "images_per_s", "warmup"],
    "properties": {
        "event": {"const": "step"},
        "step": {"type": "integer", "minimum": 1},
        "loss": NUM,
        "step_time_s": {"type": "number", "exclusiveMinimum": 0},
        "images_per_s": {"type": "number", "exclusiveMinimum": 0},
        "warmup": {"type": "boolean"},
    },
}

END = {
    "type": "object",
    "required": ["event", "time", *END_KEYS],
    "properties": {
        "event": {"const": "end"},
        "status": {"enum": list(STATUSES)},
        "error": STR,
        "failed_rank": {"type": ["integer", "null"]},
        "steps_done": {"type": "integer", "minimum": 0},
        "timed_steps": {"type": "integer", "minimum": 0},
        "wall_time_s": NUM,
        "images_per_s": STATS,
        "images_per_s_per_device": NUM,
        "memory": {
            "type": ["object", "null"],
            "required": ["device_kind", "window"],
            "properties": {
                "device_kind": {"enum": ["cuda", "rocm", "cpu"]},
                "window": {"enum": ["timed_steps", "whole_run"]},
                "peak_allocated_gib": OVER_RANKS,
                "peak_reserved_gib": OVER_RANKS,
                "peak_active_gib": OVER_RANKS,
                "peak_rss_gib": OVER_RANKS,
            },
        },
        "tflops_per_device": NUM,
        "mfu": NUM,
        "replicas_agree": {"type": ["boolean", "null"]},
        "replica_checksums": {"type": ["array", "null"]},
        "final_loss": NUM,
        # where the run's wall time went (vit_scale/run/ending.py time_split); records before it lack it
        "time_split": {
            "type": ["object", "null"],
            "required": ["launched_at", "startup_s", "warmup_s", "timed_s", "rest_s", "wall_s"],
            "properties": {k: NUM for k in ("launched_at", "startup_s", "warmup_s", "timed_s", "rest_s", "wall_s")},
        },
        "compile": {
            "type": ["object", "null"],
            "required": ["first_step_s", "graphs", "graphs_in_window", "recompiled_in_window"],
        },
        # after the timed window, each node's probe figures (vit_scale.run.health, vit_scale.record.health)
        "nodes_health": {
            "type": ["object", "null"],
            "required": ["hosts", "median", "probe", "error"],
            "properties": {
                "hosts": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["gemm_tflops", "copy_gbps", "ranks", "slowest_rank", "error"],
                        "properties": {
                            "gemm_tflops": NUM,
                            "copy_gbps": NUM,
                            "ranks": {"type": "integer", "minimum": 1},
                            "slowest_rank": {"type": ["integer", "null"]},
                            "error": STR,
                        },
                    },
                },
                "median": {"type": "object", "properties": {"gemm_tflops": NUM, "copy_gbps": NUM}},
                "probe": {"type": ["object", "null"]},
                "error": STR,
            },
        },
        # fine-tuning with finetune.lora.rank > 0
        "lora": {
            "type": ["object", "null"],
            "required": [
                "rank",
                "alpha",
                "dropout",
                "targets",
                "adapted_layers",
                "trainable_params",
                "total_params",
                "peft",
            ],
            "properties": {
                "trainable_params": {"type": "integer", "minimum": 1},
                "total_params": {"type": "integer", "minimum": 1},
            },
        },
    },
    # an ok run has every figure
    "if": {"properties": {"status": {"const": "ok"}}},
    "then": {
        "properties": {
            "images_per_s": {"type": "object"},
            "memory": {"type": "object"},
            "replicas_agree": {"const": True},
            "error": {"type": "null"},
        }
    },
}

EVAL = {
    "type": "object",
    "required": ["event", "time", "epoch", "step", "loss", "top1", "top5", "images"],
    "properties": {
        "event": {"const": "eval"},
        "epoch": {"type": "integer", "minimum": 1},
        "step": {"type": "integer", "minimum": 0},
        "loss": {"type": "number", "minimum": 0},
        "top1": {"type": "number", "minimum": 0, "maximum": 1},
        "top5": {"type": "number", "minimum": 0, "maximum": 1},
        "images": {"type": "integer", "minimum": 1},
    },
}

BY_EVENT = {"start": START, "step": STEP, "end": END, "eval": EVAL}


def validate_record_file(path: str, families=None) -> list[dict]:
    """Validate every line of a metrics.jsonl; returns the records. Needs the `jsonschema` package.
    `families`: the family names a start record may carry (e.g. vit_scale.distributed.FAMILIES);
    None: any name of the schema's form."""
    import json

    import jsonschema

    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            record = json.loads(line)
            schema = BY_EVENT.get(record.get("event"))
            if schema is None:
                raise ValueError(f"{path}:{number}: unknown event {record.get('event')!r}")
            try:
                jsonschema.validate(record, schema)
            except jsonschema.ValidationError as exc:
                raise ValueError(f"{path}:{number}: {exc.message}") from None
            records.append(record)
    if not records or records[0]["event"] != "start":
        raise ValueError(f"{path}: the first record must be 'start'")
    family = records[0]["strategy"]["family"]
    if families is not None and family not in families:
        raise ValueError(
            f"{path}:1: strategy.family {family!r} is not a registered family; allowed: {', '.join(families)}"
        )
    ends = [r for r in records if r["event"] == "end"]
    if len(ends) > 1 or (ends and records[-1]["event"] != "end"):
        raise ValueError(f"{path}: at most one 'end' record, and it must be last")
    return records
