"""A check's calibration as an input of a prediction: check.json read and validated in one place (its
system, precisions and model; each fit's keys, numbers and standard errors), its usable fits turned into a
Calibration over the profile's defaults, with the fits' 90% ends where they carry standard errors. Bad
input is errors.UserError: one line naming the file, the fit and the key."""

from __future__ import annotations

import dataclasses
import json
import math
import os

from vit_scale.errors import UserError
from vit_scale.models import get_spec
from vit_scale.planning import step_fit
from vit_scale.planning.alpha_beta import (
    COLLECTIVES,
    MIN_SIZES,
    SCOPES,
    Fit,
    Link,
    Network,
)
from vit_scale.planning.calibration import Calibration
from vit_scale.planning.shapes import Shape
from vit_scale.record.check_file import CHECK_SCHEMAS  # 1: fits at one group size each; 2: step_fits as well

STEP_FIT_KEYS = step_fit.STEP_FIT_KEYS
FIT_KEYS = ("collective", "scope", "ranks", "alpha_us", "bus_gbps", "max_rel_residual", "sizes", "flags")


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
        base = Network(
            by_scope["intra"],
            by_scope["inter"],
            source=f"fits of {os.path.basename(path)}",
            backend=str(data.get("backend") or ""),
        )
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
        base = Network(
            by_scope["intra"],
            by_scope["inter"],
            source=f"fits of {os.path.basename(path)}",
            backend=str(data.get("backend") or ""),
        )
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
