# Environment for vit-scale on this machine's CPUs (gloo): a laptop, a CI runner, or the
# emulated nodes of tools/local-slurm-cluster.sh. jobs/weak_scaling.sh sources it.
#
# Knobs (set them before sourcing):
#   VIT_SCALE_VENV   the venv (default: .venv at the repository root); empty: the python on PATH
#
# If the venv is missing, it says so in one line, changes nothing, and returns 1.
# shellcheck shell=bash

if ! (return 0 2>/dev/null); then
  echo "env/local.sh sets variables in your shell, so source it: source env/local.sh" >&2
  exit 2
fi

VS_ENV_SCRIPT=env/local.sh
VS_SYSTEM=local
# shellcheck source=env/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || return 1

vs_local_env() {
  # ---- checks: nothing is changed until all of them pass
  VIT_SCALE_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  vs_check_venv || return 1

  # ---- all checks passed: set the environment
  vs_activate_venv
  # lets jobs/, configs/ and the venv be found from any working directory
  export VIT_SCALE_HOME
  # every emulated node's ranks share this machine's cores: more than one thread per rank
  # only makes them fight over the cores and blurs the scaling curve
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # Open MPI (--launcher mpi): its shared-memory transport crashes when two emulated nodes on
  # one host create their segments; TCP over the loopback works
  export OMPI_MCA_btl=${OMPI_MCA_btl:-self,tcp}
}

vs_local_env
