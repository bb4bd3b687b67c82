"""The check's facts -> its lines: what holds, what is broken, and what to do about it. No torch.

`lines(check)` reads the dict the orchestrator assembles (check.json without its `lines`): the
request (system, nodes, labels, ...), the launches, and the facts the worker's rank 0 wrote.
"""

from __future__ import annotations

from vit_scale.check.collectives import FIT_SCOPE, NAMED_SIZES
from vit_scale.check.lines import Line
from vit_scale.check.meter import GPU_OVERHEAD_FLOOR, TIMING_TOLERANCE
from vit_scale.text import human_bytes, human_seconds

SCOPE_TEXT = {"node": "within a node", "world": "across nodes"}


def lines(check: dict) -> list[Line]:
    facts = check.get("facts") or {}
    out = launch_lines(check, facts)
    if facts.get("world") is None:
        return out + not_run_lines(check, facts, "the check's ranks never reported")
    if "environment" in (check.get("parts") or ["environment"]):
        out += environment_lines(check, facts)
    out += node_lines(check)
    out += interconnect_lines(check, facts)
    out += fit_lines(check, facts)
    out += compute_lines(check)
    out += strategy_lines(check, facts)
    out += meter_lines(check, facts)
    return out


def last_log(check: dict) -> str:
    attempts = (check.get("launch") or {}).get("attempts") or []
    return attempts[-1]["log"] if attempts else "the check's log"


# ---------------------------------------------------------------- launch


def launch_lines(check: dict, facts: dict) -> list[Line]:
    if facts.get("fatal"):
        return [Line("devices", "fail", facts["fatal"])]
    if facts.get("world") is not None:
        return []
    attempt = ((check.get("launch") or {}).get("attempts") or [{}])[-1]
    return [
        Line(
            "launch",
            "fail",
            f"the check's ranks did not start or died before reporting (exit "
            f"{attempt.get('code', '?')}): {attempt.get('last_line') or 'no output'}",
            f"see {attempt.get('log', 'the log')}",
        )
    ]


# ---------------------------------------------------------------- environment


def environment_lines(check: dict, facts: dict) -> list[Line]:
    out = []
    if "environment" not in facts.get("parts_done", []):
        return [
            Line("environment", "fail", "the ranks ended before reporting their environment", f"see {last_log(check)}")
        ]
    out.append(versions_line(facts))
    modules = facts.get("modules") or []
    out.append(
        Line("modules", "info", ", ".join(modules) if modules else "none loaded (LOADEDMODULES is empty)", needed=False)
    )
    out.append(devices_line(check, facts))
    out.append(transport_line(check, facts))
    out += kernel_lines(check, facts)
    return out


def versions_line(facts: dict) -> Line:
    v = facts.get("versions") or {}
    world = facts["world"]
    parts = [f"python {v.get('python')}", f"torch {v.get('torch')}"]
    if v.get("cuda"):
        parts.append(f"CUDA {v['cuda']}")
    if v.get("hip"):
        parts.append(f"ROCm/HIP {v['hip']}")
    if v.get("nccl"):
        parts.append(f"{'RCCL' if v.get('hip') else 'NCCL'} {v['nccl']}")
    if v.get("driver"):
        parts.append(f"driver {v['driver']}")
    parts += [f"{name} {v[name]}" for name in ("deepspeed", "colossalai") if v.get(name)]
    return Line("versions", "info", f"{', '.join(parts)}; backend {world['backend']}", needed=False)


