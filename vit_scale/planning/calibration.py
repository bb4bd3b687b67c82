"""What the collectives cost in a prediction, and where that came from: the Calibration that the system
profile (vit_scale.planning.input_profile) or a check (vit_scale.planning.input_check) gives, each as plain
values with their spread (vit_scale.planning.spread), and the one with no communication timed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vit_scale.planning import spread
from vit_scale.planning.alpha_beta import (
    Z90,
    Link,
    Network,
)

CALIBRATIONS = ("check", "profile", "none")


@dataclass(frozen=True)
class Calibration:
    """What the collectives cost in a prediction, and where that came from."""

    kind: str  # "check", "profile" or "none"
    network: Network
    source: str  # the file read, or why there is none
    notes: tuple = ()  # fits not used and why; fallbacks taken
    fitted: tuple = ()  # for "check": the fits used, "collective/scope" each
    over_defaults: bool = False  # for "check": the profile's defaults time what no fit covers
    # (cheap, costly) networks where the calibration builds them itself (a schema-2 check: its step fits at
    # each end of their intervals); empty: from the network's own ranges and fits (spread.ends)
    given_ends: tuple = ()
    fit_errors: tuple = ()  # for "check": each fit with standard errors, in a few words

    def __post_init__(self):
        # the network at the cheap and costly ends of its inputs' ranges, made once: compute derived from a
        # measured step is cached per network object (ComputeSource.compute_for)
        object.__setattr__(self, "_ends", self.given_ends or spread.ends(self.network))

    @property
    def ends(self) -> tuple | None:
        """(cheap, costly) networks (vit_scale.planning.spread.ends), None when no input has a range."""
        return self._ends

    def spread_text(self) -> str:
        """Which inputs carry a range, in one line (or that none does: no interval)."""
        if self.ends is None:
            return "no interval: the calibration's figures carry no range"
        parts = [f"the ranges of {', '.join(r.text() for r in self.network.ranges)}"] if self.network.ranges else []
        parts += [f"+-{Z90:g} standard errors of {e}" for e in self.fit_errors]
        return "from " + "; ".join(parts)

    @property
    def label(self) -> str:
        """The kind, naming the fits used: "check (all_gather/inter) + profile defaults", "profile", "none"."""
        if self.kind != "check":
            return self.kind
        return f"check ({', '.join(self.fitted)})" + (" + profile defaults" if self.over_defaults else "")

    def describe(self) -> str:
        what = {
            "check": "check.json's fits" + self.label[len("check") :],
            "profile": "the system profile's defaults",
            "none": "none (communication not timed: the compute-bound ceiling)",
        }[self.kind]
        text = f"{what}" + (f" ({self.source})" if self.kind != "none" or self.source else "")
        return text + (f"; {'; '.join(self.notes)}" if self.notes else "")


def no_calibration(why: str = "") -> Calibration:
    """Collectives cost nothing: every prediction is the compute-bound ceiling (ideal scaling)."""
    free = Link(0.0, math.inf, "none")
    return Calibration("none", Network(free, free, source="none: communication not timed"), why)
