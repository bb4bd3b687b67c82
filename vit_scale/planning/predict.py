"""Predicted step times and images/s for a list of points, from a calibration and a compute source:
the one entry point `vit-scale plan` and the analysis share.

    cal = choose_calibration(check="runs/study/check.json", profile=profile_path("frontier"),
                             system="frontier", models=["vit_base"], precisions=["bf16"])
    comp = compute_from("runs/study")                      # or compute_from_flops(peak, efficiency)
    rows = predict(points, cal, comp, blocking=False)      # points: Scenarios

Calibration, in this order: a check.json's fits (from the size sweep of `vit-scale check`; their
gaps filled by the profile's defaults), the system profile's `network:` defaults, or none (no
communication timed: the compute-bound ceiling). The result says which it used.

Compute: a measured step of the same model, batch and precision (a run directory, or a study
directory's 1-node rung: each strategy its own 1-node run where there is one), its compute being
the measured step less the exposed communication this model predicts for that very run; or the
counted FLOPs over the profile's peak times a stated efficiency.

Bad input (a missing or unreadable file, a check.json of another system, model or precision, a
fit with too few points, a run directory of another model, batch or precision) raises
errors.UserError: one line naming the file or option and what is expected. Torch-free.
Model and limits: docs/plan.md, "Predicted step time" and "Predictions: calibration and compute".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

from vit_scale.distributed import family_options
from vit_scale.errors import UserError
from vit_scale.models import get_spec
from vit_scale.planning import spread, step_fit
from vit_scale.planning.alpha_beta import (
    COLLECTIVES,
    MIN_SIZES,
    SCOPES,
    Z90,
    Fit,
    Link,
    Network,
    network_from_profile,
)
from vit_scale.planning.scenario import Allowance, Scenario, baseline_nodes, blas_workspace_mib
from vit_scale.planning.shapes import Shape
from vit_scale.planning.step_time import Compute, StepPrediction, predict_step
from vit_scale.record import reader
from vit_scale.record.check_file import CHECK_SCHEMAS  # 1: fits at one group size each; 2: step_fits as well

CALIBRATIONS = ("check", "profile", "none")
STEP_FIT_KEYS = step_fit.STEP_FIT_KEYS
FIT_KEYS = ("collective", "scope", "ranks", "alpha_us", "bus_gbps", "max_rel_residual", "sizes", "flags")
BISECT_STEPS = 32  # halvings of the compute interval: 2^-32 of the step, far below its noise


# ---------------------------------------------------------------- calibration


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


def _params(model: str) -> int:
    return Shape.from_spec(get_spec(model)).params


def read_check(path: str) -> dict:
    """check.json as a dict; a missing, unreadable or foreign file is a UserError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UserError(
            f"--calibration: cannot read {path} ({exc.strerror or exc}); expected a check.json "
            f"written by vit-scale check"
        ) from None
    except ValueError:
        raise UserError(
            f"--calibration: {path} is not JSON; expected a check.json written by vit-scale check"
        ) from None
    if not isinstance(data, dict) or data.get("schema") not in CHECK_SCHEMAS or "system" not in data:
        raise UserError(
            f"--calibration: {path} is not a check.json of schema {' or '.join(map(str, CHECK_SCHEMAS))} (no "
            f"schema/system keys); expected one written by vit-scale check"
        )
    return data


def _fit_entries(check: dict, key: str, keys: tuple, where: str):
    """check.json's list `key` of fits, each entry checked for what every kind of fit has (its keys, a
    known collective and scope): yields (entry, name) for the caller's own checks."""
    found = check.get(key)
    if not isinstance(found, list) or not found:
        raise UserError(
            f"--calibration: {where} has no {key} (from the size sweep); run vit-scale check in full "
            f"mode (without --quick) to measure them"
        )
    for i, entry in enumerate(found):
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise UserError(f"--calibration: {where}: {key}[{i}] needs the keys {', '.join(keys)}")
        name = f"{key}[{i}] ({entry['collective']}, {entry['scope']})"
        if entry["collective"] not in COLLECTIVES or entry["scope"] not in SCOPES:
            raise UserError(
                f"--calibration: {where}: {name}: collective must be one of {', '.join(COLLECTIVES)} "
                f"and scope one of {', '.join(SCOPES)}"
            )
        yield entry, name


def _enough_sizes(entry: dict, name: str, where: str) -> None:
    if entry["sizes"] < MIN_SIZES:
        raise UserError(
            f"--calibration: {where}: {name} has {entry['sizes']} size(s); a fit needs at least "
            f"{MIN_SIZES} (run vit-scale check in full mode)"
        )


