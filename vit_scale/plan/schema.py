"""The JSON Schemas of `vit-scale plan --json` (docs/plan.md): a row, the prediction, the document."""

from __future__ import annotations

from vit_scale.distributed import FAMILIES
from vit_scale.planning import SCHEMA_VERSION

_NUM = {"type": "number"}
_GIB_PARTS = ("params", "grads", "optimizer", "in_flight", "activations", "buckets", "workspace", "allocator")
_COMM = {
    "type": "object",
    "required": ["intra", "inter"],
    "properties": {"intra": {"type": "integer", "minimum": 0}, "inter": {"type": "integer", "minimum": 0}},
}
ROW_SCHEMA = {
    "type": "object",
    "required": [
        "model",
        "params",
        "strategy",
        "family",
        "implementation",
        "sharding",
        "nodes",
        "gpus_per_node",
        "world_size",
        "shard_group_size",
        "replicate_group_size",
        "memory_gib",
        "peak_allocated_gib",
        "peak_allocated_phase",
        "components_gib",
        "allocator_gib",
        "peak_phase",
        "phases_gib",
        "device_memory_gib",
        "fits",
        "headroom_gib",
        "optimizer_impl",
        "communication",
        "notes",
    ],
    "properties": {
        "model": {"type": "string"},
        "params": {"type": "integer", "minimum": 1},
        "strategy": {"type": "string"},
        "family": {"enum": list(FAMILIES)},  # the registry's, in its order
        "implementation": {"type": "string"},
        "nodes": {"type": "integer", "minimum": 1},
        "gpus_per_node": {"type": "integer", "minimum": 1},
        "world_size": {"type": "integer", "minimum": 1},
        "shard_group_size": {"type": "integer", "minimum": 1},
        "replicate_group_size": {"type": "integer", "minimum": 1},
        "memory_gib": {"type": "number", "exclusiveMinimum": 0},
        "peak_allocated_gib": {"type": "number", "exclusiveMinimum": 0},
        "peak_active_gib": {"type": "number", "exclusiveMinimum": 0},
        "components_gib": {
            "type": "object",
            "required": list(_GIB_PARTS),
            "additionalProperties": False,
            "properties": {k: {"type": "number", "minimum": 0} for k in _GIB_PARTS},
        },
        "allocator_gib": {
            "type": "object",
            "required": ["runtime", "fragmentation", "stream_held"],
            "properties": {k: {"type": "number", "minimum": 0} for k in ("runtime", "fragmentation", "stream_held")},
        },
        "peak_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "peak_allocated_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "phases_gib": {
            "type": "object",
            "required": ["forward_end", "backward_start", "backward_end", "optimizer_step"],
        },
        "device_memory_gib": {"type": ["number", "null"]},
        "fits": {"type": ["boolean", "null"]},
        "headroom_gib": {"type": ["number", "null"]},
        "optimizer_impl": {"enum": ["foreach", "single", "fused"]},
        "communication": {
            "type": "object",
            "required": ["all_gather", "reduce_scatter", "all_reduce", "intra_node", "inter_node", "total"],
            "properties": {
                "all_gather": _COMM,
                "reduce_scatter": _COMM,
                "all_reduce": _COMM,
                "intra_node": {"type": "integer", "minimum": 0},
                "inter_node": {"type": "integer", "minimum": 0},
                "total": {"type": "integer", "minimum": 0},
            },
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        # with --system: vit_scale.planning.step_time.StepPrediction.as_dict
        "prediction": {
            "type": "object",
            "required": [
                "fits",
                "step",
                "images_per_s_per_gpu",
                "images_per_s",
                "scaling_efficiency",
                "rules",
                "compute_source",
                "network_source",
            ],
            "properties": {
                "step": {"type": ["object", "null"]},
                "images_per_s_per_gpu": {"type": ["number", "null"]},
                "images_per_s": {"type": ["number", "null"]},
                "scaling_efficiency": {"type": ["number", "null"]},
                "extrapolated": {"type": "boolean"},
                # the 90% band (vit_scale.planning.spread); null where no input carries a range
                **{
                    f"{name}_{side}": {"type": ["number", "null"]}
                    for name in ("images_per_s_per_gpu", "images_per_s", "step_s", "scaling_efficiency")
                    for side in ("low", "high")
                },
            },
        },
    },
}
PREDICTION_SCHEMA = {
    "type": "object",
    "required": ["system", "calibration", "compute", "not_worth_running", "rule"],
    "properties": {
        "system": {"type": "string"},
        "calibration": {
            "type": "object",
            "required": ["kind", "label", "source", "notes", "text"],
            "properties": {"kind": {"enum": ["check", "profile", "none"]}, "label": {"type": "string"}},
        },
        "compute": {
            "type": "object",
            "required": ["kind", "text"],
            "properties": {
                "kind": {"enum": ["measured", "check", "flops"]},
                "by_model": {"type": "object", "additionalProperties": {"type": "string"}},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
        },
        "not_worth_running": {"type": "array", "items": {"type": "object", "required": ["model", "strategy", "why"]}},
        "rule": {"type": "string"},
        "interval": {
            "type": "object",
            "required": ["level", "method", "text"],
            "properties": {
                "level": {"type": ["number", "null"]},
                "method": {"enum": ["bounds", None]},
                "text": {"type": "string"},
            },
        },
        "crossings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model", "strategy", "below", "value", "earliest", "latest", "largest", "text"],
                "properties": {
                    "value": {"type": ["integer", "null"]},
                    "earliest": {"type": "integer"},
                    "latest": {"type": ["integer", "null"]},
                },
            },
        },
    },
}
PLAN_SCHEMA = {
    "type": "object",
    "required": ["schema", "assumptions", "rows"],
    "properties": {
        "schema": {"const": SCHEMA_VERSION},
        "assumptions": {
            "type": "object",
            "required": [
                "batch_size",
                "precision",
                "activation_checkpointing",
                "attention",
                "gpus_per_node",
                "device_memory_gib",
                "optimizer",
                "allowance",
            ],
        },
        "rows": {"type": "array", "items": ROW_SCHEMA},
        "prediction": PREDICTION_SCHEMA,
    },
}
