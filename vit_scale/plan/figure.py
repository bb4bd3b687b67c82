"""The plan's predicted figure: DIR/weak_scaling_plan.json and the PNG and PDF analysis/plan_figure.py
draws from it, run as a subprocess (vit_scale does not import analysis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from vit_scale.planning import SCHEMA_VERSION

from .options import FIGURE


def write_figure(prediction: dict, rows: list, shared: dict, directory: str) -> list:
    """DIR/weak_scaling_plan.json (the prediction) and the figure analysis/plan_figure.py draws from it
    (a subprocess: vit_scale does not import analysis). Returns the files written; raises RuntimeError
    with the drawing's last line when it fails."""
    script = _plan_figure_script()
    os.makedirs(directory, exist_ok=True)
    data = {
        "schema": SCHEMA_VERSION,
        **prediction,
        "batch_size": shared["batch_size"],
        "precision": shared["precision"],
        "gpus_per_node": shared["gpus_per_node"],
        "device": shared["device"],
        "rows": [
            {
                "model": r["model"],
                "params": r["params"],
                "strategy": r["strategy"],
                "nodes": r["nodes"],
                "world_size": r["world_size"],
                "fits": r["prediction"]["fits"],
                "images_per_s": r["prediction"]["images_per_s"],
                "images_per_s_per_gpu": r["prediction"]["images_per_s_per_gpu"],
                "scaling_efficiency": r["prediction"]["scaling_efficiency"],
                "extrapolated": bool(r["prediction"].get("extrapolated")),
                "images_per_s_low": r["prediction"].get("images_per_s_low"),
                "images_per_s_high": r["prediction"].get("images_per_s_high"),
            }
            for r in rows
        ],
    }
    path = os.path.join(directory, f"{FIGURE}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    proc = subprocess.run([sys.executable, script, path, "--out", directory], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
    return [path] + [os.path.join(directory, f"{FIGURE}.{ext}") for ext in ("png", "pdf")]


def _plan_figure_script() -> str:
    """analysis/plan_figure.py of this checkout, else of VIT_SCALE_HOME (an installed copy)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for home in (here, os.environ.get("VIT_SCALE_HOME", "")):
        path = os.path.join(home, "analysis", "plan_figure.py")
        if home and os.path.isfile(path):
            return path
    raise RuntimeError("analysis/plan_figure.py not found; set VIT_SCALE_HOME to the vit-scale checkout")
