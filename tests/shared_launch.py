"""One torchrun launch a session, per rank count, for the short trainer runs of several test modules.

Each launch costs seconds before its first step: torch, vit_scale and, where a run needs them, DeepSpeed and
ColossalAI imported in every rank, on a machine of 2 cores. The modules' runs are independent (each sets its
own seeds, writes under its own output.dir, and tests/run_many.py checks each as `vit-scale train` does), so
the modules that register here share one launch of each rank count: the first fixture that asks starts it,
with the runs of every registered module a selected test needs, and each module reads its own runs.

A module registers at import: register(module, fixture, nproc, make_runs), where make_runs(folder) gives the
module's runs with their output under `folder`; its fixture then calls shared_launches.share(module, fixture)
(the session fixture in conftest.py) for a Share: that folder, its runs' exit codes and rank 0's output
(and the launch's stderr).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conftest import run_many, run_outputs


@dataclass
class Entry:
    nproc: int
    make_runs: Callable[[Path], list]
    order: int  # lower first in the launch: runs without DeepSpeed, then test_deepspeed's (whose first run is
    # a process's first DeepSpeed run), then the other modules' DeepSpeed and ColossalAI runs; in the launch of 4
    # ranks test_predicted_bytes' cases before test_deepspeed's (whose runs changed a ZeRO-3 case's bytes)
    needs: tuple  # session fixtures to set up before the launch (a kernel build)


@dataclass
class Share:
    folder: Path  # what make_runs was given
    codes: list  # each run's exit code, in order
    stdout: str  # rank 0's output of these runs
    stderr: str  # the whole launch's (every rank's, every module's)


ENTRIES: dict = {}  # (module, fixture): Entry, in the order the modules were imported


def register(module: str, fixture: str, nproc: int, make_runs, order: int, needs=(), packages=()) -> None:
    """Adds a module's runs, unless a package they need is missing (the module's fixture then skips, or fails
    in CI, as it did with a launch of its own)."""
    if all(importlib.util.find_spec(p) is not None for p in packages):
        ENTRIES[(module, fixture)] = Entry(nproc, make_runs, order, tuple(needs))


class Launches:
    def __init__(self, request, tmp_path_factory):
        self.request, self.factory, self.shares = request, tmp_path_factory, {}

    def share(self, module: str, fixture: str) -> Share:
        key = (module, fixture)
        assert key in ENTRIES, f"{module} did not register {fixture} with tests/shared_launch.py"
        if key not in self.shares:
            self._launch(ENTRIES[key].nproc, key)
        share = self.shares[key]
        if isinstance(share, Exception):  # the launch failed: said once, not launched again by each module
            raise share
        return share

    def _wanted(self, nproc: int, asking) -> list:
        """The entries of `nproc` ranks not launched yet whose fixture a selected test uses, in launch order."""
        items = self.request.session.items
        keys = [
            key
            for key, entry in ENTRIES.items()
            if entry.nproc == nproc
            and key not in self.shares
            and (key == asking or any(i.path.stem == key[0] and key[1] in i.fixturenames for i in items))
        ]
        return sorted(keys, key=lambda key: ENTRIES[key].order)

    def _launch(self, nproc: int, asking) -> None:
        keys = self._wanted(nproc, asking)
        try:
            self._run(nproc, keys)
        except Exception as exc:
            failed = RuntimeError(f"the session's launch of {nproc} ranks failed (tests/shared_launch.py): {exc}")
            self.shares.update({key: failed for key in keys})
            raise

    def _run(self, nproc: int, keys: list) -> None:
        for key in keys:
            for fixture in ENTRIES[key].needs:
                self.request.getfixturevalue(fixture)
        folders = {key: self.factory.mktemp(f"{key[0]}-{key[1]}") for key in keys}
        runs = {key: ENTRIES[key].make_runs(folders[key]) for key in keys}
        every = [run for key in keys for run in runs[key]]
        proc = run_many(nproc, every, self.factory.mktemp(f"shared-{nproc}"), timeout=1800)
        found = re.search(r"^EXIT CODES (\[.*\])$", proc.stdout, re.M)
        assert found, proc.stdout[-3000:] + proc.stderr[-5000:]
        codes, outputs = ast.literal_eval(found.group(1)), run_outputs(proc.stdout, len(every))
        start = 0
        for key in keys:
            end = start + len(runs[key])
            self.shares[key] = Share(folders[key], codes[start:end], "".join(outputs[start:end]), proc.stderr)
            start = end
