# Environment for vit-scale on a Slurm cluster of NVIDIA GPU nodes (CUDA torch, NCCL).
# jobs/weak_scaling.sh sources it; in an interactive allocation:  source env/cuda.sh
#
# Knobs (set them before sourcing):
#   VIT_SCALE_MODULES  modules to load, in order (default: cuda). Empty loads none: the CUDA
#                      torch wheel brings its own CUDA runtime and NCCL, so nodes whose driver
#                      comes with the OS need no module.
#   VIT_SCALE_VENV     the venv (default: .venv at the repository root)
#   NCCL_SOCKET_IFNAME set it yourself where the nodes have several networks (e.g. ib0)
#
# If a module or the venv is missing, it says which in one line, changes nothing, and returns 1.
# shellcheck shell=bash

if ! (return 0 2>/dev/null); then
  echo "env/cuda.sh sets variables in your shell, so source it: source env/cuda.sh" >&2
  exit 2
fi

VS_ENV_SCRIPT=env/cuda.sh
VS_SYSTEM=cuda
# shellcheck source=env/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || return 1

vs_cuda_env() {
  local modules
  read -r -a modules <<< "${VIT_SCALE_MODULES-cuda}"

  # ---- checks: nothing is changed until all of them pass
  vs_check_modules "${modules[@]}" || return 1
  VIT_SCALE_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  vs_check_venv || return 1

  # ---- all checks passed: set the environment
  vs_load_modules "${modules[@]}" || return 1
  vs_activate_venv
  # lets jobs/, configs/ and the venv be found from any working directory
  export VIT_SCALE_HOME
  # a failing NCCL start-up then says why in the job log, not only "unhandled system error"
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  # the GPU does the work; one host thread per rank is also what torchrun sets, so srun and
  # torchrun launches measure the same thing
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
}

vs_cuda_env
