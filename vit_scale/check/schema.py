"""JSON Schema of check.json (version 1). docs/check.md carries it between its markers, and a test
fails when they differ; `python -m vit_scale.check.schema` prints it."""

from __future__ import annotations

import json

from vit_scale.check.collectives import COLLECTIVES, SIZE_NAMES
from vit_scale.check.lines import STATUSES
from vit_scale.record.schema import EMULATION_NODES

NUM = {"type": "number"}
NUM_OR_NULL = {"type": ["number", "null"]}
STR_OR_NULL = {"type": ["string", "null"]}
PRECISION = {"enum": ["fp32", "bf16", "fp16"]}

LINE = {
    "type": "object",
    "required": ["check", "status", "text", "fix", "needed"],
    "properties": {
        "check": {"type": "string"},
        "status": {"enum": list(STATUSES)},
        "text": {"type": "string"},
        "fix": {"type": "string"},
        "needed": {"type": "boolean"},
    },
}

MEASUREMENT = {
    "type": "object",
    "required": [
        "scope",
        "nodes",
        "collective",
        "size",
        "what",
        "ranks",
        "bytes",
        "precision",
        "iterations",
        "time_s",
        "algbw_gbs",
        "busbw_gbs",
        "correct",
    ],
    "properties": {
        "scope": {"enum": ["node", "world"]},
        "nodes": {"type": "integer", "minimum": 1},
        "collective": {"enum": list(COLLECTIVES)},
        "size": {"enum": list(SIZE_NAMES)},
        "ranks": {"type": "integer", "minimum": 2},
        "bytes": {"type": "integer", "minimum": 1},
        "precision": PRECISION,
        "iterations": {"type": "integer", "minimum": 1},
        # repeats: timed windows; time_s their median, spread_s half their range
        "repeats": {"type": "integer", "minimum": 1},
        "time_s": {"type": "number", "exclusiveMinimum": 0},
        "spread_s": {"type": "number", "minimum": 0},
        "algbw_gbs": NUM,
        "busbw_gbs": NUM,
        "correct": {"type": "boolean"},
    },
}

# a size the sweep left out: its buffers would not fit the memory bound, or it would run past the time budget
SKIPPED = {
    "type": "object",
    "required": ["scope", "collective", "size", "ranks", "bytes", "why"],
    "properties": {
        "scope": {"enum": ["node", "world"]},
        "collective": {"enum": list(COLLECTIVES)},
        "size": {"enum": list(SIZE_NAMES)},
        "bytes": {"type": "integer", "minimum": 1},
        "why": {"type": "string"},
    },
}

# vit_scale.planning.alpha_beta.Fit.as_dict(): t(S, n) = alpha + S f(n) / B per collective and scope
FIT = {
    "type": "object",
    "required": [
        "collective",
        "scope",
        "ranks",
        "alpha_us",
        "bus_gbps",
        "max_rel_residual",
        "sizes",
        "usable",
        "flags",
    ],
    "properties": {
        "collective": {"enum": list(COLLECTIVES)},
        "scope": {"enum": ["intra", "inter"]},
        "ranks": {"type": "integer", "minimum": 1},
        "alpha_us": {"type": "number", "minimum": 0},
        "bus_gbps": {"type": "number", "minimum": 0},
        "max_rel_residual": {"type": "number", "minimum": 0},
        "sizes": {"type": "integer", "minimum": 0},
        "usable": {"type": "boolean"},
        "flags": {"type": "array", "items": {"type": "string"}},
        "ranks_per_node": {"type": "integer", "minimum": 1},
        # standard errors from the size sweep's scatter (docs/plan.md, "How sure a prediction is")
        "alpha_us_se": {"type": "number", "minimum": 0},
        "bus_gbps_se": {"type": "number", "minimum": 0},
    },
    # a usable fit has no flags and a positive bandwidth
    "if": {"properties": {"usable": {"const": True}}},
    "then": {"properties": {"flags": {"maxItems": 0}, "bus_gbps": {"exclusiveMinimum": 0}}},
}

# vit_scale.planning.step_fit.StepFit.as_dict(): per collective and scope, from every group size,
# t = launch + intra_steps x alpha_intra + inter_steps x alpha_inter + S f(n) / B (step_latency_us: this scope's alpha)
STEP_FIT = {
    "type": "object",
    "required": [
        "collective",
        "scope",
        "step_latency_us",
        "launch_us",
        "bus_gbps",
        "groups",
        "largest_ranks",
        "max_rel_residual",
        "sizes",
        "usable",
        "flags",
        "notes",
    ],
    "properties": {
        "collective": {"enum": list(COLLECTIVES)},
        "scope": {"enum": ["intra", "inter"]},
        "step_latency_us": {"type": "number", "minimum": 0},
        "launch_us": {"type": "number", "minimum": 0},
        "bus_gbps": {"type": "number", "minimum": 0},
        "groups": {"type": "array", "items": {"type": "integer", "minimum": 2}, "minItems": 1},
        "largest_ranks": {"type": "integer", "minimum": 2},
        "max_rel_residual": {"type": "number", "minimum": 0},
        "sizes": {"type": "integer", "minimum": 0},
        "usable": {"type": "boolean"},
        "flags": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "ranks_per_node": {"type": "integer", "minimum": 1},
        "intra_latency_us": {"type": "number", "minimum": 0},
        # standard errors from the size sweep's scatter (docs/plan.md, "How sure a prediction is")
        "step_latency_us_se": {"type": "number", "minimum": 0},
        "launch_us_se": {"type": "number", "minimum": 0},
        "bus_gbps_se": {"type": "number", "minimum": 0},
    },
    "if": {"properties": {"usable": {"const": True}}},
    "then": {"properties": {"flags": {"maxItems": 0}, "bus_gbps": {"exclusiveMinimum": 0}}},
}

