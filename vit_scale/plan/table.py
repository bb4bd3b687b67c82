"""The plan as text: by default the columns a user chooses by, under 120 characters; with --wide the
memory's components, the communication per step and the predicted step's split."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

GB = 1e9
TABLE_WIDTH = 119  # the prose around the table is wrapped to this; the default columns stay under it
PHASE_SHORT = {"forward_end": "fwd", "backward_start": "bwd-1st", "backward_end": "bwd-end", "optimizer_step": "step"}
NOT_FIT_CELL = "does not fit"


def _f(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _rate(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _memory(gib) -> str:
    return "device memory not known" if gib is None else f"{gib:g} GiB/device"


def _step(row: dict) -> dict | None:
    """The row's predicted step, or None where there is none (no --system, or it does not fit)."""
    p = row.get("prediction")
    return None if not p or p["fits"] is False or p["step"] is None else p["step"]


def _banded(name: str, fmt: Callable, value: Callable) -> Callable[[dict], str]:
    """`value (low-high)` where the point has a band, else the value alone."""

    def cell(r: dict) -> str:
        p = r["prediction"]
        text = fmt(value(r))
        if p.get(f"{name}_low") is None:
            return text
        low, high = fmt(p[f"{name}_low"]), fmt(p[f"{name}_high"])
        if low == high:
            return text
        return f"{text} ({low.rstrip('%') if high.endswith('%') else low}-{high})"

    return cell


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _predicted(cell):
    """A predicted column's cell: blank where the point has no predicted step."""
    return lambda r: "" if _step(r) is None else cell(r)


@dataclass(frozen=True)
class Column:
    """One column of the table: its header, width and cell; `wide`: only with --wide; `predicted`: only
    with --system."""

    name: str
    width: int
    cell: Callable[[dict], str]
    wide: bool = False
    predicted: bool = False
    unpredicted: bool = False  # shown by default without --system: bytes are then all there is to choose by


def _component(name: str) -> Callable[[dict], str]:
    return lambda r: _f(r["components_gib"][name])


COLUMNS = [
    Column("strategy", 18, lambda r: r["strategy"]),
    Column("nodes", 5, lambda r: str(r["nodes"])),
    Column("GPUs", 5, lambda r: str(r["world_size"])),
    Column("params", 7, _component("params"), wide=True),
    Column("grads", 7, _component("grads"), wide=True),
    Column("optim", 7, _component("optimizer"), wide=True),
    Column("act", 7, _component("activations"), wide=True),
    Column("in-fl", 6, _component("in_flight"), wide=True),
    Column("bufs", 6, _component("buckets"), wide=True),
    Column("work", 6, _component("workspace"), wide=True),
    Column("alloc", 6, _component("allocator"), wide=True),
    Column("mem GiB", 7, lambda r: _f(r["memory_gib"])),
    Column("fits", 4, lambda r: {True: "yes", False: "NO", None: "?"}[r["fits"]]),
    Column("peak at", 7, lambda r: PHASE_SHORT[r["peak_phase"]], wide=True),
    Column("intra", 7, lambda r: _f(r["communication"]["intra_node"] / GB), wide=True, unpredicted=True),
    Column("inter", 7, lambda r: _f(r["communication"]["inter_node"] / GB), wide=True, unpredicted=True),
    # the first predicted column carries "does not fit" for a point with no predicted step
    Column(
        "step ms",
        8,
        lambda r: NOT_FIT_CELL if _step(r) is None else _banded("step_s", _ms, lambda r: _step(r)["step_s"])(r),
        predicted=True,
    ),
    Column("comp", 7, _predicted(lambda r: _ms(_step(r)["forward_s"] + _step(r)["backward_s"])), True, True),
    Column("x-intra", 7, _predicted(lambda r: _ms(_step(r)["exposed_intra_s"])), True, True),
    Column("x-inter", 7, _predicted(lambda r: _ms(_step(r)["exposed_inter_s"])), True, True),
    Column(
        "optim",
        6,
        _predicted(lambda r: "-" if _step(r)["optimizer_s"] is None else _ms(_step(r)["optimizer_s"])),
        True,
        True,
    ),
    Column(
        "img/s/GPU",
        9,
        _predicted(_banded("images_per_s_per_gpu", _rate, lambda r: r["prediction"]["images_per_s_per_gpu"])),
        predicted=True,
    ),
    Column("img/s", 9, _predicted(lambda r: _rate(r["prediction"]["images_per_s"])), predicted=True),
    Column(
        "eff",
        5,
        _predicted(
            lambda r: (
                ""
                if r["prediction"]["scaling_efficiency"] is None
                else _banded("scaling_efficiency", _pct, lambda r: r["prediction"]["scaling_efficiency"])(r)
            )
        ),
        predicted=True,
    ),
    # beyond the largest group any fit or default saw: the model's reach, not a measurement's
    Column("extrap", 6, lambda r: "yes" if (r.get("prediction") or {}).get("extrapolated") else "", predicted=True),
]


# with a band, a cell reads `value (low-high)`: these columns widen to hold it (the default table stays
# under 120 characters)
BANDED_WIDTHS = {"step ms": 16, "img/s/GPU": 17, "eff": 12}


def columns_for(predicted: bool, wide: bool, banded: bool = False) -> list[Column]:
    shown = [c for c in COLUMNS if predicted or not c.predicted]
    shown = [c for c in shown if wide or not c.wide or (c.unpredicted and not predicted)]
    if banded:
        shown = [dataclasses.replace(c, width=BANDED_WIDTHS.get(c.name, c.width)) for c in shown]
    return shown


