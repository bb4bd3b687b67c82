#!/bin/bash
# Single-device plugin comparison (seeds 000 and 001): every strategy on one device, for each
# per-device batch size; images/s and peak memory go into the run records. A run that fails (OOM,
# a label this device cannot run, --run-time-limit) is recorded and the comparison goes on. At the
# end: the analysis (tables and plots against batch size). It is a study like the weak-scaling one
# (configs/studies/plugin_comparison.yaml: batch size as its axis, one rank), so every option of
# jobs/weak_scaling.sh works here too.
#
#   sbatch jobs/plugin_comparison.sh --system cuda            # one node, one GPU
#   bash jobs/plugin_comparison.sh --system cuda              # a GPU machine without Slurm
#   bash jobs/plugin_comparison.sh --system local --model vit_micro --batch-sizes 2,4 \
#        --strategies DDP,CAI_DDP --steps 4                     # no Slurm: a smoke test on a CPU
#   bash jobs/plugin_comparison.sh --help
#
#SBATCH --job-name=vit-plugin-comparison
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus=1
#SBATCH --time=02:00:00
#SBATCH --output=%x-%j.out
# your project, if the site requires one:
##SBATCH --account=PROJECT

set -uo pipefail
PROG=plugin_comparison.sh
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

# the comparison's own study file, unless one is given (a later --config wins)
run_vit_scale study --config "$HOME_DIR/configs/studies/plugin_comparison.yaml" "$@"
