# Environment for vit-scale on OLCF Frontier (MI250X, ROCm, RCCL over Slingshot).
# jobs/weak_scaling.sh sources it; in an interactive allocation:  source env/frontier.sh
#
# Knobs (set them before sourcing):
#   VIT_SCALE_ROCM          the ROCm version (default: VS_ROCM_DEFAULT below). The one place for it:
#                           this script loads rocm/<it>, and env/setup_venv.sh frontier installs torch
#                           from download.pytorch.org/whl/rocm<major.minor> of the same version
#   VIT_SCALE_MODULES       modules to load, in order (default: PrgEnv-gnu rocm/$VIT_SCALE_ROCM
#                           craype-accel-amd-gfx90a); the rccl-net-plugin module is added after them
#   VIT_SCALE_VENV          the venv (default: .venv at the repository root)
#   VIT_SCALE_AWS_OFI_RCCL  install prefix of an RCCL network plugin you built yourself (OLCF builds
#                           aws-ofi-nccl; the prefix holds lib/librccl-net.so); without it the site's
#                           rccl-net-plugin module is loaded, which brings the plugin and its variables
#   VIT_SCALE_REQUIRE_NET_PLUGIN  1 (default): RCCL between nodes goes through the plugin or fails; a
#                           job over several nodes without a plugin stops here, and every run over
#                           more than one node gets NCCL_NET="AWS Libfabric" (every plugin release
#                           answers to it), so RCCL fails instead of quietly using TCP sockets.
#                           0: RCCL may fall back to sockets. An NCCL_NET you set wins.
#
# mpi4py (--launcher mpi) must be built against Cray MPICH, not taken as a wheel: env/setup_venv.sh
# frontier --extras mpi does it with OLCF's recipe, PrgEnv loaded:
#   MPICC="cc -shared" pip install --no-cache-dir --no-binary=mpi4py mpi4py
#
# If a module or the venv is missing, it says which in one line, changes nothing, and returns 1.
# shellcheck shell=bash

if ! (return 0 2>/dev/null); then
  echo "env/frontier.sh sets variables in your shell, so source it: source env/frontier.sh" >&2
  exit 2
fi

# torch 2.13.0 is published for ROCm 7.2 (its release notes name torch==2.13.0+rocm7.2) and
# Frontier has the rocm/7.2.0 module, which OLCF recommends for PyTorch-only work; OLCF's combination
# with PyTorch Geometric and flash-attn is VIT_SCALE_ROCM=7.1.1. env/setup_venv.sh reads this line.
VS_ROCM_DEFAULT=7.2.0

VS_ENV_SCRIPT=env/frontier.sh
VS_SYSTEM=frontier
# shellcheck source=env/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || return 1

