"""`vit-scale check`: a preflight that proves a system ready before a study spends its allocation.

    vit-scale check [--system frontier|cuda|local] [--nodes N] [--quick]
    sbatch -N 2 jobs/check.sh

One launch of `vit_scale.check.worker` over every rank of N nodes, through the study's own
launchers, env scripts and system profiles (vit_scale.cluster), then a verdict per line, a table,
and `check.json` (docs/check.md). Exit code 0 when every needed line holds, 1 when one is broken,
2 on bad input.

  cli.py          the command (torch-free): options -> request -> launches -> check.json and the table
  options.py      the options parsed and checked into a Request: what is asked, where it runs
  launches.py     each launch of the worker built and supervised, relaunches, one time limit
  ledger.py       what the launches found, kept across them, and what was running when they ended
  report.py       the header, check.json (also when a signal stops the check), the table
  worker.py       the rank side: process group, then each part below; rank 0 writes the facts
  environment.py  versions, devices and their binding, modules, kernels; the transport read from
                  the collective library's own log lines (torch-free parsing)
  collectives.py  all-reduce, all-gather, reduce-scatter timed at the strategies' sizes, within a
                  node and across nodes; algorithm and bus bandwidth as nccl-tests defines them
  strategies.py   every strategy label a few steps of a small model: ok, refused, failed
  meter.py        the trainer against a bare loop, event-timed against host-timed steps,
                  predicted against measured peak memory (also used by benchmarks/trainer_overhead.py)
  verdict.py      facts -> lines (torch-free): what holds, what is broken and what to do
  lines.py        one line of the verdict, the table
  schema.py       check.json's JSON Schema (docs/check.md carries it)
check.json is read back, for the study's summary and the analysis report, by vit_scale.record.check_file.
"""
