"""`vit-scale check`: prove a system ready before a study spends its allocation.

jobs/check.sh ends in `exec python -m vit_scale check`, after sourcing env/<system>.sh, which
`--which-env` names (having checked every option first). The study runs it first with `--check`.

This command imports no torch: its options become a Request (check.options); ONE launch of
vit_scale.check.worker goes over every rank of the nodes (check.launches: the launchers the study
uses, srun in an allocation, emulated nodes here), the labels left after one that took the ranks
down in a new launch, what each found kept in a Ledger (check.ledger); then the verdict's lines, a
table and check.json (check.report, check.verdict).

Exit code: 0 every needed line holds, 1 something is broken, 2 bad input, 143 stopped (by a signal:
check.json is written all the same, from what the ranks had reported, the rest as timeout lines).
"""

from __future__ import annotations

import os
import sys
import time

from vit_scale.check import report
from vit_scale.check.launches import GRACE_S, Launches
from vit_scale.check.options import PROG, Request, parse, usage
from vit_scale.cluster import node_local, systems
from vit_scale.cluster.options import take_prog
from vit_scale.cluster.supervise import Supervisor
from vit_scale.errors import UserError


def run(request: Request, supervisor=None) -> int:
    """The check asked for, from its folders to its exit code."""
    supervisor = supervisor or Supervisor(GRACE_S)
    report.make_folders(request.out)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    launches = Launches(request)
    launches.start_nodes()
    try:
        facts, attempts = launches.launch_until_done(supervisor, stamp)
    finally:
        launches.stop_nodes()
    if supervisor.interrupted:
        # what the last write from the signal's moment had, and what the launch added since
        launches.write_stopped()
        return 143
    return report.conclude(request, report.assemble(request, facts, attempts, stamp, launches.emulation_kind))


def main(argv=None, supervisor=None) -> int:
    """`vit-scale check ARGV`; the entry point of the command and of a caller in this process (the
    study's --check), whose `supervisor` then carries its signal handling into the check's launches."""
    prog, argv = take_prog(sys.argv[1:] if argv is None else argv, PROG)
    try:
        opts = parse(argv)
        if opts.help:
            print("none" if "--which-env" in opts.flags else usage())
            return 0
        request = Request(opts, prog)
        if "--which-env" in opts.flags:
            # the env script, and where the job script first copies the environment on every node when it does
            nodes = systems.allocation_size() if systems.in_slurm() else 1
            print(node_local.which_env_answer(request.system.env_script, request.system, nodes, prog))
            return 0
        report.header(request)
        return run(request, supervisor)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
