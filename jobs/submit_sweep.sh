#!/bin/bash
# The study across allocations: one job per node count (and per model with --per-model), each
# running jobs/weak_scaling.sh on its own node count, then an analysis job that Slurm starts once
# all of them have ended (--dependency=afterany). Run it on a login node; it submits, it does not
# wait. The submitting is `python -m vit_scale sweep` (vit_scale/study/sweep.py).
#
#   jobs/submit_sweep.sh --system frontier --nodes 1,2,4,8 --account PROJECT --time 02:00:00
#   jobs/submit_sweep.sh --system frontier --nodes 1,2,4,8 --account PROJECT --dry-run   # print, submit nothing
#   jobs/submit_sweep.sh --system cuda --gpus-per-node 4 --max-nodes 8 --per-model
#   jobs/submit_sweep.sh --help
set -uo pipefail
PROG=submit_sweep.sh

# HOME_DIR, PYTHONPATH, find_helper_python
# shellcheck source=jobs/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
helper=$(find_helper_python) || exit 2
exec "$helper" -m vit_scale sweep --prog "$PROG" "$@"