def read_fits(check: dict, where: str) -> list:
    """check.json's `fits` (one alpha_beta.Fit.as_dict each) back into Fits. A fit with fewer sizes than
    a fit needs is bad input; a fit marked for another reason comes back marked (not used)."""
    fits = []
    for entry, name in _fit_entries(check, "fits", FIT_KEYS, where):
        numbers = [entry[k] for k in ("ranks", "sizes", "alpha_us", "bus_gbps", "max_rel_residual")]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers) or not isinstance(
            entry["flags"], list
        ):
            raise UserError(
                f"--calibration: {where}: {name}: ranks, sizes, alpha_us, bus_gbps and max_rel_residual "
                f"must be numbers and flags a list"
            )
        _enough_sizes(entry, name, where)
        _check_fit_values(entry, name, where)
        flags = tuple(str(f) for f in entry["flags"])
        fits.append(
            Fit(
                entry["collective"],
                entry["scope"],
                int(entry["ranks"]),
                float(entry["alpha_us"]),
                float(entry["bus_gbps"]),
                float(entry["max_rel_residual"]),
                int(entry["sizes"]),
                flags,
                _ranks_per_node(entry.get("ranks_per_node")),
                *_standard_errors(entry, ("alpha_us_se", "bus_gbps_se"), name, where),
            )
        )
    return fits


def _standard_errors(entry: dict, keys: tuple, name: str, where: str) -> list:
    """A fit's optional standard errors (None where not recorded: a check before them); one that is not a
    finite number of 0 or more is bad input naming its key."""
    out = []
    for key in keys:
        value = entry.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
        ):
            raise UserError(
                f"--calibration: {where}: {name}: {key} must be a finite number of 0 or more (a standard error), "
                f"got {value!r}"
            )
        out.append(None if value is None else float(value))
    return out


def _check_fit_values(entry: dict, name: str, where: str) -> None:
    """A fit's numbers as a fit can give them: at least 2 ranks (a collective over one moves nothing);
    for a fit the check marked usable (no flags), a finite bus bandwidth above 0 and a finite latency
    of 0 or more (0 is where the fit clamps an intercept below zero). A marked fit is not used, so its
    numbers may be anything the fit left (NaN, infinity); a usable one with such numbers was edited or
    written by something else, and would time every collective as free or as forever."""
    ranks = entry["ranks"]
    if isinstance(ranks, float) and not ranks.is_integer() or ranks < 2:
        raise UserError(f"--calibration: {where}: {name}: ranks must be a whole number of at least 2, got {ranks!r}")
    per_node = entry.get("ranks_per_node")
    if per_node is not None and (isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1):
        raise UserError(
            f"--calibration: {where}: {name}: ranks_per_node must be a positive whole number, got {per_node!r}"
        )
    if entry["flags"]:
        return
    alpha, bus = entry["alpha_us"], entry["bus_gbps"]
    if not (math.isfinite(bus) and bus > 0) or not (math.isfinite(alpha) and alpha >= 0):
        raise UserError(
            f"--calibration: {where}: {name}: a usable fit needs a finite bus_gbps above 0 and a finite alpha_us "
            f"of 0 or more, got bus_gbps {bus!r} and alpha_us {alpha!r}"
        )


def _per_rank(f: Fit) -> Link:
    """A fit as a scope's default: across nodes, one rank's share (Network.link multiplies it back by
    a group's ranks per node)."""
    link = f.link()
    if f.scope == "inter" and f.ranks_per_node:
        return Link(link.alpha_us, link.bus_gbps / f.ranks_per_node, link.source)
    return link