def devices_line(check: dict, facts: dict) -> Line:
    world, ranks = facts["world"], facts.get("ranks") or []
    asked = check["nodes"] * check["ranks_per_node"]
    nodes = list(dict.fromkeys(r["node"] for r in ranks))
    if world["world_size"] != asked:
        return Line(
            "devices",
            "fail",
            f"{world['world_size']} ranks started, {asked} asked for "
            f"({check['nodes']} nodes x {check['ranks_per_node']})",
            "check the allocation's size (sbatch -N, --ntasks-per-node) against --nodes and --ranks-per-node",
        )
    if len(nodes) != check["nodes"]:
        return Line(
            "devices",
            "fail",
            f"the ranks report {len(nodes)} node(s) ({', '.join(nodes)}), {check['nodes']} asked for",
            "check that srun spreads the ranks over the allocation's nodes",
        )
    if check.get("backend") == "nccl":
        blind = [r for r in ranks if r["device_type"] == "cpu"]
        if blind:
            r = blind[0]
            visible = " ".join(f"{k}={v}" for k, v in r["visible_devices"].items()) or "no *_VISIBLE_DEVICES set"
            return Line(
                "devices",
                "fail",
                f"{len(blind)} of {len(ranks)} ranks see no GPU (first: rank {r['rank']} "
                f"on {r['node']}, {visible}), so they would run gloo on the CPU",
                "ask for the GPUs (sbatch --gpus-per-node / the system's srun flags) and check that the env "
                "script does not hide them",
            )
        shared = shared_devices(ranks)
        if shared:
            (node, device), sharing = shared[0]
            return Line(
                "devices",
                "fail",
                f"ranks {', '.join(map(str, sharing))} on {node} drive the same GPU ({device})",
                "give each rank its own GPU: one rank per GPU a node (--ranks-per-node), and the system's "
                "srun flags binding them (--gpus-per-task=1 --gpu-bind=closest, or every GPU visible)",
            )
    return Line(
        "devices",
        "ok",
        f"{len(ranks)} ranks on {len(nodes)} node{'s' if len(nodes) > 1 else ''} "
        f"({', '.join(nodes[:4])}"
        f"{' ...' if len(nodes) > 4 else ''}): {binding(ranks, nodes[0] if nodes else '')}",
    )


def shared_devices(ranks: list) -> list:
    users: dict = {}
    for r in ranks:
        # no identity (no PCI address, a placeholder UUID): nothing to compare; a device index is
        # 0 on every rank bound to a GPU of its own
        if r["device_type"] != "cpu" and r["device_id"]:
            users.setdefault((r["node"], r["device_id"]), []).append(r["rank"])
    return [(key, sharing) for key, sharing in users.items() if len(sharing) > 1]


def binding(ranks: list, node: str) -> str:
    """Which device and cores each rank of the first node has."""
    mine = [r for r in ranks if r["node"] == node]
    device = mine[0]["device_name"] if mine and mine[0]["device_name"] else (mine[0]["device_type"] if mine else "?")
    each = [
        f"r{r['rank']} " + (f"gpu{r['device_index']} " if r["device_type"] != "cpu" else "") + f"cpus {r['cpus']}"
        for r in mine[:8]
    ]
    return f"{device}; {node}: " + ", ".join(each) + (" ..." if len(mine) > 8 else "")