# The variables HPE and AMD call required for RCCL's correctness and speed at scale with the
# libfabric plugin, as OLCF lists them (docs.olcf.ornl.gov, PyTorch on Frontier, "Manual RCCL
# Network Plugin Configuration"). The rccl-net-plugin module sets them itself; these are for a plugin
# given by VIT_SCALE_AWS_OFI_RCCL. A value already set (by you or the site) is kept.
vs_frontier_plugin_variables() {
  local plugin_dir=$1
  # RCCL loads this file as its network plugin (OLCF's preferred way)...
  export NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN:-$plugin_dir/lib/librccl-net.so}
  # ... and older RCCL finds librccl-net.so on the library path
  export LD_LIBRARY_PATH=$plugin_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # RDMA straight between GCD memory and the NIC that shares its PCIe host bridge
  export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
  # rings and trees may use a different NIC on each node; faster on large jobs
  export NCCL_CROSS_NIC=${NCCL_CROSS_NIC:-1}
  # GPU memory the NIC reads and writes over PCIe must be fine-grained
  export HSA_FORCE_FINE_GRAIN_PCIE=${HSA_FORCE_FINE_GRAIN_PCIE:-1}
  # libfabric's registration cache monitor; memhooks can deadlock with the plugin, kdreg2 cannot
  export FI_MR_CACHE_MONITOR=${FI_MR_CACHE_MONITOR:-kdreg2}
  # the CXI provider leaves host memory registration to the GPU runtime
  export FI_CXI_DISABLE_HOST_REGISTER=${FI_CXI_DISABLE_HOST_REGISTER:-1}
  # completion and transmit queues sized for the many peers of a large job (defaults overflow)
  export FI_CXI_DEFAULT_CQ_SIZE=${FI_CXI_DEFAULT_CQ_SIZE:-131072}
  # (the transmit side of the same: unexpected rendezvous messages)
  export FI_CXI_DEFAULT_TX_SIZE=${FI_CXI_DEFAULT_TX_SIZE:-2048}
  # matching moves to software when the NIC's match entries run out, instead of failing
  export FI_CXI_RX_MATCH_MODE=${FI_CXI_RX_MATCH_MODE:-hybrid}
  # the alternative rendezvous protocol, faster for RCCL at scale; it needs the NIC's rendezvous
  # gets off, which srun --network=disable_rdzv_get asks for (configs/systems/frontier.yaml)
  export FI_CXI_RDZV_PROTO=${FI_CXI_RDZV_PROTO:-alt_read}
  # (with it: no eager data, every message through rendezvous, no minimum size for gets)
  export FI_CXI_RDZV_EAGER_SIZE=${FI_CXI_RDZV_EAGER_SIZE:-0}
  # (same)
  export FI_CXI_RDZV_THRESHOLD=${FI_CXI_RDZV_THRESHOLD:-0}
  # (same)
  export FI_CXI_RDZV_GET_MIN=${FI_CXI_RDZV_GET_MIN:-0}
}

# The ROCm torch was built for (torch/version.py's hip), read without importing torch (which
# takes seconds on a shared file system): "none" for a CPU or CUDA build, nothing without torch
VS_TORCH_HIP='
import importlib.util, os
spec = importlib.util.find_spec("torch")
if spec and spec.submodule_search_locations:
    version = {}
    with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
        exec(f.read(), version)
    print(version.get("hip") or "none", version.get("__version__", "?"))
'