def _ranks_per_node(value) -> int | None:
    """A fit's ranks per node (checks before it was recorded have none: no rescaling)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_calibration(
    path: str, *, system: str, models, precisions, defaults: Calibration | None = None, check: dict | None = None
) -> Calibration:
    """A check.json's usable fits over `defaults` (the profile's). The check must be of `system`, cover
    every precision asked and a model at least as large as each one asked (its sweep stops at that
    model's largest message). Fits marked by the check are not used; the result says which."""
    data = check if check is not None else read_check(path)
    if data.get("system") != system:
        raise UserError(
            f"--calibration: {path} is a check of system {data.get('system')!r}; expected a check of "
            f"{system!r} (the scenario's system)"
        )
    precisions_checked = data.get("precisions")
    if not isinstance(precisions_checked, list) or not all(isinstance(p, str) for p in precisions_checked):
        raise UserError(
            f'--calibration: {path}: precisions must be a list of names (like ["bf16"]), got '
            f"{precisions_checked!r}; expected a check.json written by vit-scale check"
        )
    have = list(precisions_checked)
    missing = [p for p in dict.fromkeys(precisions) if p not in have]
    if missing:
        raise UserError(
            f"--calibration: {path} measured precision {', '.join(have) or 'none'}; expected "
            f"{', '.join(missing)} (the scenario's)"
        )
    checked = data.get("model")
    if not isinstance(checked, str):
        raise UserError(
            f"--calibration: {path}: model must be a model's name, got {checked!r}; expected a check.json "
            f"written by vit-scale check"
        )
    try:
        checked_params = _params(checked)
    except UserError:
        raise UserError(f"--calibration: {path} names model {checked!r}, which this vit-scale does not know") from None
    larger = [m for m in dict.fromkeys(models) if m != checked and _params(m) > checked_params]
    if larger:
        raise UserError(
            f"--calibration: {path} is a check of {checked}, whose messages are smaller than "
            f"{', '.join(larger)}'s; expected a check of {larger[-1]} (or a larger model)"
        )
    if data.get("schema", 1) >= 2:
        return _step_calibration(path, data, defaults)
    fits = read_fits(data, path)
    usable = [f for f in fits if f.usable]
    notes = [f"{f.collective}/{f.scope} not used: {'; '.join(f.flags)}" for f in fits if not f.usable]
    if defaults is not None:
        base = defaults.network
    else:
        by_scope = {
            s: next(
                (_per_rank(f) for f in sorted(usable, key=lambda f: f.collective != "all_reduce") if f.scope == s),
                None,
            )
            for s in SCOPES
        }
        if by_scope["intra"] is None and by_scope["inter"] is None:
            raise UserError(
                f"--calibration: {path} has no usable fit and the system profile no network defaults; "
                f"expected at least one usable fit"
            )
        for s, other in (("intra", "inter"), ("inter", "intra")):
            if by_scope[s] is None:
                notes.append(f"no usable {s}-node fit and no profile defaults: {s} timed with the {other} fit")
                by_scope[s] = by_scope[other]
        base = Network(by_scope["intra"], by_scope["inter"], source=f"fits of {os.path.basename(path)}")
    if not usable:
        # defaults is not None here (else the error above): no fit of the check times anything, so the
        # calibration is the profile's, and it says why the check was not
        flagged = "; ".join(f"{f.collective}/{f.scope} not used: {', '.join(f.flags)}" for f in fits)
        return dataclasses.replace(defaults, notes=(f"check.json's fits were all flagged: {flagged}", *defaults.notes))
    network = base.with_fits(usable)
    fitted = tuple(dict.fromkeys(f"{f.collective}/{f.scope}" for f in usable))
    covered = {(f.collective, f.scope) for f in usable}
    over = defaults is not None and any((c, s) not in covered for c in COLLECTIVES for s in SCOPES)
    errors = tuple(
        f"{f.collective}/{f.scope} fit: alpha {f.alpha_us:.3g} +- {f.alpha_se_us or 0:.2g} us, "
        f"B {f.bus_gbps:.3g} +- {f.bus_se_gbps or 0:.2g} GB/s"
        for f in usable
        if f.has_spread
    )
    return Calibration(
        "check",
        dataclasses.replace(network, source=f"{path}: {network.source}"),
        path,
        tuple(notes),
        fitted,
        over,
        fit_errors=errors,
    )


def read_step_fits(check: dict, where: str) -> list:
    """check.json's `step_fits` (schema 2: one step_fit.StepFit.as_dict each) back into StepFits, each
    checked as read_fits checks a fit: bad input is a UserError naming the entry."""
    fits = []
    for entry, name in _fit_entries(check, "step_fits", STEP_FIT_KEYS, where):
        numbers = [entry[k] for k in ("step_latency_us", "launch_us", "bus_gbps", "max_rel_residual", "sizes")]
        groups = entry["groups"]
        if (
            any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers)
            or not isinstance(entry["flags"], list)
            or not isinstance(groups, list)
            or not groups
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in groups)
        ):
            raise UserError(
                f"--calibration: {where}: {name}: step_latency_us, launch_us, bus_gbps, max_rel_residual and "
                f"sizes must be numbers, flags a list and groups a list of whole numbers of ranks, each at least 2"
            )
        _enough_sizes(entry, name, where)
        per_node = entry.get("ranks_per_node")
        if per_node is not None and (isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1):
            raise UserError(
                f"--calibration: {where}: {name}: ranks_per_node must be a positive whole number, got {per_node!r}"
            )
        if not entry["flags"]:
            values = {k: entry[k] for k in ("step_latency_us", "launch_us", "bus_gbps")}
            if not (math.isfinite(values["bus_gbps"]) and values["bus_gbps"] > 0) or any(
                not (math.isfinite(values[k]) and values[k] >= 0) for k in ("step_latency_us", "launch_us")
            ):
                raise UserError(
                    f"--calibration: {where}: {name}: a usable fit needs a finite bus_gbps above 0 and a finite "
                    f"step_latency_us and launch_us of 0 or more, got {values}"
                )
        _standard_errors(entry, ("step_latency_us_se", "launch_us_se", "bus_gbps_se"), name, where)
        fits.append(step_fit.from_dict(entry))
    return fits


