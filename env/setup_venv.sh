#!/bin/bash
# Builds the Python venv that env/<system>.sh activates: the torch build the system needs
# (ROCm, CUDA or CPU) first, then vit-scale and its extras installed against that torch, so
# that no later install swaps it for another build.
#
#   bash env/setup_venv.sh local                                   # CPU: laptops, CI
#   bash env/setup_venv.sh local --extras test,deepspeed,mpi --with-test-tools
#   bash env/setup_venv.sh frontier                                # on a Frontier login node
#   bash env/setup_venv.sh cuda --venv /path/to/venv --extras deepspeed
#   bash env/setup_venv.sh cuda --dry-run                          # print the commands only
#
# Which torch (environment variables):
#   TORCH_SPEC        default torch==2.13.0
#   TORCH_INDEX_URL   where pip gets it; default per system: local: pip's own configuration
#                     (PyPI; on Linux that is a CUDA build, which also runs on CPUs; set
#                     https://download.pytorch.org/whl/cpu for the smaller CPU-only one),
#                     cuda: https://download.pytorch.org/whl/cu128,
#                     frontier: https://download.pytorch.org/whl/rocm<major.minor> of the ROCm that
#                     env/frontier.sh loads (VIT_SCALE_ROCM, else its VS_ROCM_DEFAULT: 7.2.0 -> rocm7.2)
#   VIT_SCALE_ROCM    frontier: the ROCm version, for the wheel here and the module in env/frontier.sh
#   PYTHON            the interpreter the venv is made from (default python3; on Frontier, load
#                     a Python module first, e.g. cray-python)
set -euo pipefail

PROG=setup_venv.sh
HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# libpmix-dev: Slurm 22.05's mpi/pmix plugin dlopens the unversioned libpmix.so, which only the -dev
# package ships (openmpi-bin brings libpmix2 alone, and srun --mpi=pmix then fails); g++: the tests
# build DeepSpeed's CPU Adam and torch.compile's CPU backend (inductor) compiles C++
TEST_TOOLS=(slurm-wlm munge lmod shellcheck openmpi-bin libpmix-dev g++)

die() { echo "$PROG: $*" >&2; exit 2; }

