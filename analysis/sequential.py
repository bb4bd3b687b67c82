"""The stopping rule of `vit-scale study --repeat auto`: after each round from the second, which node
counts' best-against-next comparisons are decided (they stop repeating) and which are still open (they
run another round, up to the maximum).

    python analysis/sequential.py STUDY_DIR --round R --max N

prints one JSON object: the look's level and, per model and node count (and rank count), the best point,
the next best, the ratio with its interval, the test and whether it is decided. The study runs it as a
subprocess between rounds (vit_scale does not import analysis); a resumed study asks again and gets the
same answers, since a look after round R reads only the runs of rounds 1..R.

The test is the report's own (stats.compare: paired t on the rounds both points have, else Welch), at a
nominal level that depends on the look: a group-sequential design, so that looking after every round
does not raise the chance of calling equal points different above ALPHA (docs/analysis.md, "Repetitions
that stop when settled"). Interim looks spend fixed small levels (INTERIM, LATER); the last look's level
(FINAL) is the largest that keeps the chance of a separation anywhere along the way at ALPHA for equal
points. The paired t's sequence of statistics does not depend on the run-to-run variation, so these
levels, found by simulation (benchmarks/statistics_power.py --calibrate), hold at any variation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

if __package__ in (None, ""):  # run as a script: analysis/ itself is not on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import stats, table
from vit_scale.record import reader as records

ALPHA = 0.05  # the whole design's two-sided level: equal points separated at most this often
# what the last-look levels are calibrated to: a quarter point under ALPHA, so that a finite simulation of
# the design (benchmarks/statistics_power.py: 4000 pairs, standard error 0.35 points) reads at most ALPHA
CALIBRATED = 0.0475
DEFAULT_MAX = 7  # `--repeat auto`: the most rounds (docs/analysis.md says why not 5)
MAXIMA = range(3, 9)  # auto:N allowed; vit_scale/study/plan.py repeats them for its one-line refusal
INTERIM = {2: 0.015, 3: 0.02}  # the look after round 2 and round 3: where large differences stop
LATER = 0.005  # every later interim look
# The last look's level for each maximum: the largest keeping the design's false-positive rate at CALIBRATED
# (paired t, 10^6 simulated pairs of equal points each; benchmarks/statistics_power.py --only calibrate).
FINAL = {3: 0.0361, 4: 0.0223, 5: 0.0186, 6: 0.0152, 7: 0.0131, 8: 0.0108}


def look_level(after_round: int, maximum: int) -> float:
    """The nominal two-sided level of the look after `after_round` in a study of at most `maximum` rounds."""
    if maximum not in FINAL:
        raise ValueError(f"maximum {maximum}: allowed {MAXIMA.start} to {MAXIMA.stop - 1}")
    if after_round >= maximum:
        return FINAL[maximum]
    return INTERIM.get(after_round, LATER)


def test_at_look(a, b, after_round: int, maximum: int) -> stats.Comparison:
    """Point a (the best) against b (the next) at the look after `after_round`: stats.compare at the look's
    level; decided when separated. What the study and benchmarks/statistics_power.py both call."""
    return stats.compare(a, b, level=1 - look_level(after_round, maximum))


@dataclass(frozen=True)
class Look:
    """One model and node count at one look: its best point against the next, and whether that is decided."""

    model: str
    nodes: int
    world_size: int
    best: str
    runner_up: str | None
    ratio: float
    low: float
    high: float
    test: str
    decided: bool
    why: str


def looks(results, after_round: int, maximum: int) -> list[Look]:
    """Each model and node count's look: the best usable point against the next by stats.compare at the
    look's level. Decided: separated; or nothing to compare (one point). Open: not separated, or a point
    with fewer than two ok runs (no test yet)."""
    level = look_level(after_round, maximum)
    good = table.usable(results).copy()
    good["_rank_ips"] = table.point_ips(good)
    out = []
    for (model, nodes, world), grp in good.groupby(["model", "nodes", "world_size"], sort=False):
        grp = grp.sort_values(["_rank_ips", "memory_gib"], ascending=[False, True])
        best = grp.iloc[0]
        if len(grp) == 1:
            out.append(
                Look(str(model), int(nodes), int(world), best["series"], None, math.nan, math.nan, math.nan, "", True,
                     "one point: nothing to compare")
            )  # fmt: skip
            continue
        nxt = grp.iloc[1]
        test = test_at_look(table.runs_of(best), table.runs_of(nxt), after_round, maximum)
        if test.separated is True:
            why = f"separated at the look's level {level:.2%}"
        elif test.separated is False:
            why = f"not separated at the look's level {level:.2%}"
        else:
            why = test.method
        out.append(
            Look(str(model), int(nodes), int(world), best["series"], nxt["series"], float(test.ratio),
                 float(test.low), float(test.high), test.method, test.separated is True, why)
        )  # fmt: skip
    return out


def decide(study_dir: str, after_round: int, maximum: int) -> list[Look]:
    """The looks after `after_round` from the study's records: only runs of rounds 1..after_round count, so
    a resumed study, which finds later rounds' runs on disk, takes the same decisions again."""
    coll = records.collect([study_dir])
    coll.runs = [r for r in coll.runs if 1 <= table.repetition_of_record(r) <= after_round]
    if not coll.runs:
        return []
    return looks(table.build(coll).results, after_round, maximum)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"analysis/sequential.py: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir")
    parser.add_argument("--round", type=int, required=True, dest="after_round")
    parser.add_argument("--max", type=int, required=True, dest="maximum")
    args = parser.parse_args(argv)
    if args.maximum not in FINAL:
        parser.error(f"--max: {args.maximum} is not allowed; allowed: {MAXIMA.start} to {MAXIMA.stop - 1}")
    if args.after_round < 2:
        parser.error(f"--round: {args.after_round} is not allowed; allowed: 2 or more (every point runs twice)")
    if not os.path.isdir(args.study_dir):
        parser.error(f"{args.study_dir}: not a directory")
    found = decide(args.study_dir, args.after_round, args.maximum)
    level = look_level(args.after_round, args.maximum)
    print(
        json.dumps(
            {"round": args.after_round, "max": args.maximum, "level": level, "looks": [asdict(x) for x in found]}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
