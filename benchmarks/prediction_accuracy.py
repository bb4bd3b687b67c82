"""How close the predicted weak-scaling curve comes to the measured one: on this machine (--local, the
default), or against the seed-003 authors' published Frontier curves (--frontier).

    python benchmarks/prediction_accuracy.py --frontier

--frontier: predicts every point of tests/data/frontier_published.json (FSDP1, bf16, batch 32,
activation checkpointing, 2-128 nodes of 8 GCDs; DDP and the authors' 5B left out) from the Frontier
profile's network defaults and each series' own baseline rung (vit_scale/planning/published.py), and
prints per point the measured and predicted images/s per GCD and efficiency, then issue 28's figures
(median |error| over all points and over those below 0.8 efficiency, the largest error, each crossing,
the peak-memory error) with the no-communication baseline's score beside them. Seconds, no runs.

--local (the default):

    python benchmarks/prediction_accuracy.py [--dir DIR] [--keep] [--check-json PATH] [--study-dir PATH]
                                             [--nodes 1,2,4] [--no-unshaped]

The local part runs on isolated emulated nodes (vit_scale/cluster/emulation.py: each node's ranks in a
network namespace of their own, joined through a bridge at the `local` profile's shaped inter-node
bandwidth, each node within a CPU quota); where this machine cannot make them (no root, no cgroup cpu
controller) it says so and runs on the shared emulation, whose figures say nothing of communication.

1. Weak scaling with nothing limiting it: DDP on 1 and 4 nodes of the `local-unshaped` profile (the
   same nodes, links not shaped); DDP's images/s per node at 4 nodes against 1, bar 85%.
2. `vit-scale check` in full mode on 2 nodes of `local` (its size sweep and alpha-beta fits: the
   calibration); its across-nodes fits against the shaped bandwidth (bar 15%).
3. The local study (configs/studies/local.yaml: vit_micro, FULL_SHARD and HYBRID_2GPU) over --nodes (1, 2, 4).
4. Every point beyond 1 node predicted with vit_scale.planning.predict: the check's fits as the
   calibration, the 1-node rung as the compute (each strategy its own), gloo's blocking collectives.
   Prints per strategy and node count the measured and predicted images/s and the error (measured /
   predicted - 1), the median and the largest |error|, and the same for the no-communication
   prediction (the compute-bound ceiling) on the same points. Bars: median |error| at most 20%, and at
   most half the no-communication median (the communication model, not the compute, is what is scored).
5. How the strategies order themselves at the largest node count against the bytes each sends across
   nodes as the planner counts them (vit_scale/planning/communication.py).
6. Each 1-node rung predicted from the check's GEMMs (its `compute`: the Block's matrix multiplies at
   the study's model, batch and precision, scaled to the step) beside its measured step; the flat
   default (40% of the profile's peak) is printed beside it as n/a: a CPU profile has no peak. A
   figure, not a bar: the GEMMs leave out what FLOPs do not count, so the prediction is a lower bound.

--check-json and --study-dir reuse what an earlier run wrote (with --keep) instead of running them
again. About 20 minutes on a 2-core machine; the machine's load is printed beside every figure, since
on a shared CPU it moves the check's fits, the study's speeds and the quotas' effect alike.
Exit code 0 when every bar is met, 1 when not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vit_scale.planning import predict as pr  # noqa: E402
from vit_scale.record import reader  # noqa: E402

BAR = 0.20  # median absolute error over the points beyond 1 node, isolated emulation (issue 29)
COVERAGE_BAR = 0.80  # share of the points beyond 1 node inside their 90% band (issue 37) ...
WIDTH_BAR = 1.5  # ... with the bands' median width (high / low) under this
NO_COMM_SHARE = 0.5  # ... and at most this share of the no-communication prediction's median
WEAK_BAR = 0.85  # DDP's images/s per node, 4 nodes against 1, links not shaped
LINK_BAR = 0.15  # the check's across-nodes bandwidth against the shaped one
STUDY = os.path.join(ROOT, "configs", "studies", "local.yaml")


# Sinha et al. (SC22, arXiv 2208.11035v3): the worst cluster and application's variation between GPUs of one SKU
WORST_DEVICE_SPREAD = 0.22


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def vit_scale(args: list, cwd: str) -> float:
    """Runs `python -m vit_scale ARGS` with this checkout first on the path; its seconds."""
    env = {
        **os.environ,
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "VIT_SCALE_PYTHON": sys.executable,
    }
    started = time.perf_counter()
    print(f"$ vit-scale {' '.join(args)}   ({load()})", flush=True)
    proc = subprocess.run([sys.executable, "-m", "vit_scale", *args], cwd=cwd, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):  # 1: a check line or a run failed; the rest may still be usable
        raise SystemExit(f"vit-scale {args[0]} ended with exit code {proc.returncode}")
    return seconds


def rows_for(runs: list, cal: pr.Calibration, comp: pr.ComputeSource) -> list[dict]:
    rows = []
    for run in runs:
        step = pr.measured_step(run)
        if step is None:
            continue
        p = pr.predict([step.scenario], cal, comp, step.blocking, options=[step.options])[0]
        measured = step.scenario.batch_size * step.scenario.world / step.step_s
        b = p.breakdown
        band = (p.band or {}).get("images_per_s")
        rows.append(
            {
                "strategy": step.scenario.strategy,
                "nodes": step.scenario.nodes,
                "measured": measured,
                "predicted": p.images_per_s,
                "error": measured / p.images_per_s - 1 if p.images_per_s else None,
                "exposed_ms": (b.exposed_intra_s + b.exposed_inter_s) * 1e3 if b else None,
                "compute_ms": (b.forward_s + b.backward_s) * 1e3 if b else None,
                "step_ms": step.step_s * 1e3,
                # the 90% band from the check's standard errors, the profile's ranges and the rung's repeats
                "low": band[0] if band else None,
                "high": band[1] if band else None,
            }
        )
    return sorted(rows, key=lambda r: (r["strategy"], r["nodes"]))


def gemm_rungs(runs: list, cal: pr.Calibration, check_path: str, peak: float | None) -> None:
    """Step 6: each 1-node rung the check's GEMMs cover, measured and predicted from them, with the flat
    default beside it where the profile has a peak."""
    from vit_scale.planning.compute import read_compute, why_not

    gemms = read_compute(pr.read_check(check_path), check_path)
    print(f"\n1-node step from the check's GEMMs ({len(gemms)} entry(ies) in {check_path}):")
    flat = pr.compute_from_flops(peak, 0.4) if peak else None
    for run in runs:
        step = pr.measured_step(run)
        if step is None or step.scenario.nodes != 1:
            continue
        sc = step.scenario
        why = why_not(gemms, sc)
        if why:
            print(f"  {sc.strategy}: {why}")
            continue
        got = pr.predict([sc], cal, pr.ComputeSource(gemms=gemms), step.blocking, options=[step.options])[0]
        base = pr.predict([sc], cal, flat, step.blocking)[0].breakdown.step_s if flat else None
        b = got.breakdown
        print(
            f"  {sc.model} {sc.strategy} batch {sc.batch_size}: measured {step.step_s * 1e3:.1f} ms, from the GEMMs "
            f"{b.step_s * 1e3:.1f} ms (compute {(b.forward_s + b.backward_s) * 1e3:.1f} ms), flat 40% of peak "
            f"{'n/a (no peak: a CPU)' if base is None else f'{base * 1e3:.1f} ms'}"
        )


def coverage(rows: list) -> tuple[float | None, float | None, int]:
    """(share inside their band, the bands' median width high/low, points) over the points beyond 1 node
    that have a band; (None, None, 0) where none has."""
    banded = [r for r in rows if r["nodes"] > 1 and r["low"] is not None and r["low"] > 0]
    if not banded:
        return None, None, 0
    inside = sum(r["low"] <= r["measured"] <= r["high"] for r in banded) / len(banded)
    return inside, statistics.median(r["high"] / r["low"] for r in banded), len(banded)


def beyond_one(rows: list) -> list[float]:
    return [abs(r["error"]) for r in rows if r["nodes"] > 1 and r["error"] is not None]


def median_abs(rows: list) -> float | None:
    errors = beyond_one(rows)
    return statistics.median(errors) if errors else None


def emulation_of(runs: list) -> str:
    kinds = sorted({str((r.start.get("world") or {}).get("emulation")) for r in runs})
    return ", ".join(kinds)


def per_node_ips(runs: list) -> dict:
    """(strategy, nodes) -> images/s per node of the ok runs (the mean where a point has several)."""
    found: dict = {}
    for run in runs:
        step = pr.measured_step(run)
        if step is not None:
            sc = step.scenario
            found.setdefault((sc.strategy, sc.nodes), []).append(sc.batch_size * sc.world / step.step_s / sc.nodes)
    return {k: statistics.mean(v) for k, v in found.items()}


def unshaped_weak_scaling(work: str) -> bool:
    """DDP on 1 and 4 isolated nodes with links not shaped: per node, 4 against 1."""
    out = os.path.join(work, "unshaped")
    s = vit_scale(
        ["study", "--system", "local-unshaped", "--config", STUDY, "--study", "unshaped", "--strategies", "DDP"]
        + ["--nodes", "1,4", "--out", out, "--no-analysis"],
        work,
    )
    runs = reader.collect([os.path.join(out, "unshaped")]).runs
    ips = per_node_ips(runs)
    one, four = ips.get(("DDP", 1)), ips.get(("DDP", 4))
    if not one or not four:
        print(f"unshaped DDP: a run failed ({s:.0f} s)")
        return False
    ratio = four / one
    print(
        f"unshaped links, emulation {emulation_of(runs)}: DDP {one:.1f} images/s per node on 1 node, {four:.1f} on "
        f"4: {ratio:.0%} (bar {WEAK_BAR:.0%}; {s:.0f} s; {load()})",
        flush=True,
    )
    return ratio >= WEAK_BAR


def link_fits(check_path: str, gbps: float | None) -> bool:
    """The check's across-nodes and within-node fits, the across-nodes ones against the shaped rate."""
    import json

    with open(check_path) as f:
        fits = json.load(f).get("fits") or []
    ok, seen = True, False
    for fit in sorted(fits, key=lambda f: (f.get("scope", ""), f.get("collective", ""))):
        bw = fit.get("bus_gbps")
        if bw is None:
            continue
        text = (
            f"  check fit {fit.get('collective', '?'):15} {fit.get('scope', '?'):6} ({fit.get('ranks')} ranks): "
            f"{bw * 8:8.3f} Gbit/s bus bandwidth, alpha {fit.get('alpha_us', 0) / 1e3:6.2f} ms"
        )
        if fit.get("scope") == "inter" and gbps:
            miss = bw * 8 / gbps - 1
            text += f"  (shaped {gbps:g} Gbit/s: {miss:+.0%})"
            # gloo's reduce-scatter reaches about half the link's rate by the ring's count (measured): no link measure
            if fit.get("collective") != "reduce_scatter":
                seen = True
                ok = ok and abs(miss) <= LINK_BAR
        print(text)
    return ok and (seen or not gbps)


def crossing_order(runs: list, nodes: int) -> bool:
    """Measured images/s at `nodes` beside the bytes each strategy sends across nodes as the planner counts
    them; True when sending fewer bytes never goes with fewer images/s, beyond 5% (strategies that send
    the same bytes are not ordered)."""
    from vit_scale.planning import communication, scenario

    table = []
    for run in runs:
        step = pr.measured_step(run)
        if step is None or step.scenario.nodes != nodes:
            continue
        sc = step.scenario
        crossing = communication.predict(sc, scenario.layout(sc))["inter_node"] * sc.gpus_per_node
        table.append((crossing, sc.batch_size * sc.world / step.step_s, sc.strategy))
    if not table:
        return False
    table.sort()
    print(f"\nat {nodes} nodes: images/s against the bytes a node sends across nodes a step (the planner's count)")
    for crossing, ips, strategy in table:
        print(f"  {strategy:14} {crossing / 1e6:7.3f} MB {ips:9.1f} images/s")
    ordered = all(b[1] <= a[1] * 1.05 for i, a in enumerate(table) for b in table[i + 1 :] if b[0] > a[0] * 1.05)
    print(f"  ordered by bytes across nodes: {'yes' if ordered else 'no'} ({load()})")
    return ordered


def local_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where to run (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the directory")
    ap.add_argument("--check-json", help="an earlier check.json instead of running the check")
    ap.add_argument("--study-dir", help="an earlier local study's directory instead of running it")
    ap.add_argument("--nodes", default="1,2,4", help="the study's node counts (default 1,2,4)")
    ap.add_argument("--no-unshaped", action="store_true", help="leave out the unshaped weak-scaling part")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="prediction-accuracy-")
    os.makedirs(work, exist_ok=True)
    print(f"machine: {os.uname().nodename}, {load()}; in {work}")
    met = {}
    try:
        if not args.no_unshaped and not args.study_dir:
            met["unshaped weak scaling"] = unshaped_weak_scaling(work)
        check = args.check_json or os.path.join(work, "check", "check.json")
        if not args.check_json:
            # the strategy labels do not feed the calibration: DDP alone keeps the check short
            out = os.path.join(work, "check")
            s = vit_scale(["check", "--system", "local", "--nodes", "2", "--strategies", "DDP", "--out", out], work)
            print(f"check: {s:.0f} s", flush=True)
        profile = pr.profile_path("local")
        from vit_scale.cluster.systems import read_system

        met["check's across-nodes fits"] = link_fits(check, read_system("local").emulation.inter_node_gbps)
        study = args.study_dir or os.path.join(work, "runs", "local")
        if not args.study_dir:
            s = vit_scale(
                ["study", "--system", "local", "--config", STUDY, "--study", "local", "--nodes", args.nodes]
                + ["--out", os.path.join(work, "runs"), "--no-analysis"],
                work,
            )
            print(f"study: {s:.0f} s", flush=True)
        runs = reader.collect([study]).runs
        print(f"emulation of the study's runs: {emulation_of(runs)}")
        comp = pr.compute_from(study, runs=runs)
        # as the analysis predicts a run: its system's device_spread widens the bands beyond the rung
        comp.device_spread = pr.device_spread(profile) or comp.device_spread
        models = sorted({r.start["model"]["name"] for r in runs})
        precisions = sorted({pr.run_precision(r.start) for r in runs})
        calibrations = {
            "check": pr.choose_calibration(check, profile, system="local", models=models, precisions=precisions),
            "profile": pr.choose_calibration(None, profile, system="local"),
            "none": pr.no_calibration("for comparison"),
        }
        results = {name: rows_for(runs, cal, comp) for name, cal in calibrations.items()}
        print(f"\ncalibration: {calibrations['check'].describe()}")
        print(f"compute: {comp.describe()}")
        print(
            f"\n{'strategy':14} {'nodes':>5} {'measured':>10} {'predicted':>10} {'error':>8} "
            f"{'step ms':>8} {'compute ms':>10} {'exposed ms':>10}   (images/s in total)"
        )
        for r in results["check"]:
            band = "" if r["low"] is None else f"  band {r['low']:.1f}-{r['high']:.1f}"
            print(
                f"{r['strategy']:14} {r['nodes']:5d} {r['measured']:10.1f} {r['predicted']:10.1f} "
                f"{r['error']:+8.1%} {r['step_ms']:8.1f} {r['compute_ms']:10.1f} {r['exposed_ms']:10.1f}{band}"
            )
        print()
        for name, rows in results.items():
            m, errors = median_abs(rows), beyond_one(rows)
            print(
                f"points beyond 1 node, calibration {name:7}: median |error| {'n/a' if m is None else f'{m:.1%}'}, "
                f"largest {'n/a' if not errors else f'{max(errors):.1%}'} ({len(errors)} points)"
            )
        inside, width, n = coverage(results["check"])
        if inside is None:
            print("no band: neither the check's fits nor the profile carry a spread")
        else:
            print(
                f"points beyond 1 node inside their 90% band: {inside:.0%} of {n} (bar {COVERAGE_BAR:.0%}), the bands' "
                f"median width {width:.2f} (bar < {WIDTH_BAR})"
            )
        met[f"coverage >= {COVERAGE_BAR:.0%}"] = inside is not None and inside >= COVERAGE_BAR
        met[f"median band width < {WIDTH_BAR}"] = width is not None and width < WIDTH_BAR
        m, none = median_abs(results["check"]), median_abs(results["none"])
        met[f"median |error| <= {BAR:.0%}"] = m is not None and m <= BAR
        met[f"<= {NO_COMM_SHARE:.0%} of the no-communication median"] = (
            m is not None and none is not None and m <= NO_COMM_SHARE * none
        )
        nodes = max(int(n) for n in args.nodes.split(","))
        met[f"ordered by bytes across nodes at {nodes} nodes"] = crossing_order(runs, nodes)
        gemm_rungs(runs, calibrations["check"], check, pr.peak_tflops(profile, precisions[0]))
        print()
        for what, ok in met.items():
            print(f"bar {what}: {'met' if ok else 'missed'}")
        print(f"({load()} at the end)")
        return 0 if all(met.values()) else 1
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def frontier_main() -> int:
    """The Frontier section: the model against the published curves. Exit 0 when issue 28's bars are met."""
    from vit_scale.planning import published as pub
    from vit_scale.planning.alpha_beta import read_network
    from vit_scale.planning.input_profile import device_spread

    started = time.perf_counter()
    profile = os.path.join(ROOT, "configs", "systems", "frontier.yaml")
    net = read_network(profile)
    devices = device_spread(profile)
    data = pub.load()
    rows = pub.speed_rows(data, net, devices)
    mem = pub.memory_rows(data)
    s = pub.summary(rows, mem)
    print(f"network: {net.source}; published data: {data['repository']} @ {data['commit'][:12]}")
    print(
        f"ranges: {', '.join(r.text() for r in net.ranges) or 'none (no band)'}; "
        f"beyond the baseline rung: {devices.text() if devices else 'no device spread'} (device_spread)"
    )
    print(
        f"\n{'model':9} {'strategy':14} {'nodes':>5} {'measured':>9} {'predicted':>9} {'90% band':>15} {'in':>3} "
        f"{'error':>7} {'eff meas':>8} {'eff pred':>8} {'no-comm':>8}  (images/s per GCD)"
    )
    for r in rows:
        band = "" if r.low is None else f"{r.low:.2f}-{r.high:.2f}"
        inside = "" if r.inside is None else ("yes" if r.inside else "NO")
        print(
            f"{r.model:9} {r.strategy:14} {r.nodes:5d} {r.measured:9.2f} {r.predicted:9.2f} {band:>15} {inside:>3} "
            f"{r.error:+7.1%} {r.measured_efficiency:8.2f} {r.predicted_efficiency:8.2f} {r.no_comm_error:+8.1%}"
            + ("  extrapolated" if r.extrapolated else "")
        )
    print("\ncrossings (the node count from which FULL_SHARD stays >5% below the hybrid; -: not within 2-128 nodes):")
    for c in s["crossings"]:
        factor = pub.crossing_factor(c)
        where = ""
        if "earliest" in c:
            if c["earliest"] is None:
                span = "none at any reading"
            else:
                span = f"{c['earliest']} to {c['latest'] or 'none (at some reading)'}"
            where = f"  predicted range: {span}; measured {'inside' if pub.crossing_in_range(c) else 'outside'}"
        print(
            f"  {c['model']:9} {c['hybrid']:14} measured {c['measured'] or '-':>4}  predicted "
            f"{c['predicted'] or '-':>4}  factor {'miss' if factor is None else f'{factor:.1f}'}{where}"
        )
    print("\npeak active memory per GCD (GiB):")
    for m in mem:
        print(
            f"  {m.model:9} {m.strategy:14} {m.nodes:4d} measured {m.measured_gib:7.2f} "
            f"predicted {m.predicted_gib:7.2f} {m.error:+6.1%}"
        )
    low64 = sorted(abs(r.error) for r in rows if r.measured_efficiency < pub.LOW_EFFICIENCY and r.nodes <= 64)
    n_cross = len(s["crossings"])
    # (name, model's figure, no-communication's, bar, format); a bar ("<=", x) is a ceiling, (">=", x) a floor
    figures = [
        ("median |error|, all points", s["median_abs_error"], s["no_comm_median_abs_error"], ("<=", 0.15), "%"),
        (
            "median |error|, efficiency < 0.8",
            s["median_abs_error_low_efficiency"],
            s["no_comm_median_abs_error_low_efficiency"],
            ("<=", 0.25),
            "%",
        ),
        ("  the same, up to 64 nodes", statistics.median(low64), None, ("<=", 0.25), "%"),
        ("max |error|", s["max_abs_error"], s["no_comm_max_abs_error"], None, "%"),
        ("largest crossing factor, both crossed", s["max_crossing_factor"], None, ("<=", 2.0), "x"),
        (f"crossings missed (of {n_cross})", s["crossings_missed"], None, ("<=", 0), "n"),
    ]
    if s["coverage"] is not None:
        figures += [
            ("points inside their 90% band", s["coverage"], None, (">=", 0.80), "%"),
            ("  the same, efficiency < 0.8", s["coverage_low_efficiency"], None, (">=", 0.70), "%"),
            ("median band width (high/low)", s["median_width"], None, ("<=", 1.3), "x"),
            ("  the same, efficiency < 0.8", s["median_width_low_efficiency"], None, None, "x"),
            (f"crossings inside their range (of {n_cross})", s["crossings_in_range"], None, None, "n"),
        ]
        # the same bands with the device spread of the worst cluster the source measured (22%), beside the value
        worst = pub.summary(pub.speed_rows(data, net, WORST_DEVICE_SPREAD), mem)
        figures += [
            (f"  inside, devices +-{WORST_DEVICE_SPREAD:.0%}", worst["coverage"], None, None, "%"),
            (f"  width, devices +-{WORST_DEVICE_SPREAD:.0%}", worst["median_width"], None, None, "x"),
        ]
    figures.append(("max |memory error|", s["memory_max_abs_error"], None, ("<=", 0.10), "%"))
    formats = {"%": "{:.1%}", "x": "{:.2f}x", "n": "{:g}"}
    print(f"\n{'figure':38} {'model':>8} {'no-comm':>8} {'bar':>8}")
    met = True
    for name, value, base, bar, kind in figures:
        ok = bar is None or (value <= bar[1] if bar[0] == "<=" else value >= bar[1])
        met = met and ok
        fmt = formats[kind].format
        print(
            f"{name:38} {fmt(value):>8} {'' if base is None else fmt(base):>8} "
            f"{'' if bar is None else bar[0] + ' ' + fmt(bar[1]):>8}{'' if ok else '  missed'}"
        )
    print(
        f"\n{s['points']} points ({s['extrapolated_points']} beyond the largest group the profile's sources "
        f"measured), {s['memory_points']} memory points; {time.perf_counter() - started:.1f} s, {load()}"
    )
    return 0 if met else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--frontier" in argv:
        return frontier_main()
    return local_main([a for a in argv if a != "--local"])


if __name__ == "__main__":
    sys.exit(main())
