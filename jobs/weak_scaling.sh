#!/bin/bash
# Weak-scaling study of Vision Transformer training. Inside one allocation of N nodes it runs
# every model x strategy on the node ladder 1, 2, 4 ... N (or --nodes), each run a separate srun
# step with one task per GPU, the per-GPU batch fixed (weak scaling). On a GPU machine without
# Slurm it runs the ladder over that machine's GPUs with torchrun; on a CPU without Slurm, a small
# study on emulated nodes. A run that fails (OOM, crash, --run-time-limit) is recorded and the
# study goes on. At the end: the analysis (table, plots, report).
#
#   sbatch -N 8 -A PROJECT jobs/weak_scaling.sh                  # Frontier: the study of seed 003
#   sbatch -N 4 --gpus-per-node=4 jobs/weak_scaling.sh --system cuda
#   bash jobs/weak_scaling.sh --system cuda                      # a GPU machine without Slurm
#   bash jobs/weak_scaling.sh                                    # no Slurm, no GPU: a small study on this CPU
#   bash jobs/weak_scaling.sh --help                             # every option
#
# Defaults of each study are in configs/studies/ (every point 3 times: --repeat 1 is a quick look
# that compares no points), of each system in configs/systems/; options given here win. The study itself is `python -m vit_scale study` (vit_scale/study/): this script
# only finds the repository, sets up the system's environment (env/<system>.sh) and starts it.
# Edit the #SBATCH lines below for your site, or override them on the sbatch command line
# (sbatch -N 8 -t 04:00:00 -A PROJECT ...).
#
#SBATCH --job-name=vit-weak-scaling
#SBATCH --nodes=2
#SBATCH --time=01:00:00
#SBATCH --exclusive
# %x-%j.out lands in the directory you submit from, which always exists: a --output in a
# directory that does not exist makes Slurm fail the job without writing anything anywhere.
#SBATCH --output=%x-%j.out
# your project, if the site requires one:
##SBATCH --account=PROJECT
# Frontier: the NIC setting RCCL's rendezvous protocol needs (env/frontier.sh). Every srun step of
# the study asks for it (configs/systems/frontier.yaml); uncomment to give it to the whole allocation
# too. Left commented for other clusters, where --network means something else or nothing.
##SBATCH --network=disable_rdzv_get

set -uo pipefail
PROG=weak_scaling.sh
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

run_vit_scale study "$@"