def _line(cells: list, columns: list) -> str:
    return "  ".join(
        cell.rjust(c.width) if i > 0 else cell.ljust(c.width)
        for i, (cell, c) in enumerate(zip(cells, columns, strict=True))
    ).rstrip()


def _wrap(text: str, indent: str = "") -> list:
    return textwrap.wrap(
        text, TABLE_WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    ) or [""]


def prediction_head(prediction: dict) -> list:
    """The output's first lines: which calibration and which compute the prediction used."""
    return [
        *_wrap(f"predicted for {prediction['system']}: calibration: {prediction['calibration']['text']}", "  "),
        *_wrap(f"predicted compute: {prediction['compute']['text']}", "  "),
    ]


def _assumptions(a: dict) -> list:
    al = a["allowance"]
    lines = _wrap(
        f"batch {a['batch_size']}/device, {a['precision']}, activation checkpointing "
        f"{'on' if a['activation_checkpointing'] else 'off'}, {a['attention']} attention, "
        f"{a['gpus_per_node']} {a['device']} GPUs/node, {_memory(a['device_memory_gib'])}, AdamW {a['optimizer']}; "
        f"FSDP{a['fsdp']['version']} prefetch={a['fsdp']['backward_prefetch']} "
        f"limit_all_gathers={'on' if a['fsdp']['limit_all_gathers'] else 'off'}",
        "  ",
    )
    for strategy, error in a.get("refused", {}).items():
        lines += _wrap(f"left out: {strategy} ({error.split(': ', 1)[1]})", "  ")
    lines += _wrap(
        f"allocator allowance: {al['runtime_gib']:g} GiB runtime + {al['fragmentation']:.0%} of the peak"
        f"{' + memory held for communication streams' if al['stream_held'] else ''}"
        f"{_workspace(al['blas_workspace_mib'], a['device'])}",
        "  ",
    )
    return lines


def _workspace(mib: float, device: str) -> str:
    return f"; a GEMM's BLAS workspace {mib:g} MiB ({device}'s default) in the workspace column" if mib else ""


def _legend(predicted: bool, wide: bool) -> list:
    """What the columns mean, for the columns shown."""
    memory = (
        "params/grads/optim: what the rank holds (optim: AdamW states + a separate fp32 master where kept); act: "
        "activations and input batches; in-fl: unsharded units / gathered or cast parameters in flight; bufs: "
        "communication buckets; work: backward and optimizer temporaries; alloc: allocator allowance; mem GiB = "
        "their sum, against the device memory; components are those of the step's peak (peak at: end of forward, first "
        "or last block of the backward, optimizer step). intra/inter: GB sent per device per step inside a node / "
        "across nodes."
        if wide
        else "mem GiB: memory per device at the step's peak, against the device memory"
        + ("" if predicted else "; intra/inter: GB sent per device per step inside a node / across nodes")
        + " (its components"
        + (", the communication per step and the step's split" if predicted else "")
        + ": --wide; everything: --json)."
    )
    out = _wrap(f"{memory} Assumptions: docs/plan.md")
    if predicted:
        split = (
            "step ms = comp (forward + backward) + x-intra + x-inter (communication compute does not hide, inside a "
            "node / across nodes) + optim (-: not modelled, inside comp); "
            if wide
            else "step ms: the predicted step; "
        )
        out += _wrap(
            f"predicted: {split}img/s/GPU = batch / step; img/s: all GPUs; eff: img/s/GPU against the baseline "
            "node count's (1 node, or the fewest a group wider than a node fits on); extrap: yes where the point "
            "has more ranks than any collective measurement or default the calibration rests on. Model: "
            'docs/plan.md, "Predicted step time"'
        )
    return out


def format_table(rows: list[dict], shared: dict, prediction: dict | None = None, wide: bool = False) -> str:
    """The plan as text: by default the columns a user chooses by (under TABLE_WIDTH characters),
    with `wide` also the memory's components, the communication per step and the step's split."""
    out = prediction_head(prediction) if prediction else []
    out += _assumptions(shared)
    banded = any((r.get("prediction") or {}).get("step_s_low") is not None for r in rows)
    columns = columns_for(prediction is not None, wide, banded)
    header = _line([c.name for c in columns], columns)
    by_model: dict = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    unit = "memory per device in GiB" + (", communication per step per device in GB" if wide or not prediction else "")
    for model, model_rows in by_model.items():
        params = model_rows[0]["params"]
        size = f"{params / 1e9:.3f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        out += ["", f"{model}: {size} parameters — {unit}", header, "-" * len(header)]
        out += [_line([c.cell(r) for c in columns], columns) for r in model_rows]
    out += [""] + _legend(prediction is not None, wide)
    if prediction:
        out += _wrap(f"interval: {prediction['interval']['text']}", "  ")
        for c in prediction["crossings"]:
            out += _wrap(f"{c['model']}: {c['text']}", "  ")
        out += [f"  note: {n}" for n in prediction["calibration"]["notes"]]
        worth = prediction["not_worth_running"]
        out += _wrap(
            f"predicted not worth running ({prediction['rule'].split(': ', 1)[1]}): "
            + ("none" if not worth else "; ".join(f"{w['model']} {w['strategy']} ({w['why']})" for w in worth)),
            "  ",
        )
    return "\n".join(out)
