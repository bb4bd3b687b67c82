"""The system profile as an input of a prediction: configs/systems/NAME.yaml found, read and validated
in one place, its `network:` section (with each figure's range) turned into a Calibration, its peak
into a number and its `device_spread` into a share. Bad input is errors.UserError: one line naming the
file and key."""

from __future__ import annotations

import dataclasses
import math
import os

from vit_scale.errors import UserError
from vit_scale.planning.alpha_beta import (
    network_from_profile,
)
from vit_scale.planning.calibration import Calibration
from vit_scale.planning.spread import DeviceSpread


def profile_path(system: str) -> str:
    """configs/systems/SYSTEM.yaml of this checkout, else of VIT_SCALE_HOME (an installed copy)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for home in (here, os.environ.get("VIT_SCALE_HOME", "")):
        path = os.path.join(home, "configs", "systems", f"{system}.yaml")
        if home and os.path.isfile(path):
            return path
    raise UserError(f"--system: no profile configs/systems/{system}.yaml; set VIT_SCALE_HOME to the vit-scale checkout")


def _read_yaml(path: str, option: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise UserError(f"{option}: cannot read {path} ({exc.strerror or exc}); expected a system profile") from None
    except yaml.YAMLError:
        raise UserError(
            f"{option}: {path} is not YAML; expected a system profile (configs/systems/NAME.yaml)"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{option}: {path} is not a mapping; expected a system profile (configs/systems/NAME.yaml)")
    return data


def read_profile(path: str) -> dict:
    """A system profile's YAML mapping; an unreadable one is a UserError naming it."""
    return _read_yaml(path, "--system")


def profile_calibration(path: str) -> Calibration | None:
    """The profile's `network:` defaults, or None when it has no such section."""
    try:
        net = network_from_profile(_read_yaml(path, "--system"), os.path.basename(path))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return None if net is None else Calibration("profile", net, os.path.basename(path))


def peak_tflops(path: str, precision: str) -> float | None:
    """The profile's dense peak per device for `precision` (None when it gives none: a CPU)."""
    peak = _read_yaml(path, "--system").get("peak_tflops")
    value = peak.get(precision) if isinstance(peak, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def device_spread(path: str) -> DeviceSpread | None:
    """The profile's `device_spread`: how far a band end's compute beyond the baseline rung may lie from the
    rung's, as shares of its time (0.08: 8% either way; [0.75, 0]: up to 75% less, none more), from the source
    cited beside it; None when the profile gives none. Anything else is a UserError naming the key."""
    data = _read_yaml(path, "--system")
    value = data.get("device_spread")
    if value is None:
        return None
    spread = DeviceSpread.read(value)
    if spread is None:
        raise UserError(
            f"{os.path.basename(path)}: device_spread: {value!r} is not allowed; allowed: a share of a device's "
            "speed from 0 up to 1 (0.08 for 8% either way), or [faster, slower], two such shares"
        )
    emulation = data.get("emulation")
    quota = emulation.get("cpus_per_node") if isinstance(emulation, dict) else None
    if isinstance(quota, (int, float)) and not isinstance(quota, bool) and quota > 0:
        # emulated nodes under a CPU quota: the faster share is its budget (docs/plan.md, "The devices")
        spread = dataclasses.replace(spread, budget=True)
    burst = data.get("quota_burst_share")
    if burst is not None:
        name = os.path.basename(path)
        if not spread.budget:
            raise UserError(f"{name}: quota_burst_share is given without a CPU quota (emulation.cpus_per_node)")
        pace = 1 - spread.faster
        ok = not isinstance(burst, bool) and isinstance(burst, (int, float)) and math.isfinite(burst)
        if not ok or not pace <= burst <= 1:
            raise UserError(
                f"{name}: quota_burst_share: {burst!r} is not allowed; allowed: a share of the rung's compute time "
                f"from the cores' own pace ({pace:g}, 1 - device_spread's faster share) up to 1"
            )
        spread = dataclasses.replace(spread, burst_share=float(burst))
    return spread