def _step_calibration(path: str, data: dict, defaults: Calibration | None) -> Calibration:
    """A schema-2 check.json's usable per-step fits over `defaults`: each (collective, scope) fitted
    prices its ring steps and bytes with the fit; the launch latency is the within-node fits' (median);
    a group beyond the largest any usable fit saw is extrapolated."""
    fits = read_step_fits(data, path)
    usable = [f for f in fits if f.usable]
    notes = [f"{f.collective}/{f.scope} not used: {'; '.join(f.flags)}" for f in fits if not f.usable]
    if not usable:
        if defaults is None:
            raise UserError(
                f"--calibration: {path} has no usable fit and the system profile no network defaults; "
                f"expected at least one usable fit"
            )
        flagged = "; ".join(f"{f.collective}/{f.scope} not used: {', '.join(f.flags)}" for f in fits)
        return dataclasses.replace(defaults, notes=(f"check.json's fits were all flagged: {flagged}", *defaults.notes))
    if defaults is not None:
        base = defaults.network
    else:
        by_scope = {
            s: next(
                (f.link() for f in sorted(usable, key=lambda f: f.collective != "all_reduce") if f.scope == s), None
            )
            for s in SCOPES
        }
        for s, other in (("intra", "inter"), ("inter", "intra")):
            if by_scope[s] is None:
                notes.append(f"no usable {s}-node fit and no profile defaults: {s} timed with the {other} fit")
                by_scope[s] = by_scope[other]
        base = Network(by_scope["intra"], by_scope["inter"], source=f"fits of {os.path.basename(path)}")
    network = _step_network(base, usable, path)
    ends = ()
    if base.has_spread or any(f.has_spread for f in usable):
        # each end: the profile's figures and every fit at the same end of their intervals
        ends = tuple(
            _step_network(base.at_end(costly), [f.at_end(costly) for f in usable], path) for costly in (False, True)
        )
    fitted = tuple(dict.fromkeys(f"{f.collective}/{f.scope}" for f in usable))
    covered = {(f.collective, f.scope) for f in usable}
    over = defaults is not None and any((c, s) not in covered for c in COLLECTIVES for s in SCOPES)
    errors = tuple(_step_fit_spread(f) for f in usable if f.has_spread)
    return Calibration("check", network, path, tuple(notes), fitted, over, given_ends=ends, fit_errors=errors)


def _step_fit_spread(f) -> str:
    return (
        f"{f.collective}/{f.scope} fit: step {f.step_latency_us:.3g} +- {f.step_latency_se_us or 0:.2g} us, "
        f"launch {f.launch_us:.3g} +- {f.launch_se_us or 0:.2g} us, B {f.bus_gbps:.3g} +- {f.bus_se_gbps or 0:.2g} GB/s"
    )


