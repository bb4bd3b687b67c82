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
# Defaults of each study are in configs/studies/, of each system in configs/systems/; options
# given here win. The study itself is `python -m vit_scale study` (vit_scale/study/): this script
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

# sbatch runs a copy of this script from Slurm's spool directory; Slurm remembers the path submitted
script=${BASH_SOURCE[0]}
if [ ! -f "$(dirname "$script")/lib/common.sh" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  script=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
fi
# HOME_DIR, PYTHONPATH, find_helper_python
# shellcheck source=jobs/lib/common.sh
source "$(dirname "$script")/lib/common.sh" 2>/dev/null ||
  { echo "$PROG: cannot find the vit-scale repository; submit jobs/$PROG from its checkout" >&2; exit 2; }

# Every option is checked before anything is set up; the answer is the env script to source.
helper=$(find_helper_python) || exit 2
env_script=$("$helper" -m vit_scale study --prog "$PROG" --which-env "$@") || exit
if [ "$env_script" = none ]; then   # --help, --dry-run: nothing to set up
  exec "$helper" -m vit_scale study --prog "$PROG" "$@"
fi

# The system's modules, venv and RCCL/NCCL variables
# shellcheck source=/dev/null
source "$HOME_DIR/$env_script" ||
  { echo "$PROG: $env_script could not set up the environment (see above); nothing was run" >&2; exit 1; }
exec "${VIT_SCALE_PYTHON:-python}" -m vit_scale study --prog "$PROG" "$@"
