"""The capability table (label x precision x device kind) is what the trainer does: on this CPU every
pair it allows trains to `ok`, every pair it refuses exits 2 with its one line before any work, and
docs/strategies.md carries the same table. Real launches: the allowed pairs in the session's torchrun
launch of 2 ranks (tests/shared_launch.py; tests/run_many.py checks each pair as `vit-scale train`
does), the refused ones through `vit-scale train`'s main, one after the other in one process
(conftest.train_refusals)."""

import os
import re

import pytest

import shared_launch
from conftest import FAST, ROOT, load_runs, require_package, train_refusals
from vit_scale.distributed import capabilities as caps

# HYBRID_<g>GPU stands for every g: a 1-rank and a 2-rank shard group on 2 ranks
CONCRETE = {"HYBRID_<g>GPU": ("HYBRID_1GPU", "HYBRID_2GPU")}


def _cpu_pairs():
    for cap in caps.table():
        if cap.device == "cpu":
            for label in CONCRETE.get(cap.label, (cap.label,)):
                yield label, cap.precision, caps.capability(label, cap.precision, "cpu")


def test_the_doc_carries_the_table():
    text = open(os.path.join(ROOT, "docs", "strategies.md")).read()
    found = re.search(r"<!-- capabilities:begin -->\n(.*?)\n<!-- capabilities:end -->", text, re.S)
    assert found, "docs/strategies.md has lost its capabilities markers"
    assert found.group(1) == caps.markdown(), (
        "docs/strategies.md differs from the table: "
        "paste `python -m vit_scale.distributed.capabilities` between the markers"
    )


def test_every_label_and_precision_has_a_verdict_on_every_device():
    rows = {(c.label, c.precision, c.device) for c in caps.table()}
    assert len(rows) == len(caps.TABLE_LABELS) * 3 * 3
    for cap in caps.table():
        assert cap.runs or (cap.key in ("strategy", "train.precision") and cap.reason), cap
    # what the H100 showed (issue 10): CAI_DDP bf16 is no longer refused nor left to crash
    assert caps.capability("CAI_DDP", "bf16", "cuda").runs
    assert caps.capability("CAI_DDP_FP16", "fp16", "cuda").seen == caps.H100


def _allowed_runs(folder) -> list:
    out = f"output.dir={folder / 'trained'}"
    return [
        [
            *FAST,
            out,
            f"strategy={label}",
            f"train.precision={precision}",
            *cap.needs,
            f"output.study={label}-{precision}",
        ]
        for label, precision, cap in _cpu_pairs()
        if cap.runs
    ]


# in the session's launch of 2 ranks (tests/shared_launch.py), after test_deepspeed's runs
shared_launch.register(
    "test_capabilities", "allowed_pairs", 2, _allowed_runs, order=3, packages=("deepspeed", "colossalai")
)


@pytest.fixture(scope="module")
def allowed_pairs(shared_launches):
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    require_package("colossalai", "bash env/setup_venv.sh local --extras colossalai")
    return shared_launches.share("test_capabilities", "allowed_pairs")


def test_every_cpu_pair_trains_or_is_refused_in_one_line(allowed_pairs, tmp_path):
    refused = {}
    for label, precision, cap in _cpu_pairs():
        args = [f"strategy={label}", f"train.precision={precision}"]
        if cap.runs and cap.needs:  # without its options the pair is refused
            refused[f"{label}-{precision}-bare"] = (args, "strategy: ZEROPP")
        elif not cap.runs:
            refused[f"{label}-{precision}"] = (args, f"{cap.key}: {cap.reason}")

    allowed = _allowed_runs(allowed_pairs.folder)
    assert allowed_pairs.codes == [0] * len(allowed), allowed_pairs.stdout[-3000:]
    runs = {records[0]["study"]: records[-1] for records in load_runs(allowed_pairs.folder / "trained").values()}
    assert sorted(runs) == sorted(a[-1].split("=", 1)[1] for a in allowed)
    for study, end in runs.items():
        assert end["status"] == "ok" and end["replicas_agree"] is True, (study, end)

    results = train_refusals({name: args for name, (args, _) in refused.items()}, tmp_path)
    for name, (code, stdout, stderr) in results.items():
        lines = stderr.strip().splitlines()
        assert code == 2, (name, code, stderr[-2000:])
        assert len(lines) == 1 and "Traceback" not in stdout + stderr, (name, stderr)
        assert lines[0].startswith(f"vit-scale: error: {refused[name][1]}"), (name, lines[0])
    assert not (tmp_path / "runs").exists()  # nothing was written for a refused pair