STRATEGY_ROW = {
    "type": "object",
    "required": ["label", "precision", "status", "error"],
    "properties": {
        "label": {"type": "string"},
        "precision": PRECISION,
        "status": {"enum": ["ok", "refused", "failed", "oom", "timeout", "diverged", "skipped"]},
        "error": STR_OR_NULL,
        "replicas_agree": {"type": ["boolean", "null"]},
        "images_per_s": NUM_OR_NULL,
        "steps": {"type": ["integer", "null"]},
        "run_dir": STR_OR_NULL,
        # the longest collective timeout among the world's group and the groups the label made
        "collective_timeout_s": NUM_OR_NULL,
    },
}

RANK = {
    "type": "object",
    "required": [
        "rank",
        "node",
        "local_rank",
        "device_type",
        "device_index",
        "device_name",
        "device_id",
        "visible_devices",
        "cpus",
    ],
    "properties": {
        "rank": {"type": "integer", "minimum": 0},
        "node": {"type": "string"},
        "device_type": {"enum": ["cpu", "cuda", "rocm"]},
        "visible_devices": {"type": "object"},
    },
}

METER = {
    "type": "object",
    "oneOf": [
        {"required": ["error", "settings"]},
        {
            "required": [
                "settings",
                "strategy",
                "device_type",
                "bare_images_per_s",
                "trainer_images_per_s",
                "ratio",
                "event_step_s",
                "host_step_s",
                "steps_compared",
                "timing_difference",
                "predicted_peak_gib",
                "measured_peak_gib",
                "memory_error",
            ],
            "properties": {
                "ratio": {"type": "number", "exclusiveMinimum": 0},
                "timing_difference": NUM,
                "predicted_peak_gib": NUM_OR_NULL,
                "measured_peak_gib": NUM_OR_NULL,
                "memory_error": NUM_OR_NULL,
            },
        },
    ],
}

# vit_scale.check.gemms: one Block's GEMMs timed at a model's shapes, batch and precision
GEMM = {
    "type": "object",
    "required": ["op", "pass", "batch", "m", "k", "n", "flops", "seconds", "tflops"],
    "properties": {
        "pass": {"enum": ["forward", "backward"]},
        "batch": {"type": "integer", "minimum": 1},
        "flops": {"type": "number", "exclusiveMinimum": 0},
        "seconds": {"type": "number", "exclusiveMinimum": 0},
        "tflops": NUM,
    },
}
COMPUTE = {
    "type": ["object", "null"],
    "required": ["entries", "error"],
    "properties": {
        "device": {"type": "string"},
        "timer": {"type": "string"},
        "error": STR_OR_NULL,
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model", "precision", "batch_size", "ops", "flops", "seconds", "achieved_tflops"],
                "properties": {
                    "precision": PRECISION,
                    "batch_size": {"type": "integer", "minimum": 1},
                    "ops": {"type": "array", "items": GEMM, "minItems": 1},
                    "achieved_tflops": NUM,
                    "peak_tflops": NUM_OR_NULL,
                    "efficiency": NUM_OR_NULL,
                },
            },
        },
    },
}

FACTS = {
    "type": "object",
    "properties": {
        "fatal": {"type": "string"},
        "parts_done": {
            "type": "array",
            "items": {"enum": ["meter", "compute", "environment", "nodes", "interconnect", "strategies"]},
        },
        "world": {
            "type": "object",
            "required": ["world_size", "nodes", "ranks_per_node", "backend", "device_type"],
            "properties": {"backend": {"enum": ["nccl", "gloo"]}, "collective_timeout_s": NUM_OR_NULL},
        },
        "versions": {"type": "object", "required": ["python", "torch", "cuda", "hip", "nccl", "driver"]},
        "modules": {"type": "array", "items": {"type": "string"}},
        "ranks": {"type": "array", "items": RANK},
        "kernels": {"type": "array", "items": {"type": "object", "required": ["node"]}},
        "interconnect": {
            "type": "object",
            "required": ["model", "measurements", "error"],
            "properties": {
                "measurements": {"type": "array", "items": MEASUREMENT},
                "skipped": {"type": "array", "items": SKIPPED},
                "budget_s": NUM,
                "error": STR_OR_NULL,
            },
        },
        "strategies": {"type": "array", "items": STRATEGY_ROW},
        "meter": METER,
    },
}