def transport_line(check: dict, facts: dict) -> Line:
    """gloo has TCP whatever the node count. NCCL's network is known for certain only where ranks of
    different nodes connected: on one node the network it loaded is a hint (a one-node step on
    Frontier has no Slingshot network, so RCCL loads Socket there), said but not failed."""
    t = check.get("transport") or {}
    expected, observed = t.get("expected") or [], t.get("observed") or []
    certain = check["nodes"] > 1 or t.get("backend") == "gloo"
    what = "between nodes" if check["nodes"] > 1 else "for a job over several nodes"
    hint = "" if certain else "; on one node this is what NCCL loaded, not what connects nodes: check 2 nodes"
    if not observed:
        return Line(
            "transport",
            "fail" if certain else "warn",
            f"{t.get('backend', '?')} said nothing about its network (expected {' or '.join(expected)})",
            f"NCCL_DEBUG=INFO was set for the check; see {last_log(check)} and whether the env script "
            f"resets NCCL_DEBUG{hint}",
            needed=certain,
        )
    source = ", ".join(t.get("between_nodes") or t.get("networks") or observed)
    unexpected = [o for o in observed if o not in expected]
    if unexpected:
        fix = (
            "gloo has only TCP: run the GPU system's profile (nccl) for IB or OFI, or say --expect-transport tcp"
            if t.get("backend") == "gloo"
            else "load the site's network plugin (aws-ofi-rccl/aws-ofi-nccl: env/frontier.sh, NCCL_NET_PLUGIN), check "
            "NCCL_IB_HCA and NCCL_SOCKET_IFNAME, or say --expect-transport if this is the site's network"
        )
        return Line(
            "transport",
            "fail" if certain else "warn",
            f"{' and '.join(unexpected)} {what} ({t.get('backend')}: {source}), expected {' or '.join(expected)}",
            fix + hint,
            needed=certain,
        )
    return Line(
        "transport",
        "ok",
        f"{', '.join(observed)} {what} ({t.get('backend')}: {source}), expected {' or '.join(expected)}",
    )


def kernel_lines(check: dict, facts: dict) -> list[Line]:
    by_key: dict = {}
    out = []
    for node in facts.get("kernels") or []:
        if node.get("error"):
            out.append(
                Line(
                    "kernels",
                    "fail",
                    f"could not look for the kernels on {node['node']}: {node['error']}",
                    "run vit-scale prepare on a compute node; it names what is missing",
                )
            )
            continue
        for kernel in node["kernels"]:
            entry = by_key.setdefault(
                kernel["key"],
                {"labels": kernel["labels"], "missing": [], "error": None, "dir": kernel.get("build_dir")},
            )
            if kernel.get("error"):
                entry["error"] = kernel["error"]
            elif not kernel["built"]:
                entry["missing"].append(node["node"])
                entry["dir"] = kernel.get("build_dir")
    if not by_key and not out:
        return [Line("kernels", "ok", "no JIT kernel needed by these strategies here")]
    asked = {a["label"] for a in check.get("labels") or [] if a.get("needed")}
    for key, entry in by_key.items():
        labels = ",".join(entry["labels"])
        # like a refusal: broken for the labels asked for, said for those run only because every label is
        needed = bool(asked & set(entry["labels"]))
        bad = "fail" if needed else "warn"
        if entry["error"]:
            out.append(
                Line(
                    f"kernel {key}",
                    bad,
                    f"{entry['error']} (needed by {labels})",
                    f"install it (pip install 'vit-scale[{key.split('.')[0]}]') or leave out {labels}",
                    needed=needed,
                )
            )
        elif entry["missing"]:
            out.append(
                Line(
                    f"kernel {key}",
                    bad,
                    f"not built on {', '.join(entry['missing'])} (looked in {entry['dir']}), needed by {labels}",
                    f"run: vit-scale prepare --strategies {labels} (on a compute node; jobs/weak_scaling.sh "
                    f"does it before the first run)",
                    needed=needed,
                )
            )
        else:
            out.append(Line(f"kernel {key}", "ok", f"built (needed by {labels})"))
    return out


# ---------------------------------------------------------------- nodes


