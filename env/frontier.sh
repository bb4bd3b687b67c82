# Environment for vit-scale on OLCF Frontier (MI250X, ROCm, RCCL over Slingshot).
# jobs/weak_scaling.sh sources it; in an interactive allocation:  source env/frontier.sh
#
# Knobs (set them before sourcing):
#   VIT_SCALE_MODULES       modules to load, in order (default below); the ROCm version should
#                           match the ROCm build of torch in the venv
#   VIT_SCALE_VENV          the venv (default: .venv at the repository root)
#   VIT_SCALE_AWS_OFI_RCCL  install prefix of the aws-ofi-rccl plugin (holds lib/librccl-net.so);
#                           without it a module named aws-ofi-rccl is used when the site has one
#
# If a module or the venv is missing, it says which in one line, changes nothing, and returns 1.
# shellcheck shell=bash

if ! (return 0 2>/dev/null); then
  echo "env/frontier.sh sets variables in your shell, so source it: source env/frontier.sh" >&2
  exit 2
fi

VS_ENV_SCRIPT=env/frontier.sh
VS_SYSTEM=frontier
# shellcheck source=env/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || return 1

vs_frontier_env() {
  local modules plugin_dir=""
  read -r -a modules <<< "${VIT_SCALE_MODULES-PrgEnv-gnu rocm/6.2.4 craype-accel-amd-gfx90a}"

  # ---- checks: nothing is changed until all of them pass
  vs_check_modules "${modules[@]}" || return 1
  if [ -n "${VIT_SCALE_AWS_OFI_RCCL:-}" ]; then
    if ! compgen -G "$VIT_SCALE_AWS_OFI_RCCL/lib/librccl-net*.so" >/dev/null; then
      vs_fail "VIT_SCALE_AWS_OFI_RCCL=$VIT_SCALE_AWS_OFI_RCCL has no lib/librccl-net.so; point it at the plugin's install prefix or unset it"
      return 1
    fi
    plugin_dir=$VIT_SCALE_AWS_OFI_RCCL
  elif module is-avail aws-ofi-rccl >/dev/null 2>&1; then
    modules+=(aws-ofi-rccl)
  fi
  VIT_SCALE_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  vs_check_venv || return 1

  # ---- all checks passed: set the environment
  vs_load_modules "${modules[@]}" || return 1
  vs_activate_venv
  # lets jobs/, configs/ and the venv be found from any working directory
  export VIT_SCALE_HOME

  # MIOpen keeps its database of tuned kernels and its compiled-kernel cache under $HOME by
  # default; hundreds of ranks sharing one SQLite file on the shared home file system lock each
  # other out or corrupt it. Each job gets its own on the node-local /tmp.
  export MIOPEN_USER_DB_PATH=/tmp/${USER:-vit-scale}-miopen-${SLURM_JOB_ID:-$$}
  # the compiled kernels, next to the database for the same reason
  export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
  # /tmp is per node: jobs/weak_scaling.sh creates these directories on every node of the job
  export VIT_SCALE_NODE_DIRS=$MIOPEN_USER_DB_PATH

  # RCCL's bootstrap (and its socket transport) on the Slingshot interface: the default choice
  # can be the slow management network, which does not reach every node
  export NCCL_SOCKET_IFNAME=hsn0

  if [ -n "$plugin_dir" ]; then
    # RCCL looks for its network plugin (librccl-net.so) on the library path
    export LD_LIBRARY_PATH=$plugin_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  if [ -n "$plugin_dir" ] || module is-loaded aws-ofi-rccl >/dev/null 2>&1; then
    # with the plugin, RDMA goes straight between GCD memory and the NIC (OLCF's advice;
    # remove it if a job hangs at the first collective)
    export NCCL_NET_GDR_LEVEL=3
    # lets RCCL's rings and trees use a different NIC on each node; OLCF measured it faster on large jobs
    export NCCL_CROSS_NIC=1
  else
    echo "env/frontier.sh: note: no aws-ofi-rccl plugin (set VIT_SCALE_AWS_OFI_RCCL); RCCL will use TCP sockets between nodes, which is much slower" >&2
  fi

  # the -c 7 of configs/systems/frontier.yaml gives each rank 7 cores: one OpenMP thread each
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-7}
}

vs_frontier_env