CHECK_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "check.json of vit-scale check",
    "type": "object",
    "required": [
        "schema",
        "tool",
        "time_iso",
        "system",
        "backend",
        "nodes",
        "ranks_per_node",
        "precisions",
        "model",
        "quick",
        "labels",
        "expected_transport",
        "slurm",
        "launch",
        "transport",
        "facts",
        "lines",
        "ok",
        "exit_code",
        "step_fits",
    ],
    "properties": {
        "schema": {"const": 2},
        "tool": {"type": "string"},
        "time_iso": {"type": "string"},
        "system": {"type": "string"},
        "backend": {"enum": ["nccl", "gloo"]},
        "nodes": {"type": "integer", "minimum": 1},
        "ranks_per_node": {"type": "integer", "minimum": 1},
        "precisions": {"type": "array", "items": PRECISION, "minItems": 1},
        "model": {"type": "string"},
        "quick": {"type": "boolean"},
        "labels": {"type": "array", "items": {"type": "object", "required": ["label", "precision", "needed"]}},
        "expected_transport": {"type": "array", "items": {"enum": ["ib", "ofi", "socket", "tcp"]}},
        "slurm": {"type": ["object", "null"]},
        "launch": {
            "type": "object",
            "required": ["kind", "description", "attempts"],
            "properties": {
                "attempts": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "object", "required": ["attempt", "parts", "labels", "code", "seconds", "log"]},
                }
            },
        },
        "transport": {
            "type": "object",
            "required": ["backend", "observed", "expected", "source", "evidence"],
            "properties": {"observed": {"type": "array", "items": {"type": "string"}}},
        },
        "facts": FACTS,
        # optional: emulated nodes (a check before per-node overrides has none); null on real nodes
        "emulation": {
            "type": ["object", "null"],
            "required": ["kind", "nodes"],
            "properties": {
                "kind": {"enum": ["isolated", "shared"]},
                "description": {"type": "string"},
                "nodes": EMULATION_NODES,
            },
        },
        # optional: the nodes part (vit_scale.check.nodes); null when it did not run, absent before it existed
        "per_node": {
            "type": ["object", "null"],
            "properties": {
                "error": {"type": "string"},
                "hosts": {"type": "object", "additionalProperties": {"type": "object"}},
                "median": {"type": "object", "additionalProperties": NUM},
                "pairs": {
                    "type": "array",
                    "items": {"type": "object", "required": ["round", "nodes", "link_gbps", "spread_gbps"]},
                },
                "slow": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["node", "figure", "value", "median", "share"],
                        "properties": {"figure": {"enum": ["compute", "link"]}},
                    },
                },
                "exclude": {"type": "string"},
                "undecidable": {"type": "array", "items": {"type": "string"}},
                # the suspected links retested, each [suspect, healthy partner]; the retest's figures are the
                # suspect's link_confirm_gbps, link_confirm_spread_gbps and link_confirm_partner in `hosts`
                "retested": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
            },
        },
        "parts": {
            "type": "array",
            "items": {"enum": ["meter", "compute", "environment", "nodes", "interconnect", "strategies"]},
        },
        "fits": {"type": "array", "items": FIT},
        # optional: a check written before the GEMMs were timed has none
        "compute": COMPUTE,
        "step_fits": {"type": "array", "items": STEP_FIT},
        "lines": {"type": "array", "items": LINE, "minItems": 1},
        "ok": {"type": "boolean"},
        "exit_code": {"enum": [0, 1]},
    },
    # the verdict and the lines agree: ok exactly when no needed line failed or was refused
    "if": {"properties": {"ok": {"const": True}}},
    "then": {
        "properties": {
            "exit_code": {"const": 0},
            "lines": {
                "items": {
                    "not": {
                        "properties": {"needed": {"const": True}, "status": {"enum": ["fail", "refused"]}},
                        "required": ["needed", "status"],
                    }
                }
            },
        }
    },
    "else": {"properties": {"exit_code": {"const": 1}}},
}


def text() -> str:
    """The schema as docs/check.md carries it: what fits in a line stays on one."""
    return compact(CHECK_SCHEMA, 0)


def compact(value, indent: int, width: int = 110) -> str:
    flat = json.dumps(value)
    if len(flat) + indent <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        rows, row = [], []
        for item in map(json.dumps, value):  # scalars: as many a line as fit
            if row and len(pad) + len(", ".join(row + [item])) > width:
                rows.append(", ".join(row))
                row = []
            row.append(item)
        rows.append(", ".join(row))
        return "[\n" + ",\n".join(pad + r for r in rows) + "\n" + " " * indent + "]"
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {compact(v, indent + 2, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + compact(v, indent + 2, width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


if __name__ == "__main__":
    print(text())