def node_lines(check: dict) -> list[Line]:
    """The nodes part (check.json's `per_node`, vit_scale.check.nodes): a line of every node's figures,
    a FAIL line for each node the rule names with the `--exclude=` list to leave them out, and with two
    nodes a warning that the pair test cannot say which of them is slow."""
    from vit_scale.check.nodes import FIGURES, UNITS

    found = check.get("per_node")
    if found is None:
        if "nodes" in (check.get("parts") or []):
            return [Line("nodes", "fail", "the ranks ended before every node was measured", f"see {last_log(check)}")]
        return []
    if found.get("error"):
        return [Line("nodes", "fail", found["error"], f"see {last_log(check)}")]
    hosts = found.get("hosts") or {}
    median = found.get("median") or {}
    parts = []
    for part, key in FIGURES.items():
        values = [h[key] for h in hosts.values() if h.get(key) is not None]
        if values:
            parts.append(
                f"{part} median {median[key]:.3g} {UNITS[part]} ({min(values):.3g} to {max(values):.3g})"
                + (f" at {human_bytes(found['exchange_bytes'])} a rank" if part == "link" else "")
            )
    errors = found.get("errors") or []
    text = f"{len(hosts)} node{'s' if len(hosts) != 1 else ''}: " + ("; ".join(parts) or "no figure")
    text += f" ({found.get('seconds', 0):.1f} s)" + (f"; compute probe failed: {errors[0]}" if errors else "")
    out = [Line("nodes", "warn" if errors else "ok", text, needed=False)]
    for named in found.get("slow") or []:
        unit = UNITS[named["figure"]]
        out.append(
            Line(
                f"node {named['node']}",
                "fail",
                f"{named['figure']} {named['value']:.3g} {unit}, {named['share']:.0%} of the median node's "
                f"{named['median']:.3g} {unit}",
                f"leave it out: sbatch or srun --exclude={found['exclude']} (or vit-scale study --check "
                "--exclude-slow-nodes)",
            )
        )
    if found.get("exclude"):
        out.append(Line("exclude", "info", f"--exclude={found['exclude']}", needed=False))
    pair = found.get("undecidable") or []
    if pair:
        out.append(
            Line(
                "nodes pair",
                "warn",
                f"{' and '.join(pair)}: with two nodes the pair test cannot say which one a slow link is on",
                "check 3 nodes or more to name a slow node's link",
                needed=False,
            )
        )
    return out


# ---------------------------------------------------------------- interconnect


def interconnect_lines(check: dict, facts: dict) -> list[Line]:
    found = facts.get("interconnect")
    if found is None:
        if "interconnect" in (check.get("parts") or []):
            return [
                Line(
                    "collectives",
                    "fail",
                    "the ranks ended before the collectives were measured",
                    f"see {last_log(check)}",
                )
            ]
        return []
    if found.get("error"):
        return [Line("collectives", "fail", found["error"], f"see {last_log(check)}")]
    measurements = found.get("measurements") or []
    if not measurements:
        return [Line("collectives", "skipped", "one rank: nothing to measure", needed=False)]
    out = []
    for collective in dict.fromkeys(m["collective"] for m in measurements):
        mine = [m for m in measurements if m["collective"] == collective]
        wrong = [m for m in mine if not m["correct"]]
        if wrong:
            m = wrong[0]
            out.append(
                Line(
                    collective,
                    "fail",
                    f"wrong result {SCOPE_TEXT[m['scope']]} at {human_bytes(m['bytes'])} ({m['ranks']} ranks)",
                    "the interconnect or the collective library corrupts data: rerun, then report the "
                    "nodes to the site",
                )
            )
            continue
        out.append(
            Line(
                collective,
                "ok",
                "; ".join(scope_text(mine, scope) for scope in dict.fromkeys(m["scope"] for m in mine)),
            )
        )
    return out


def scope_text(measurements: list, scope: str) -> str:
    mine = [m for m in measurements if m["scope"] == scope]
    largest = max(m["ranks"] for m in mine)
    mine = [m for m in mine if m["ranks"] == largest]  # the widest group of the scope: what the strategies span
    big = [m for m in mine if m["size"] in NAMED_SIZES]
    small = min((m for m in mine if m["size"] == "latency"), key=lambda m: m["bytes"], default=None)
    text = f"{SCOPE_TEXT[scope]} ({mine[0]['ranks']} ranks): busbw " + ", ".join(
        f"{m['busbw_gbs']:.3g} GB/s at {human_bytes(m['bytes'])} ({m['what']})" for m in big
    )
    if small:
        text += f", latency {human_seconds(small['time_s'])} at {human_bytes(small['bytes'])}"
    return text


