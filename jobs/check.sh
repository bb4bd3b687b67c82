#!/bin/bash
# Preflight before a study: on the nodes of this allocation, through the same env script, launcher
# and system profile the study uses, check the environment (versions, GPUs per rank, modules, the
# network transport between nodes, JIT kernels), the collectives' bandwidth within and across
# nodes, every strategy label a few steps, and the meter. A few minutes; check.json and a table;
# exit code 0 when everything needed holds, 1 when something is broken (each failure one line).
#
#   sbatch -N 2 -A PROJECT jobs/check.sh                   # Frontier, or the detected system
#   sbatch -N 2 --gpus-per-node=4 jobs/check.sh --system cuda
#   bash jobs/check.sh                                     # no Slurm: this machine (emulated nodes on a CPU)
#   bash jobs/check.sh --help                              # every option
#
# The check itself is `python -m vit_scale check` (vit_scale/check/); docs/check.md says what
# each line means and what check.json holds. Edit the #SBATCH lines for your site, or override them
# on the sbatch command line. The check's --time-limit defaults to this job's time left less a
# margin (printed), so that check.json is written before Slurm ends the job, and at most 30 min
# unless --time-limit says otherwise. Should the job end first anyway, check.json is still written (exit 143).
#
#SBATCH --job-name=vit-check
#SBATCH --nodes=2
#SBATCH --time=00:20:00
#SBATCH --exclusive
# %x-%j.out lands in the directory you submit from, which always exists
#SBATCH --output=%x-%j.out
# your project, if the site requires one:
##SBATCH --account=PROJECT

set -uo pipefail
PROG=check.sh
# The checkout: this script's folder; under sbatch, which runs a copy of the script from Slurm's spool
# folder, the folder of the path submitted (Slurm keeps it as the job's Command)
script=${BASH_SOURCE[0]}
if [ ! -f "$(dirname "$script")/lib/common.sh" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  script=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
fi
# HOME_DIR, PYTHONPATH, run_vit_scale
# shellcheck source=jobs/lib/common.sh
source "$(dirname "$script")/lib/common.sh" 2>/dev/null ||
  { echo "$PROG: cannot find the vit-scale repository; submit jobs/$PROG from its checkout" >&2; exit 2; }

run_vit_scale check "$@"
