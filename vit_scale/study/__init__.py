"""The study: which runs, launched how, supervised, recorded in a ledger, then the analysis.

`vit-scale study` (jobs/weak_scaling.sh and jobs/plugin_comparison.sh end in it), `vit-scale sweep`
(jobs/submit_sweep.sh) and `vit-scale prepare`. Torch is never imported here: the orchestrator runs
on a login node or beside the ranks it starts, and the runs themselves are `python -m vit_scale train`.

    files.py      the repository's configs/, YAML reading, the one BadInput error
    systems.py    a system profile (configs/systems/) and what this machine or allocation gives
    plan.py       study file + options -> the list of runs
    launchers.py  one run -> the argument lists that start its ranks
    supervise.py  start them, wait, stop the whole tree on a failure or a time limit
    ledger.py     study_runs.tsv, finding an earlier ok run, the summary table
    cli.py        the study command itself
    sweep.py      one sbatch job per node count, then the analysis job
    prepare.py    JIT kernels built before any run's clock starts
"""