def fit_lines(check: dict, facts: dict) -> list[Line]:
    """One line a collective and scope: its per-step fit over every group size (check.json's
    `step_fits`; a check of schema 1 had `fits`, one group size each), what a prediction uses as its
    cost; a fit the prediction will not use says why, as a warning (never a failure: the collectives
    themselves were right)."""
    skipped = ((facts.get("interconnect") or {}).get("skipped")) or []
    out = []
    for f in check.get("step_fits") or []:
        left = [s for s in skipped if s["collective"] == f["collective"] and FIT_SCOPE[s["scope"]] == f["scope"]]
        why = "; ".join(dict.fromkeys(s["why"].split(":")[0] for s in left))
        groups = ", ".join(map(str, f["groups"]))
        text = (
            f"per step {f['step_latency_us']:.4g} us, launch {f['launch_us']:.4g} us, B {f['bus_gbps']:.4g} GB/s, "
            f"from {groups} ranks, largest residual {f['max_rel_residual']:.0%} "
            f"({f['sizes']} sizes{f'; {len(left)} left out: {why}' if left else ''})"
            + "".join(f"; {note}" for note in f.get("notes") or [])
        )
        name = f"{f['collective']} fit {f['scope']}"
        if f["flags"]:
            out.append(
                Line(
                    name,
                    "warn",
                    f"{text}; not used: {'; '.join(f['flags'])}",
                    "a prediction uses the profile's defaults for it: rerun vit-scale check (full mode) "
                    "on a quieter allocation",
                    needed=False,
                )
            )
        else:
            out.append(Line(name, "info", text, needed=False))
    return out


def compute_lines(check: dict) -> list[Line]:
    """One line a precision: the Block's GEMMs timed at the model's shapes (check.json's `compute`), what
    a plan of that model, precision and batch takes its compute from. Never needed: without it a plan
    falls back to a flat efficiency."""
    found = check.get("compute")
    if not found:
        return []
    if found.get("error"):
        return [
            Line(
                "compute",
                "warn",
                f"the Block's GEMMs could not be timed: {found['error']}",
                "a plan then takes a flat share of the profile's peak as its compute",
                needed=False,
            )
        ]
    out = []
    for e in found.get("entries") or []:
        share = f", {e['efficiency']:.0%} of the {e['peak_tflops']:g} TFLOP/s peak" if e.get("efficiency") else ""
        out.append(
            Line(
                f"compute {e['precision']}",
                "info",
                f"{e['model']} batch {e['batch_size']}: a Block's {len(e['ops'])} GEMMs in "
                f"{e['seconds'] * 1e3:.4g} ms, {e['achieved_tflops']:.3g} TFLOP/s{share}",
                needed=False,
            )
        )
    return out


# ---------------------------------------------------------------- strategies


def strategy_lines(check: dict, facts: dict) -> list[Line]:
    rows = {(r["label"], r["precision"]): r for r in facts.get("strategies") or []}
    out = []
    for asked in check.get("labels") or []:
        key = (asked["label"], asked["precision"])
        row = rows.get(key)
        name = f"{asked['label']} {asked['precision']}"
        if row is None:
            out.append(Line(name, "fail", "not run: the check's ranks ended before it", f"see {last_log(check)}"))
        else:
            out.append(strategy_line(name, row, asked["needed"], check))
    return out


def strategy_line(name: str, row: dict, needed: bool, check: dict) -> Line:
    status = row.get("status")
    error = first_line(row.get("error"))
    where = row.get("run_dir") or row.get("log") or last_log(check)
    if status == "refused":
        fix = "leave it out of --strategies (or use what the reason names)" if needed else ""
        return Line(name, "refused", error, fix, needed=needed)
    if status == "ok" and row.get("replicas_agree"):
        ips = row.get("images_per_s")
        return Line(
            name,
            "ok",
            f"{row.get('steps')} steps, replicas agree"
            + (f", {ips:.4g} img/s" if ips else "")
            + (f" ({row['seconds']:.1f} s)" if row.get("seconds") else ""),
        )
    if status == "ok":
        return Line(name, "fail", "the replicas were not compared", f"see {where}")
    if status == "diverged":
        return Line(name, "fail", f"diverged: {error}", f"the replicas disagree: see {where}")
    return Line(name, "fail", f"{status or 'failed'}: {error or 'no error recorded'}", f"see {where}")


