"""The study: which runs, recorded in a ledger, resumed, then the analysis.

`vit-scale study` (jobs/weak_scaling.sh and jobs/plugin_comparison.sh end in it), `vit-scale sweep`
(jobs/submit_sweep.sh) and `vit-scale prepare`. Torch is never imported here: the orchestrator runs
on a login node or beside the ranks it starts, and the runs themselves are `python -m vit_scale train`.
System profiles, launch commands and supervision are vit_scale.cluster's, shared with the check.

    plan.py       study file + options -> the list of runs
    ledger.py     study_runs.tsv, finding an earlier ok run, the summary table
    lock.py       a lock per model and node count, so that two studies never run the same runs
    preflight.py  --check: vit-scale check on what the study is about to use, before the first run
    cli.py        the study command itself
    sweep.py      one sbatch job per node count, then the analysis job
    prepare.py    JIT kernels built before any run's clock starts
"""