def _step_network(base: Network, usable: list, path: str) -> Network:
    """`base` with the usable step fits in: each (collective, scope) fitted prices its steps and bytes with
    its fit; the launch is the within-node fits' median, the network overhead the across-nodes fits' in-node
    step latency (median), each where some fit gives it."""
    table = dict(base.per_collective)
    for f in usable:
        table[(f.collective, f.scope)] = f.link()
    launches = sorted(f.launch_us for f in usable if f.scope == "intra")
    launch = launches[len(launches) // 2] if launches else base.launch_us
    # what the in-node steps of a ring spanning nodes paid in the across-nodes fits replaces the profile's
    # network overhead (the fits' per-step latencies hold it; adding the profile's would count it twice)
    spans = sorted(f.intra_latency_us for f in usable if f.scope == "inter")
    overhead = spans[len(spans) // 2] if spans else base.net_overhead_us
    fitted = tuple(dict.fromkeys(f"{f.collective}/{f.scope}" for f in usable))
    largest = max(f.largest_ranks for f in usable)
    replaced = {"launch_us"} if launches else set()
    replaced |= {"net_overhead_us"} if spans else set()
    return dataclasses.replace(
        base,
        per_collective=table,
        launch_us=launch,
        net_overhead_us=overhead,
        ranges=tuple(r for r in base.ranges if r.key not in replaced),
        measured_ranks=largest,
        source=f"{path}: {base.source}; step fits: {', '.join(fitted)} (groups up to {largest} ranks)",
    )


def choose_calibration(
    check: str | None = None, profile: str | None = None, *, system: str = "", models=(), precisions=()
) -> Calibration:
    """check.json (over the profile's defaults) > the profile's defaults > none."""
    defaults = profile_calibration(profile) if profile else None
    if check:
        return check_calibration(check, system=system, models=models, precisions=precisions, defaults=defaults)
    if defaults is not None:
        return defaults
    return no_calibration(
        f"{os.path.basename(profile)} has no network section" if profile else "no check.json and no system profile"
    )


# ---------------------------------------------------------------- a run record as a scenario


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _section(cls, config: dict, options: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**_d(config), **options}.items() if k in names}
    return cls(**values)


def run_precision(start: dict) -> str:
    """The run's precision: the resolved config's train.precision, else the strategy's options."""
    train = _d(_d(start.get("config")).get("train"))
    return str(train.get("precision") or _d(_d(start.get("strategy")).get("options")).get("precision") or "bf16")


def scenario_of_run(start: dict) -> Scenario:
    """The planner's Scenario for the run a start record describes (it ran, so no memory verdict)."""
    cfg, strat, world = _d(start.get("config")), _d(start.get("strategy")), _d(start.get("world"))
    options = _d(strat.get("options"))
    train = _d(cfg.get("train"))
    ckpt = train.get("activation_checkpointing", options.get("activation_checkpointing", False))
    return Scenario(
        model=start["model"]["name"],
        strategy=strat["label"],
        nodes=int(world["nodes"]),
        gpus_per_node=int(world.get("ranks_per_node") or world["world_size"] // max(1, world["nodes"])),
        batch_size=int(start["batch"]["per_device"]),
        precision=run_precision(start),
        activation_checkpointing=bool(ckpt),
        num_classes=int(train.get("num_classes", 1000)),
        # the device's memory as the run saw it (null on a CPU), so that a point the planner says does not
        # fit is predicted as not fitting, not as a speed
        device_memory_gib=_memory(world.get("device_memory_gib")),
        # a GEMM's BLAS workspace on the device the run had (76 MiB on ROCm; 0 on CUDA and CPU)
        allowance=Allowance(blas_workspace_mib=blas_workspace_mib(world.get("device_type"))),
        # each family's section from the resolved config, the run's own family's from its recorded options
        **{
            name: _section(cls, cfg.get(name), options if strat.get("family") == name else {})
            for name, cls in family_options().items()
        },
    )


def _memory(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


def blocking_for(backend: str | None, device_type: str | None = None) -> bool:
    """gloo on a CPU returns from a collective when it is done (vit_scale.planning.step_time.timeline)."""
    return backend == "gloo" or device_type == "cpu"


# ---------------------------------------------------------------- compute


@dataclass(frozen=True)
class MeasuredStep:
    """One ok run's step (global batch over its median images/s: run_ips) and the scenario it ran."""

    scenario: Scenario
    step_s: float
    run_dir: str
    blocking: bool
    options: str = ""  # the strategy's options, to prefer a run of the same series

    @property
    def key(self) -> tuple:
        return (self.scenario.model, self.scenario.batch_size, self.scenario.precision)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def run_ips(run) -> float | None:
    """A run's images/s as the analysis takes it (analysis/table.py, _run_median): the median of its timed
    steps (the end record's, else from its steps), its mean only where neither is there."""
    ips = _d((run.end or {}).get("images_per_s"))
    if _positive(ips.get("median")):
        return float(ips["median"])
    steps = sorted(reader.timed_step_ips(run.path)) if getattr(run, "path", None) else []
    if steps:
        n = len(steps)
        median = steps[n // 2] if n % 2 else (steps[n // 2 - 1] + steps[n // 2]) / 2
        if median > 0:
            return median
    return float(ips["mean"]) if _positive(ips.get("mean")) else None


def measured_step(run) -> MeasuredStep | None:
    """A vit_scale.record.reader RunRecord's median step, or None when it gives no speed."""
    end = run.end or {}
    if run.status != "ok" or end.get("replicas_agree") is False:
        return None
    ips = run_ips(run)
    if ips is None:
        return None
    start = run.start
    sc = scenario_of_run(start)
    world = _d(start.get("world"))
    options = json.dumps(_d(_d(start.get("strategy")).get("options")), sort_keys=True, default=str)
    return MeasuredStep(
        sc,
        sc.batch_size * sc.world / ips,
        run.run_dir,
        blocking_for(world.get("backend"), world.get("device_type")),
        options,
    )


def compute_of(step: MeasuredStep, network: Network) -> Compute:
    """The compute c of a measured step s: the c at which the model's predicted step for that very run,
    c plus the communication it does not hide, equals s (found by bisection: the predicted step grows with
    compute). All of it is counted as forward and backward: a measured step does not say how much was the
    optimizer's."""
    sc = dataclasses.replace(step.scenario, device_memory_gib=None)
    ckpt = sc.activation_checkpointing

    def predicted(c: float) -> float:
        return predict_step(sc, network, Compute.measured(c, 0.0, "", ckpt), step.blocking).breakdown.step_s

    s = step.step_s
    if predicted(s) <= s * (1 + 1e-9):  # nothing exposed even with all of it as compute (up to rounding)
        c = s
    elif predicted(0.0) >= s:  # the predicted communication alone takes longer than the measured step
        c = 0.0
    else:
        lo, hi = 0.0, s
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if predicted(mid) < s else (lo, mid)
        c = (lo + hi) / 2
    where = os.path.basename(step.run_dir.rstrip(os.sep)) or step.run_dir
    src = (
        f"measured step of {sc.strategy} on {sc.nodes} node(s) ({where}: {s * 1e3:.4g} ms) less "
        f"{(s - c) * 1e3:.3g} ms exposed communication predicted for it"
    )
    if c == 0.0:
        src += " (the predicted communication alone exceeds the measured step: compute taken as 0)"
    return Compute.measured(c, 0.0, src, ckpt)


@dataclass
class ComputeSource:
    """Where each point's compute comes from: measured steps (each point takes the best-matching one of
    its model, batch and precision), or the counted FLOPs over a peak times an efficiency."""

    steps: list = field(default_factory=list)  # MeasuredSteps
    origin: str = ""  # the --compute-from path
    peak: float | None = None  # TFLOP/s per device, for FLOPs
    efficiency: float | None = None
    # per model, from --efficiency-from: a run's MFU applies to its own model only
    efficiencies: dict = field(default_factory=dict)
    # (model, precision, batch) -> planning.compute.GemmTimings: check.json's GEMMs, in place of `efficiency`
    gemms: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return "measured" if self.origin else "check" if self.gemms else "flops"

    def describe(self) -> str:
        if self.origin:
            return f"measured steps from {self.origin} ({len(self.steps)} run(s))"
        if self.gemms:
            timed = ", ".join(f"{t.model} {t.precision} batch {t.batch_size}" for t in self.gemms.values())
            flat = f"; other points: FLOPs over {self.peak:g} TFLOP/s x {self.efficiency:.0%}" if self.peak else ""
            return f"the Block's GEMMs timed by the check ({timed}), scaled to the step{flat}"
        if self.efficiencies:
            each = ", ".join(f"{m} {e:.0%}" for m, e in sorted(self.efficiencies.items()))
            return f"counted FLOPs over {self.peak:g} TFLOP/s x each model's MFU ({each})"
        return f"counted FLOPs over {self.peak:g} TFLOP/s x {self.efficiency:.0%} efficiency"

    def step_for(self, sc: Scenario, options: str = "") -> MeasuredStep:
        """Same model, batch and precision on the point's baseline node count (baseline_nodes: 1, or the
        fewest a group wider than a node fits on): the same strategy and options, else the same strategy,
        else the fastest run there of any strategy (the least communication in the way). A run on another
        node count is no baseline: its step holds communication that a 1-node step does not, and taking
        it as the rung would count that as compute (UserError)."""
        key = (sc.model, sc.batch_size, sc.precision)
        same = [s for s in self.steps if s.key == key]
        if not same:
            have = sorted({f"{m} at batch {b} in {p}" for m, b, p in (s.key for s in self.steps)})
            raise UserError(
                f"--compute-from: {self.origin} has no run of {sc.model} at batch {sc.batch_size} in "
                f"{sc.precision}; expected a run of the same model, batch and precision "
                f"(it has: {', '.join(have) or 'no ok run'})"
            )
        nodes = baseline_nodes(sc)
        rung = [s for s in same if s.scenario.nodes == nodes]
        if not rung:
            counts = ", ".join(str(n) for n in sorted({s.scenario.nodes for s in same}))
            raise UserError(
                f"--compute-from: {self.origin} has runs of {sc.model} at batch {sc.batch_size} in {sc.precision} "
                f"on {counts} node(s) only; expected its rung on {nodes} node(s), the baseline of "
                f"{sc.strategy} (the fewest nodes its groups fit on)"
            )
        return min(self.rung_for(sc, options, rung), key=lambda s: s.step_s)

    def rung_for(self, sc: Scenario, options: str = "", rung: list | None = None) -> list:
        """The runs step_for picks from: its repeats (same strategy and options, else same strategy), or the
        fastest run of another strategy alone. rung: the baseline's runs, when step_for has found them."""
        if rung is None:
            self.step_for(sc, options)  # its errors, for a point no run covers
            key = (sc.model, sc.batch_size, sc.precision)
            rung = [s for s in self.steps if s.key == key and s.scenario.nodes == baseline_nodes(sc)]
        for pick in (
            [s for s in rung if s.scenario.strategy == sc.strategy and s.options == options],
            [s for s in rung if s.scenario.strategy == sc.strategy],
        ):
            if pick:
                return pick
        return [min(rung, key=lambda s: s.step_s)]

    def has_spread(self, points: list, options: list | None = None) -> bool:
        """Whether some point's measured rung has repeats whose steps differ (their run-to-run interval)."""
        if not self.origin:
            return False
        return any(
            len({s.step_s for s in self.rung_for(sc, options[i] if options else "")}) > 1 for i, sc in enumerate(points)
        )

    def compute_for(self, sc: Scenario, network: Network, options: str = "", end: bool | None = None) -> Compute:
        """The point's compute; end (measured steps only): False the fastest of its rung's repeats, True the
        slowest (their run-to-run interval), None the one step_for picks."""
        if not self.origin and self.gemms:
            from vit_scale.planning.compute import compute_of_gemms, why_not

            if why_not(self.gemms, sc) is None:
                return compute_of_gemms(self.gemms[(sc.model, sc.precision, sc.batch_size)], sc)
            if self.peak is None:
                raise UserError(
                    f"--calibration: {why_not(self.gemms, sc)}; and the system profile gives no peak TFLOP/s to "
                    "count FLOPs against: run vit-scale check --model M --batch-size B for this point, or give "
                    "--compute-from RUNDIR"
                )
        if not self.origin:
            if self.efficiencies:
                if sc.model not in self.efficiencies:
                    raise UserError(
                        f"--efficiency-from: no ok run of {sc.model} recorded an MFU; expected runs of the same "
                        f"model (it has {', '.join(sorted(self.efficiencies))}): an MFU does not carry over "
                        "between models"
                    )
                return Compute.from_flops(sc, self.peak, self.efficiencies[sc.model])
            return Compute.from_flops(sc, self.peak, self.efficiency)
        if end is None:
            step = self.step_for(sc, options)
        else:
            step = (max if end else min)(self.rung_for(sc, options), key=lambda s: s.step_s)
        key = (step.run_dir, id(network))
        if key not in self._cache:
            # the network is kept with its compute, so that its id is not reused while the entry stands
            self._cache[key] = (network, compute_of(step, network))
        return self._cache[key][1]


def compute_from(path: str, runs: list | None = None) -> ComputeSource:
    """`--compute-from PATH`: a run directory (its metrics.jsonl) or a study directory (every ok run
    under it; each point then uses its 1-node rung). runs: RunRecords already read from PATH."""
    if runs is None:
        if not os.path.isdir(path):
            raise UserError(f"--compute-from: {path} is not a directory; expected a run directory or a study directory")
        runs = reader.collect([path]).runs
    _no_mfu_above_one(runs, "--compute-from")
    steps = [s for s in (measured_step(r) for r in runs) if s is not None]
    if not steps:
        raise UserError(
            f"--compute-from: {path} holds no run that finished ok with a speed; expected a run "
            f"directory (metrics.jsonl) or a study directory"
        )
    return ComputeSource(steps=steps, origin=path)


def compute_from_flops(peak: float | None, efficiency: float, where: str = "the system profile") -> ComputeSource:
    if peak is None or not peak > 0:
        raise UserError(
            f"--compute-from: {where} gives no peak TFLOP/s for this precision; give --compute-from "
            f"RUNDIR (a measured run) instead"
        )
    if not 0 < efficiency <= 1:
        raise UserError(f"--efficiency: must be in (0, 1], got {efficiency}")
    return ComputeSource(peak=peak, efficiency=efficiency)


def _no_mfu_above_one(runs, option: str) -> None:
    """An ok run whose end record claims more FLOP/s than its device's peak (MFU above 1) timed or
    counted something wrong; its speed would make compute a fraction of what any device does."""
    for r in runs:
        mfu = (r.end or {}).get("mfu")
        if r.status == "ok" and isinstance(mfu, (int, float)) and not isinstance(mfu, bool) and not mfu <= 1:
            raise UserError(
                f"{option}: {r.run_dir}: its end record's mfu is {mfu:g}, above 1 (more FLOP/s than the "
                f"device's peak); expected runs whose MFU is at most 1"
            )


def efficiency_from_runs(runs, model: str | None = None) -> float | None:
    """The median MFU of the ok runs that recorded one (of `model` only, when given: an MFU depends on the
    model's shapes and does not carry over to another). A recorded MFU counts model FLOPs without
    checkpointing's recompute; Compute.from_flops applies it the same way. A run with an MFU above 1 is
    bad input (UserError)."""
    _no_mfu_above_one(runs, "--efficiency-from")
    mfus = sorted(
        float((r.end or {})["mfu"])
        for r in runs
        if r.status == "ok"
        and isinstance((r.end or {}).get("mfu"), (int, float))
        and r.end["mfu"] > 0
        and (model is None or _d(r.start.get("model")).get("name") == model)
    )
    return mfus[len(mfus) // 2] if mfus else None


def efficiencies_from_runs(runs) -> dict:
    """Per model, the median MFU of its ok runs: --efficiency-from."""
    models = {_d(r.start.get("model")).get("name") for r in runs if isinstance(r.start, dict)}
    out = {m: efficiency_from_runs(runs, m) for m in models if isinstance(m, str)}
    return {m: e for m, e in out.items() if e is not None}


# ---------------------------------------------------------------- the predictions


def predict(
    points: list, calibration: Calibration, compute: ComputeSource, blocking: bool = False, options: list | None = None
) -> list:
    """One StepPrediction per point (a Scenario), each with its scaling efficiency against the same
    point on its baseline (1 node, or the fewest nodes a group wider than a node fits on: baseline_nodes).
    options: per point, the strategy options' JSON (prefers a compute run of the same series). Where an
    input carries a range (the calibration's, or a measured rung's repeats), each prediction gets its band
    (vit_scale.planning.spread: the predictions with every input at its cheap and at its costly end).
    Raises UserError for a point whose compute source does not fit it."""
    net = calibration.network
    spread_ends = calibration.ends
    banded = spread_ends is not None or compute.has_spread(points, options)
    out, base = [], {}
    for i, sc in enumerate(points):
        opt = options[i] if options else ""
        p = _predict_one(sc, net, compute.compute_for(sc, net, opt), blocking, base, "value")
        if banded:
            at_ends = []
            for costly in (False, True):
                end_net = spread_ends[costly] if spread_ends else net
                comp = compute.compute_for(sc, end_net, opt, end=costly if compute.origin else None)
                at_ends.append(_predict_one(sc, end_net, comp, blocking, base, costly))
            spread.band(p, at_ends)
        first = p.baseline_nodes
        if first > 1:
            p.rules = p.rules + [
                f"baseline: {first} nodes, the fewest {sc.strategy} fits on ({sc.gpus_per_node} GPUs a node); "
                "efficiency against it"
            ]
        p.rules = p.rules + [f"calibration: {calibration.describe()}"]
        out.append(p)
    return out


def _predict_one(sc: Scenario, network: Network, comp: Compute, blocking: bool, base: dict, which) -> StepPrediction:
    """One point with its efficiency against its baseline's prediction under the same inputs (`which`: the
    value or an end of the ranges; base caches the baselines)."""
    p = predict_step(sc, network, comp, blocking)
    first = baseline_nodes(sc)
    one = dataclasses.replace(sc, nodes=first)
    key = (repr(one), which)
    if key not in base:
        base[key] = p if sc.nodes == first else predict_step(one, network, comp, blocking)
    b = base[key]
    p.baseline_nodes = first
    if p.images_per_s_per_gpu is not None and b.images_per_s_per_gpu:
        p.scaling_efficiency = p.images_per_s_per_gpu / b.images_per_s_per_gpu
    return p


__all__ = [
    "CALIBRATIONS",
    "Calibration",
    "ComputeSource",
    "MeasuredStep",
    "StepPrediction",
    "blocking_for",
    "check_calibration",
    "choose_calibration",
    "compute_from",
    "compute_from_flops",
    "compute_of",
    "efficiencies_from_runs",
    "efficiency_from_runs",
    "measured_step",
    "no_calibration",
    "peak_tflops",
    "predict",
    "profile_calibration",
    "run_ips",
    "profile_path",
    "read_check",
    "read_fits",
    "read_profile",
    "read_step_fits",
    "scenario_of_run",
]
