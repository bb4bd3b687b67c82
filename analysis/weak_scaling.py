"""Run directories in; results.csv, the paper's figures and report.md/report.html out.

    python analysis/weak_scaling.py RUNS_DIR [RUNS_DIR ...] --out DIR

Exit status: 0 done (files that could not be read are listed, not fatal); 1 nothing usable was
found; 2 bad command line (a missing directory, an --out that is a file or a run directory);
3 some records use a schema newer than this analysis reads (the rest is still written).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

if __package__ in (None, ""):
    # Run as a script: put the repository root, not analysis/, first on the path, so the
    # package imports below resolve and no module here shadows one of the same name elsewhere.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from analysis import (
    figures,
    prediction,
    report,
    traces,
)
from analysis import table as tbl
from vit_scale.record import reader as records

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_SCHEMA = 0, 1, 2, 3
FORMATS = ("png", "pdf", "svg")
MAX_LISTED = 10  # skipped files named on the terminal; the report lists them all


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + error
        raise UsageError(f"{message} (see --help)")


def parse_args(argv):
    p = _Parser(
        prog="analysis/weak_scaling.py",
        description="Tables, plots and a report from vit-scale run directories (docs/analysis.md).",
    )
    p.add_argument("runs", nargs="+", metavar="RUNS_DIR", help="directories searched for */metrics.jsonl")
    p.add_argument("--out", default="report", help="output directory (created; default: report)")
    p.add_argument(
        "--study",
        action="append",
        metavar="NAME",
        help="only runs of this study (repeatable; default: every study found)",
    )
    p.add_argument(
        "--grid-model", help="model for the Figure-1 configuration grid (default: the one with the most configurations)"
    )
    p.add_argument("--grid-nodes", type=_positive_int, help="node count for the configuration grid")
    p.add_argument(
        "--formats",
        default="png,pdf",
        type=_formats,
        help=f"figure formats, comma-separated from {', '.join(FORMATS)} (default: png,pdf)",
    )
    p.add_argument("--dpi", type=_dpi, default=300, help="PNG resolution (default: 300, print)")
    p.add_argument(
        "--width",
        type=_width,
        default="column",
        metavar="column|page|INCHES",
        help="the width the figures are drawn at, and so printed at without scaling their text: "
        f"column ({figures.COLUMN_WIDTH} in, default), page ({figures.PAGE_WIDTH} in) "
        f"or inches from {MIN_WIDTH:g} to {MAX_WIDTH:g}",
    )
    p.add_argument("--no-plots", action="store_true", help="tables and report only")
    p.add_argument("--quiet", action="store_true", help="only warnings and errors")
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    return p.parse_args(argv)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _dpi(text):
    value = _positive_int(text)
    if not 50 <= value <= 1200:
        raise argparse.ArgumentTypeError(f"expected 50 to 1200, got {value}")
    return value


MIN_WIDTH, MAX_WIDTH = 2.5, 20.0  # narrower cannot hold a panel's labels; wider is a poster


def _width(text):
    named = {"column": figures.COLUMN_WIDTH, "page": figures.PAGE_WIDTH}
    if text in named:
        return named[text]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_WIDTH <= value <= MAX_WIDTH:  # also false for nan
        raise argparse.ArgumentTypeError(
            f"{text!r} not allowed; allowed: column, page or inches from {MIN_WIDTH:g} to {MAX_WIDTH:g}"
        )
    return value


def _formats(text):
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in FORMATS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r} not allowed; allowed: {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(items))


def _check_paths(args) -> None:
    for path in args.runs:
        if not os.path.exists(path):
            raise UsageError(f"RUNS_DIR: no such file or directory: {path}")
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out: {out} is a file; give a directory for the results")
    # Writing into a run directory would put report files next to the records they summarise
    # and, on the next analysis, inside the tree being read.
    probe = os.path.abspath(out)
    while True:
        if os.path.isfile(os.path.join(probe, records.METRICS_FILE)):
            raise UsageError(f"--out: {out} is inside the run directory {probe}; choose a directory outside any run")
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent


class _Writer:
    """Writes output files, refusing any path that is one of the files read."""

    def __init__(self, out_dir: str, inputs: set):
        self.out_dir, self.inputs, self.written = out_dir, inputs, []

    def path(self, name: str) -> str:
        path = os.path.join(self.out_dir, name)
        if os.path.realpath(path) in self.inputs:
            raise UsageError(f"--out: {path} is one of the input files; choose another output directory")
        self.written.append(path)
        return path


def _say(args, text: str) -> None:
    if not args.quiet:
        print(text, flush=True)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _best_summary(results) -> list:
    """One line per model: node counts grouped by their best series, e.g. '1: DDP · 2-16: HYBRID_1GPU'.

    A node count that holds runs at several rank counts (a single-device comparison next to a
    full-node ladder) is spelled out with its ranks and never merged into a range.
    """
    best = tbl.best_runs(results)
    lines = []
    for model in dict.fromkeys(best["model"]):
        sub = best[best["model"] == model]
        xcol, xname = tbl.x_axis(results[results["model"] == model])
        repeated = set(sub["nodes"][sub["nodes"].duplicated()]) if xcol == "nodes" else set()
        parts = []  # [first x, last x, series, mergeable]
        for _, r in sub.iterrows():
            x, series = int(r[xcol]), r["series"]
            if x in repeated:
                ranks = int(r["world_size"])
                parts.append([f"{x} ({ranks} rank{'s' if ranks > 1 else ''})", None, series, False])
            elif parts and parts[-1][3] and parts[-1][2] == series:
                parts[-1][1] = x
            else:
                parts.append([str(x), None, series, True])
        text = " · ".join(f"{a}{'-' + str(b) if b is not None else ''}: {series}" for a, b, series, _ in parts)
        unit = "" if xname == "nodes" else f" ({xname})"
        lines.append(f"  {model + unit:<12} {text}")
    return lines


def run(args) -> int:
    _check_paths(args)
    t0 = time.perf_counter()
    coll = _collect(args)
    tables = tbl.build(coll)
    results, set_aside = tables.results, tables.set_aside
    _say_collected(args, coll, results, len(set_aside))
    schema_msg = _schema_message(coll)
    if results.empty:
        if schema_msg:
            print(f"error: {schema_msg}", file=sys.stderr)
            return EXIT_SCHEMA
        print(
            f"error: no usable runs under {', '.join(args.runs)} "
            f"({len(coll.skipped)} file(s) or directories skipped, listed above)",
            file=sys.stderr,
        )
        return EXIT_NOTHING

    # Resolve the grid choice before writing anything, so a bad --grid-model leaves no half output.
    if not args.no_plots:
        try:
            figures.pick_grid(results, args.grid_model, args.grid_nodes)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out: cannot create {args.out}: {exc.strerror or exc}") from None
    writer = _Writer(
        args.out,
        {os.path.realpath(r.path) for r in coll.runs}
        | {os.path.realpath(s.path) for s in coll.skipped + coll.unknown_schema},
    )
    breakdown, predicted = _write_tables(args, writer, coll, results, set_aside)
    drawn, missing = _draw(args, writer, results, breakdown, predicted) if not args.no_plots else ([], [])
    blocks = report.build(results, set_aside, coll, drawn, missing, writer.written, breakdown, predicted)
    with open(writer.path("report.md"), "w") as f:
        f.write(report.to_markdown(blocks))
    with open(writer.path("report.html"), "w") as f:
        f.write(report.to_html(blocks, args.out))
    _say_done(args, writer, results, t0)
    if schema_msg:
        print(f"error: {schema_msg}", file=sys.stderr)
        return EXIT_SCHEMA
    return EXIT_OK


def _collect(args) -> records.Collection:
    """The run records under args.runs, only those of the --study names when given."""

    def progress(n, secs):
        _say(args, f"  read {n} run files ({secs:.1f} s)")

    coll = records.collect(args.runs, progress=progress)
    if args.study:
        found = {r.start.get("study") for r in coll.runs}
        unknown = [s for s in args.study if s not in found]
        if unknown:
            have = ", ".join(sorted(map(str, found))) or "none"
            raise UsageError(
                f"--study: no runs of {', '.join(unknown)} under {', '.join(args.runs)}; studies found: {have}"
            )
        coll.runs = [r for r in coll.runs if r.start.get("study") in args.study]
    return coll


def _say_collected(args, coll, results, n_aside: int) -> None:
    """What was read, and the first files skipped (report.md lists them all)."""
    _say(
        args,
        f"collected {len(coll.runs)} runs in {coll.seconds:.1f} s "
        f"({len(coll.skipped) + len(coll.unknown_schema)} skipped, {n_aside} reruns set aside)"
        + (f"; {len(results)} in the table: {report.status_counts(results)}" if len(results) else ""),
    )
    for s in (coll.skipped + coll.unknown_schema)[:MAX_LISTED]:
        _warn(f"skipped {s.path}: {s.reason}")
    extra = len(coll.skipped) + len(coll.unknown_schema) - MAX_LISTED
    if extra > 0:
        _warn(f"... and {extra} more skipped (all listed in report.md)")


def _schema_message(coll) -> str | None:
    if not coll.unknown_schema:
        return None
    return (
        f"{len(coll.unknown_schema)} run file(s) use a schema newer than this analysis reads "
        f"(up to {records.SUPPORTED_SCHEMA}), e.g. {coll.unknown_schema[0].path}; "
        f"update vit-scale's analysis to read them"
    )


def _write_tables(args, writer, coll, results, set_aside):
    """results.csv (and .parquet), set_aside.csv, time_breakdown.csv, prediction.csv; returns the breakdown
    and the prediction the figures and the report use."""
    try:
        results.to_csv(writer.path("results.csv"), index=False)
        if not set_aside.empty:
            set_aside.to_csv(writer.path("set_aside.csv"), index=False)
        _write_parquet(results, writer)
        breakdown = traces.table(coll.runs)
        if not breakdown.empty:
            breakdown.to_csv(writer.path("time_breakdown.csv"), index=False)
        predicted = prediction.build(coll.runs, results, breakdown)
        if not predicted.rows.empty:
            predicted.rows.to_csv(writer.path("prediction.csv"), index=False)
    except OSError as exc:
        raise UsageError(f"--out: cannot write in {args.out}: {exc.strerror or exc}") from None
    return breakdown, predicted


def _draw(args, writer, results, breakdown, predicted) -> tuple[list, list]:
    """Every figure the data allows, in each --formats; returns those drawn and why the others were not."""
    t_plot = time.perf_counter()
    drawn, missing = figures.all_plots(results, args.grid_model, args.grid_nodes, args.width, breakdown, predicted.rows)
    for fig in drawn:
        for fmt in args.formats:
            fig.savefig(writer.path(f"{fig.name}.{fmt}"), dpi=args.dpi)
    _say(args, f"drew {len(drawn)} figures in {time.perf_counter() - t_plot:.1f} s")
    for m in missing:
        _say(args, f"  not drawn: {m}")
    return drawn, missing


def _say_done(args, writer, results, t0: float) -> None:
    names = [os.path.basename(p) for p in writer.written]
    _say(args, f"wrote {len(names)} files to {args.out}/: {', '.join(names)}")
    _say(args, "best strategy per model (nodes: strategy):")
    for line in _best_summary(results):
        _say(args, line)
    bad = results[results["status"] != "ok"]
    if not bad.empty:
        _say(args, f"not ok: {report.status_counts(bad)} (errors in {os.path.join(args.out, 'report.md')})")
    _say(args, f"done in {time.perf_counter() - t0:.1f} s")


def _write_parquet(results, writer) -> None:
    try:
        import pyarrow  # noqa: F401  - optional: login nodes often lack it
    except ImportError:
        return
    try:
        results.to_parquet(writer.path("results.parquet"), index=False)
    except Exception as exc:  # mixed-type option columns are the usual cause; the CSV has it all
        writer.written.pop()
        _warn(f"results.parquet not written: {exc}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        return run(parse_args(argv))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: say so in one line unless asked for more
        if debug:
            raise
        print(
            f"error: internal error in the analysis: {type(exc).__name__}: {exc} "
            f"(rerun with --debug for the traceback, and report it)",
            file=sys.stderr,
        )
        return EXIT_NOTHING


if __name__ == "__main__":
    sys.exit(main())