# One line when torch's HIP (major.minor) is not the loaded rocm module's: JIT kernels (DeepSpeed,
# ColossalAI) are compiled with the module's hipcc and headers but run in torch's own HIP runtime
# (deepspeed/ops/op_builder/builder.py: installed_rocm_version reads ROCM_HOME), and the RCCL
# plugin is built for the module's ROCm.
vs_check_torch_rocm() {
  local module="" entry hip version module_minor hip_minor
  local -a loaded
  IFS=: read -r -a loaded <<< "${LOADEDMODULES:-}"
  for entry in "${loaded[@]}"; do
    [[ $entry == rocm/* ]] && module=${entry#rocm/}
  done
  [ -n "$module" ] || return 0
  read -r hip version < <("${VS_VENV:+$VS_VENV/bin/}python" -c "$VS_TORCH_HIP" 2>/dev/null)
  [ -n "${hip:-}" ] || return 0
  module_minor=$(cut -d. -f1-2 <<< "$module")
  if [ "$hip" = none ]; then
    echo "$VS_ENV_SCRIPT: torch $version in ${VS_VENV:-the python on PATH} is not a ROCm build; build the venv for Frontier: bash env/setup_venv.sh frontier" >&2
    return 0
  fi
  hip_minor=$(cut -d. -f1-2 <<< "$hip")
  if [ "$hip_minor" != "$module_minor" ]; then
    echo "$VS_ENV_SCRIPT: torch $version in ${VS_VENV:-the python on PATH} is built for ROCm $hip_minor but module rocm/$module is loaded; rebuild the venv (VIT_SCALE_ROCM=$module bash env/setup_venv.sh frontier) or load a rocm/$hip_minor module (VIT_SCALE_ROCM=$hip_minor.x)" >&2
  fi
}

vs_plugin_module_loaded() {
  [[ ":${LOADEDMODULES:-}:" == *":rccl-net-plugin"[:/]* ]]
}

vs_frontier_env() {
  local rocm=${VIT_SCALE_ROCM:-$VS_ROCM_DEFAULT} require=${VIT_SCALE_REQUIRE_NET_PLUGIN:-1}
  local plugin_dir="" nodes=${SLURM_JOB_NUM_NODES:-1} modules
  read -r -a modules <<< "${VIT_SCALE_MODULES-PrgEnv-gnu rocm/$rocm craype-accel-amd-gfx90a}"

  # ---- checks: nothing is changed until all of them pass
  if [ "$require" != 0 ] && [ "$require" != 1 ]; then
    vs_fail "VIT_SCALE_REQUIRE_NET_PLUGIN=$require is not allowed; allowed: 1 (runs over several nodes use the RCCL network plugin or fail) or 0 (they may fall back to TCP sockets)"
    return 1
  fi
  vs_check_modules "${modules[@]}" || return 1
  if [ -n "${VIT_SCALE_AWS_OFI_RCCL:-}" ]; then
    if [ ! -f "$VIT_SCALE_AWS_OFI_RCCL/lib/librccl-net.so" ]; then
      vs_fail "VIT_SCALE_AWS_OFI_RCCL=$VIT_SCALE_AWS_OFI_RCCL has no lib/librccl-net.so; point it at the plugin's install prefix or unset it"
      return 1
    fi
    plugin_dir=$VIT_SCALE_AWS_OFI_RCCL
  elif vs_plugin_module_loaded || [[ " ${modules[*]} " == *" rccl-net-plugin"[\ /]* ]]; then
    :  # loaded by hand, or listed in VIT_SCALE_MODULES
  elif declare -F module >/dev/null && module is-avail rccl-net-plugin >/dev/null 2>&1; then
    # OLCF: load it after rocm
    modules+=(rccl-net-plugin)
  elif [ "$require" = 1 ] && [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -gt 1 ]; then
    vs_fail "no RCCL network plugin (module rccl-net-plugin is not available, VIT_SCALE_AWS_OFI_RCCL is unset), so across these $nodes nodes RCCL would use TCP sockets; give VIT_SCALE_AWS_OFI_RCCL the prefix of a plugin you built, or set VIT_SCALE_REQUIRE_NET_PLUGIN=0 to run over sockets"
    return 1
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
  # can be the slow management network, which does not reach every node (OLCF: hsn0 alone when
  # all four hang)
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-hsn0}

  [ -z "$plugin_dir" ] || vs_frontier_plugin_variables "$plugin_dir"
  if [ -n "$plugin_dir" ] || vs_plugin_module_loaded; then
    if [ "$require" = 1 ]; then
      # the trainer gives a run over more than one node NCCL_NET="AWS Libfabric", so RCCL fails
      # rather than use sockets. That name, not "OFI": plugins up to 1.11.0 (and aws-ofi-rccl builds
      # of them) answer to it alone, later ones to both (aws-ofi-nccl's nvidia_plugin_name_fixup).
      # Single-node runs keep RCCL's default: the network is not set up for one node (OLCF)
      export VIT_SCALE_NCCL_NET_ACROSS_NODES="AWS Libfabric"
    fi
  else
    echo "$VS_ENV_SCRIPT: note: no RCCL network plugin (module rccl-net-plugin, or VIT_SCALE_AWS_OFI_RCCL); RCCL will use TCP sockets between nodes, which is much slower" >&2
  fi

  vs_check_torch_rocm

  # the -c 7 of configs/systems/frontier.yaml gives each rank 7 cores: one OpenMP thread each
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-7}
}

vs_frontier_env