def first_line(text) -> str:
    text = str(text or "").strip()
    return " ".join(text.splitlines()[0].split())[:300] if text else ""


def not_run_lines(check: dict, facts: dict, why: str) -> list[Line]:
    return [
        Line(f"{a['label']} {a['precision']}", "fail", f"not run: {why}", f"see {last_log(check)}")
        for a in check.get("labels") or []
    ]


# ---------------------------------------------------------------- meter


def meter_lines(check: dict, facts: dict) -> list[Line]:
    m = facts.get("meter")
    if m is None:
        if "meter" in (check.get("parts") or []):
            return [Line("meter", "fail", "rank 0 ended before the meter was compared", f"see {last_log(check)}")]
        return []
    if m.get("error"):
        return [Line("meter", "fail", m["error"], f"see {last_log(check)}")]
    s = m["settings"]
    what = f"{m['strategy']}, {s['model']} batch {s['batch_size']}, one {m['device_type']} device"
    gpu = m["device_type"] != "cpu"
    ratio = m["ratio"]
    ratio_text = (
        f"trainer/bare loop {ratio:.3f} ({m['trainer_images_per_s']:.4g} / {m['bare_images_per_s']:.4g} img/s, {what})"
    )
    if not gpu:
        overhead = Line(
            "meter overhead", "info", ratio_text + "; informational on a CPU (runs vary by about 15%)", needed=False
        )
    elif ratio >= GPU_OVERHEAD_FLOOR:
        overhead = Line("meter overhead", "ok", ratio_text)
    else:
        overhead = Line(
            "meter overhead",
            "fail",
            ratio_text + f", below {GPU_OVERHEAD_FLOOR}",
            "the trainer costs throughput a bare loop does not: run benchmarks/trainer_overhead.py "
            "--device cuda and compare its ratios",
        )
    diff = m["timing_difference"]
    timing_text = (
        f"event-timed {m['event_step_s'] * 1e3:.4g} ms against host-synchronised {m['host_step_s'] * 1e3:.4g} "
        f"ms a step ({diff:+.1%}, {m['steps_compared']} steps)"
    )
    if not gpu:
        timing = Line(
            "meter timing",
            "info",
            timing_text + "; informational on a CPU (host clocks of two runs, which vary by more than 5%)",
            needed=False,
        )
    elif abs(diff) <= TIMING_TOLERANCE:
        timing = Line("meter timing", "ok", timing_text)
    else:
        timing = Line(
            "meter timing",
            "fail",
            timing_text + f", more than {TIMING_TOLERANCE:.0%} apart",
            "the step times the study records are not the steps' times: see docs/timing.md",
        )
    if m.get("memory_error") is not None:
        memory = Line(
            "meter memory",
            "info",
            f"planner predicted {m['predicted_peak_gib']:.3g} GiB peak allocated, "
            f"measured {m['measured_peak_gib']:.3g} GiB ({m['memory_error']:+.1%}, "
            f"{s['model']} DDP batch {s['batch_size']})",
            needed=False,
        )
    elif gpu:
        memory = Line(
            "meter memory",
            "warn",
            "no predicted or measured peak memory in the meter's run record",
            "see the meter's run under the check's records/meter",
            needed=False,
        )
    else:
        memory = Line(
            "meter memory", "skipped", "no GPU: a CPU's resident memory is not what the planner predicts", needed=False
        )
    return [overhead, timing, memory]