usage() {
  cat <<'EOF'
usage: bash env/setup_venv.sh SYSTEM [--venv DIR] [--extras a,b] [--with-test-tools] [--dry-run]
  SYSTEM              local, cuda or frontier: which torch build to install
  --venv DIR          where (default: .venv at the repository root, which env/*.sh use)
  --extras LIST       extras of vit-scale: test, deepspeed, mpi, colossalai, lora, tensorboard, wandb
  --with-test-tools   also install the system packages the tests use (slurm-wlm munge lmod
                      shellcheck openmpi-bin libpmix-dev), with apt-get as root or through sudo
  --dry-run           print the commands, run nothing
EOF
}

SYSTEM="" VENV=$HOME_DIR/.venv EXTRAS="" WITH_TOOLS=0 DRY_RUN=0
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --venv) [ $# -ge 2 ] || die "--venv: needs a directory"; VENV=$2; shift 2 ;;
    --venv=*) VENV=${1#*=}; shift ;;
    --extras) [ $# -ge 2 ] || die "--extras: needs a list such as test,deepspeed"; EXTRAS=$2; shift 2 ;;
    --extras=*) EXTRAS=${1#*=}; shift ;;
    --with-test-tools) WITH_TOOLS=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -*) die "unknown option '$1'; allowed: --venv --extras --with-test-tools --dry-run --help" ;;
    *) [ -z "$SYSTEM" ] || die "unexpected argument '$1'; give one SYSTEM: local, cuda or frontier"
       SYSTEM=$1; shift ;;
  esac
done
# The ROCm version of env/frontier.sh, which loads rocm/<it>: the wheel index and the module come
# from this one value, so torch's HIP and the module's hipcc (JIT kernels) and RCCL plugin agree
frontier_rocm_index() {
  local rocm major minor
  rocm=${VIT_SCALE_ROCM:-$(sed -n 's/^VS_ROCM_DEFAULT=\([0-9][0-9.]*\)$/\1/p' "$HOME_DIR/env/frontier.sh")}
  [[ $rocm =~ ^[0-9]+\.[0-9]+(\.[0-9]+)*$ ]] ||
    die "VIT_SCALE_ROCM: '$rocm' is not a ROCm version; allowed: a version such as 7.2.0 (the module rocm/7.2.0, the wheels of whl/rocm7.2)"
  IFS=. read -r major minor _ <<< "$rocm"
  echo "https://download.pytorch.org/whl/rocm$major.$minor"
}

case $SYSTEM in
  local) default_index="" ;;
  cuda) default_index=https://download.pytorch.org/whl/cu128 ;;
  frontier) default_index=$(frontier_rocm_index) || exit 2 ;;
  "") die "SYSTEM: missing; allowed: local, cuda, frontier" ;;
  *) die "SYSTEM: unknown system '$SYSTEM'; allowed: local, cuda, frontier" ;;
esac
extras=() colossalai=0
IFS=, read -r -a requested <<< "$EXTRAS"
for extra in "${requested[@]}"; do
  case $extra in
    test|deepspeed|mpi|lora|tensorboard|wandb) extras+=("$extra") ;;
    colossalai) colossalai=1 ;;
    "") ;;
    *) die "--extras: unknown extra '$extra'; allowed: test, deepspeed, mpi, colossalai, lora, tensorboard, wandb" ;;
  esac
done
VENV=$(realpath -m "$VENV")
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL-$default_index}
PYTHON=${PYTHON:-python3}

LOG=$(mktemp "${TMPDIR:-/tmp}/vit-scale-setup.XXXXXX.log")
STEP=0

step() {  # step "what" command...: one line per step; the command's own output goes to the log
  local what=$1 started=$SECONDS
  shift
  if [ "$DRY_RUN" = 1 ]; then
    echo "+ $*"
    return
  fi
  STEP=$((STEP + 1))
  printf '%s: [%d] %s ... ' "$PROG" "$STEP" "$what"
  echo "+ $*" >>"$LOG"
  if "$@" >>"$LOG" 2>&1; then
    echo "done ($((SECONDS - started)) s)"
  else
    echo "FAILED"
    tail -n 25 "$LOG" | sed 's/^/    /' >&2
    echo "$PROG: step '$what' failed; its whole output is in $LOG" >&2
    exit 1
  fi
}

as_root() {  # step "what" command...: a command that needs root, directly or through sudo
  local what=$1
  shift
  if [ "$(id -u)" = 0 ]; then
    step "$what" "$@"
  elif command -v sudo >/dev/null 2>&1; then
    step "$what" sudo "$@"
  else
    echo "$PROG: installing system packages needs root; as root run: $*" >&2
    exit 1
  fi
}

# ---- system packages for the tests (Debian/Ubuntu), before anything else: slurmd looks for the
# PMIx library (libpmix.so, from libpmix-dev) only when it starts
if [ "$WITH_TOOLS" = 1 ]; then
  missing=()
  for package in "${TEST_TOOLS[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
  done
  if [ ${#missing[@]} = 0 ]; then
    echo "test tools already installed: ${TEST_TOOLS[*]}"
  elif ! command -v apt-get >/dev/null 2>&1; then
    echo "$PROG: --with-test-tools knows only apt-get; install the equivalents of: ${missing[*]}" >&2
    exit 1
  else
    as_root "apt package lists" apt-get update
    # without --no-install-recommends apt pulls dozens of unneeded packages (ROCm plugins, hdf5...)
    as_root "system packages for the tests: ${missing[*]}" \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi

# ---- the venv
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null && [ "$DRY_RUN" = 0 ]; then
    # Debian and Ubuntu ship venv support as a separate package
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      step "python3-venv (Debian ships venv apart)" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends python3-venv
    else
      echo "$PROG: '$PYTHON -m venv' needs venv support; on Debian/Ubuntu install python3-venv (as root: apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
  step "venv at $VENV" "$PYTHON" -m venv "$VENV"
else
  echo "using the existing venv $VENV"
fi
pip=("$VENV/bin/python" -m pip)

# ---- torch first, the build for this system
torch_cmd=("${pip[@]}" install "$TORCH_SPEC")
if [ -n "$TORCH_INDEX_URL" ]; then
  # torchvision's compiled ops must match torch's build, so both come from the same index
  torch_cmd+=(torchvision --index-url "$TORCH_INDEX_URL")
fi
step "$TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}" "${torch_cmd[@]}"

# ---- everything else against that torch: a constraints file pins the build just installed,
# so that no dependency (timm, torchvision, deepspeed, colossalai) replaces it
constraints=$VENV/vit-scale-constraints.txt
pin_installed='
import importlib.metadata as md
for name in ("torch", "torchvision"):
    try:
        print(f"{name}=={md.version(name).split(chr(43))[0]}")
    except md.PackageNotFoundError:
        pass
'
if [ "$DRY_RUN" = 1 ]; then
  echo "+ $VENV/bin/python -c '<print torch==X (and torchvision==Y) as installed>' > $constraints"
else
  "$VENV/bin/python" -c "$pin_installed" > "$constraints"
  echo "$PROG: pinned $(paste -sd' ' "$constraints") in $constraints (use it with pip install -c for later installs)"
fi

target=$HOME_DIR
[ ${#extras[@]} -gt 0 ] && target="${HOME_DIR}[$(IFS=,; echo "${extras[*]}")]"
if [[ " ${extras[*]} " == *" deepspeed "* ]]; then
  # DeepSpeed then builds no C++/CUDA ops at install time; it compiles what a run needs on first use
  export DS_BUILD_OPS=0
  [ "$DRY_RUN" = 1 ] && echo "+ export DS_BUILD_OPS=0"
fi
if [ "$SYSTEM" = frontier ] && [[ " ${extras[*]} " == *" mpi "* ]]; then
  # mpi4py must call Cray MPICH, which only the Cray compiler wrapper `cc` knows how to link:
  # built from source with it (OLCF's PyTorch-on-Frontier recipe), not taken as a PyPI wheel.
  # With a non-default CPE, export LD_LIBRARY_PATH=$CRAY_LD_LIBRARY_PATH:$LD_LIBRARY_PATH first.
  if [ "$DRY_RUN" = 0 ] && ! command -v cc >/dev/null 2>&1; then
    echo "$PROG: --extras mpi on frontier builds mpi4py against Cray MPICH with the Cray wrapper 'cc', which is not on PATH; module load PrgEnv-gnu first" >&2
    exit 2
  fi
  step "mpi4py against Cray MPICH (MPICC='cc -shared')" env MPICC="cc -shared" \
    "${pip[@]}" install -c "$constraints" --no-cache-dir --no-binary=mpi4py mpi4py
fi
step "vit-scale${extras[*]:+ with ${extras[*]}}" "${pip[@]}" install -c "$constraints" -e "$target"

if [ "$colossalai" = 1 ]; then
  # ColossalAI 0.5.0 pins torch<=2.5.1 and many heavy packages. What its imports need comes first,
  # under the constraints; colossalai itself last and without its dependencies, so that no pip call
  # ever checks its pins against this torch (pip would print a red resolver ERROR on a working install)
  step "what ColossalAI imports (transformers, peft, galore-torch, bitsandbytes)" \
    "${pip[@]}" install -c "$constraints" transformers==4.51.3 peft==0.13.2 galore-torch bitsandbytes
  step "colossalai 0.5.0 (--no-deps: keeps this torch)" "${pip[@]}" install -c "$constraints" --no-deps colossalai==0.5.0
fi

if [ "$DRY_RUN" = 1 ]; then
  echo "dry run: nothing was installed"
  rm -f "$LOG"
else
  cp "$LOG" "$VENV/setup.log" && rm -f "$LOG"
  summary='
import importlib.metadata as md
import torch
build = (f"ROCm {torch.version.hip} build" if torch.version.hip else
         f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build")
names = ["torch", "torchvision", "timm", "deepspeed", "colossalai", "mpi4py", "vit-scale"]
found = []
for name in names:
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print("installed: " + ", ".join(found) + f" ({build})")
'
  echo "$PROG: $("$VENV/bin/python" -c "$summary")"
  echo "$PROG: the commands and their output: $VENV/setup.log"
  if [ "$VENV" = "$HOME_DIR/.venv" ]; then
    echo "next: bash jobs/weak_scaling.sh    (env/$SYSTEM.sh activates this venv)"
  else
    echo "next: export VIT_SCALE_VENV=$VENV, so that env/$SYSTEM.sh activates this venv; then bash jobs/weak_scaling.sh"
  fi
  if [ "$SYSTEM" != local ]; then
    # JIT kernels are built for the GPUs and compilers of the node that builds them, so on a
    # compute node; a study also does this itself before its first run
    echo "kernels (DeepSpeed, ColossalAI), once, on a GPU node: srun -N 1 -n 1 --gpus=1 bash -c 'source env/$SYSTEM.sh && vit-scale prepare'"
  fi
fi
