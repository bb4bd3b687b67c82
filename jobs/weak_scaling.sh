#!/bin/bash
# Weak-scaling study of Vision Transformer training. Inside one allocation of N nodes it runs
# every model x strategy on the node ladder 1, 2, 4 ... N (or --nodes), each run a separate srun
# step with one task per GPU, the per-GPU batch fixed (weak scaling). A run that fails (OOM,
# crash) is recorded and the study goes on. At the end: the analysis (table, plots, report).
#
#   sbatch -N 8 -A PROJECT jobs/weak_scaling.sh                  # Frontier: the study of seed 003
#   sbatch -N 4 --gpus-per-node=4 jobs/weak_scaling.sh --system cuda
#   bash jobs/weak_scaling.sh                                    # no Slurm: a small study on this machine
#   bash jobs/weak_scaling.sh --help                             # every option
#
# Defaults of each study are in configs/studies/, of each system in configs/systems/;
# options given here win. Edit the #SBATCH lines below for your site, or override them on the
# sbatch command line (sbatch -N 8 -t 04:00:00 -A PROJECT ...).
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

# bash reads a script while it runs it; the braces around the rest make it read all of it first,
# so that editing this file while a study runs cannot change (or break) the running study.
{
# No `set -e`: a run that fails must not end the study. Every failure is handled where it happens.
set -uo pipefail

PROG=weak_scaling.sh

if [ "${BASH_VERSINFO[0]}" -lt 4 ] || { [ "${BASH_VERSINFO[0]}" -eq 4 ] && [ "${BASH_VERSINFO[1]}" -lt 4 ]; }; then
  echo "$PROG: needs bash 4.4 or newer (this is $BASH_VERSION)" >&2
  exit 2
fi

usage() {
  # the names come from the trainer's registries (vit_scale/models.py, each strategy family's file)
  local model_names strategy_names
  HELPER_PY=${HELPER_PY:-python3}  # names need no PyYAML
  model_names=$(study_py names models) || model_names="(see vit_scale/models.py)"
  strategy_names=$(study_py names strategies) || strategy_names="(see docs/strategies.md)"
  sed -e "s|@MODELS@|$model_names|" -e "s|@STRATEGIES@|$strategy_names|" <<'EOF'
usage: sbatch [-N NODES] [sbatch options] jobs/weak_scaling.sh [options]
       bash jobs/weak_scaling.sh [options]            (no Slurm: emulated nodes on this machine)

What to run (lists are comma-separated; defaults come from the study file):
  --config FILE            study file (default: the system's, e.g. configs/studies/local.yaml)
  --study NAME             name of the study: runs go to OUT/NAME, the report to report/NAME
  --models LIST            @MODELS@
  --strategies LIST        @STRATEGIES@
  --nodes LIST|ladder      node counts (default ladder: 1, 2, 4 ... the allocation's nodes)
  --batch-size N           images per GPU (rank) and step; fixed as nodes grow
  --steps N                steps per run
  --warmup-steps N         first steps left out of every figure
FSDP and precision modifiers (several values: each is one more run, a grid):
  --precision LIST         fp32 bf16 fp16
  --backward-prefetch LIST none pre post
  --limit-all-gathers LIST true false
  --forward-prefetch LIST  true false
  --fsdp-version LIST      1 2
  --activation-checkpointing LIST  true false
  --use-orig-params LIST   true false
  --skip-if-not-fits BOOL  record a run that cannot fit the GPU as skipped instead of running it
  --set KEY=VALUE          any trainer key for every run (repeatable), e.g. --set train.lr=3e-4
Where and how:
  --system NAME            frontier cuda local (default: detected)
  --launcher NAME          srun torchrun mpi (default: the system's; mpi = mpi4py bootstrap
                           through srun --mpi=pmix, or mpirun without Slurm)
  --ranks-per-node N       default: the system's (8 on Frontier, the GPUs per node on cuda, 2 locally)
  --out DIR                run records (default: runs)
  --report DIR             analysis output (default: report/STUDY)
  --run-time-limit MIN     stop a run that takes longer (minutes)
  --force                  run again what an earlier run already recorded as ok
  --dry-run                print the runs and their launch commands; run nothing
  --analysis-only          only the analysis and the summary of what OUT/STUDY holds
  --no-analysis            skip the analysis at the end
  -h, --help               this text
Exit code: 0 every run ok (or skipped as not fitting), 1 some run failed, 2 bad input.
EOF
}

# ---------------------------------------------------------------------------- where we are
# sbatch runs a copy of this script from Slurm's spool directory, so its own path does not lead
# back to the repository; Slurm remembers the path that was submitted.
find_home() {
  local script=${BASH_SOURCE[0]}
  if [ ! -f "$(dirname "$script")/lib/study.py" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    script=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
  fi
  if [ -n "$script" ] && [ -f "$(dirname "$script")/lib/study.py" ]; then
    (cd "$(dirname "$script")/.." && pwd)
  elif [ -n "${VIT_SCALE_HOME:-}" ] && [ -f "$VIT_SCALE_HOME/jobs/lib/study.py" ]; then
    echo "$VIT_SCALE_HOME"
  else
    echo "$PROG: cannot find the vit-scale repository; set VIT_SCALE_HOME to it" >&2
    exit 2
  fi
}
HOME_DIR=$(find_home) || exit 2
# die, note, show_cmd, find_helper_python, study_py, is_study_option, on_frontier, system_file
# shellcheck source=jobs/lib/common.sh
source "$HOME_DIR/jobs/lib/common.sh"

# ---------------------------------------------------------------------------- options
SYSTEM="" STUDY_FILE="" OUT="runs" REPORT="" RANKS_OPT="" RUN_TIME_LIMIT=""
FORCE=0 DRY_RUN=0 ANALYSIS=1 ANALYSIS_ONLY=0
CLI=()   # KEY=VALUE for study.py, which merges them over the study file and checks them
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --force) FORCE=1; shift; continue ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --analysis-only) ANALYSIS_ONLY=1; shift; continue ;;
    --no-analysis) ANALYSIS=0; shift; continue ;;
    --*=*) value=${opt#*=}; opt=${opt%%=*}; shift ;;
    --*) { [ $# -ge 2 ] && [[ $2 != --* ]]; } || die "$opt: needs a value (see --help)"
         value=$2; shift 2 ;;
    *) die "unexpected argument '$opt'; options start with -- (see --help)" ;;
  esac
  case $opt in
    --system) SYSTEM=$value ;;
    --config) STUDY_FILE=$value ;;
    --out) OUT=$value ;;
    --report) REPORT=$value ;;
    --ranks-per-node) RANKS_OPT=$value ;;
    --run-time-limit) RUN_TIME_LIMIT=$value ;;
    *) is_study_option "$opt" ||
         die "unknown option '$opt'; allowed: --config ${STUDY_OPTIONS[*]} --system --ranks-per-node --out --report --run-time-limit --force --dry-run --analysis-only --no-analysis --help"
       key=${opt#--}
       CLI+=(--cli "${key//-/_}=$value") ;;
  esac
done
[ -z "$RANKS_OPT" ] || [[ $RANKS_OPT =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node: '$RANKS_OPT' is not allowed; allowed: a whole number of at least 1"
[ -z "$RUN_TIME_LIMIT" ] || [[ $RUN_TIME_LIMIT =~ ^[1-9][0-9]*$ ]] || die "--run-time-limit: '$RUN_TIME_LIMIT' is not allowed; allowed: whole minutes, at least 1"

find_helper_python

# ---------------------------------------------------------------------------- the system
IN_SLURM=0
[ -n "${SLURM_JOB_ID:-}" ] && IN_SLURM=1

# Inside an allocation: Frontier by its Lmod system name or host names, a CUDA cluster by its
# GPUs, else the local (CPU) profile. Outside an allocation there is no Slurm to launch with: local.
detect_system() {
  if [ "$IN_SLURM" = 0 ]; then
    echo local
  elif on_frontier; then
    echo frontier
  elif [ -n "${SLURM_GPUS_ON_NODE:-}" ] || command -v nvidia-smi >/dev/null 2>&1; then
    echo cuda
  else
    echo local
  fi
}
SYSTEM=${SYSTEM:-${VIT_SCALE_SYSTEM:-$(detect_system)}}
SYSTEM_FILE=$(system_file "$SYSTEM") || exit 2
system_vars=$(study_py system "$SYSTEM_FILE") || exit 2
eval "$system_vars"
if [ "$SYS_NEEDS_SLURM" = true ] && [ "$IN_SLURM" = 0 ] && [ "$DRY_RUN" = 0 ] && [ "$ANALYSIS_ONLY" = 0 ]; then
  die "--system: $SYSTEM runs inside a Slurm allocation (sbatch jobs/weak_scaling.sh, or salloc); without Slurm allowed: local"
fi

# The system's environment (modules, venv, RCCL/NCCL variables). Not for a dry run, which only
# prints and may run on a laptop far from the system it prints for.
if [ "$DRY_RUN" = 0 ]; then
  # shellcheck source=/dev/null
  source "$HOME_DIR/$SYS_ENV_SCRIPT" || { note "$SYS_ENV_SCRIPT could not set up the environment (see above); nothing was run"; exit 1; }
fi
# the trainer's python: the venv's, which the env script put first on PATH
PYTHON=${VIT_SCALE_PYTHON:-python}
# srun steps take this script's environment (venv PATH, MASTER_ADDR), also in a job submitted
# with --export=NONE
export SLURM_EXPORT_ENV=ALL

# ---------------------------------------------------------------------------- the plan
ranks_per_node() {
  local gpus
  if [ -n "$RANKS_OPT" ]; then
    echo "$RANKS_OPT"
  elif [ "$SYS_RANKS_PER_NODE" != gpus ]; then
    echo "$SYS_RANKS_PER_NODE"
  else
    # one rank per GPU the allocation gives a node (SLURM_GPUS_PER_NODE may read "a100:4")
    gpus=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}
    gpus=${gpus##*:}
    if [ -z "$gpus" ] && [ "$IN_SLURM" = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
      gpus=$(nvidia-smi -L | grep -c '^GPU')
    fi
    [[ $gpus =~ ^[1-9][0-9]*$ ]] ||
      die "--system: $SYSTEM runs one rank per GPU, but this allocation shows none; submit with --gpus-per-node=N or give --ranks-per-node"
    echo "$gpus"
  fi
}
if [ "$ANALYSIS_ONLY" = 1 ]; then
  RANKS_PER_NODE=${RANKS_OPT:-0}   # 0: unknown here, and not needed
  ALLOC_NODES=0   # the analysis job is small; the node list is that of the study jobs
else
  RANKS_PER_NODE=$(ranks_per_node) || exit 2
  ALLOC_NODES=0   # 0: no limit, the nodes are emulated
  [ "$IN_SLURM" = 1 ] && ALLOC_NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
fi
STUDY_FILE=${STUDY_FILE:-$HOME_DIR/$SYS_DEFAULT_STUDY}
[ -f "$STUDY_FILE" ] || die "--config: no such file: $STUDY_FILE; the studies are in configs/studies/"
plan_args=(--study-file "$STUDY_FILE" --system-file "$SYSTEM_FILE" --ranks-per-node "$RANKS_PER_NODE"
           --alloc-nodes "$ALLOC_NODES")
# the analysis job of a sweep is one small node: the node counts of the study are not its own
[ "$ANALYSIS_ONLY" = 1 ] && plan_args+=(--analysis-only)
plan_vars=$(study_py plan "${plan_args[@]}" "${CLI[@]}") || exit 2
# STUDY MODELS STRATEGIES NODES LAUNCHER GRID COMMON_OVERRIDES RUNS
eval "$plan_vars"

# Launch through Slurm inside an allocation, and in a dry run for a system that has no other way
USE_SLURM=$IN_SLURM
[ "$DRY_RUN" = 1 ] && [ "$SYS_NEEDS_SLURM" = true ] && USE_SLURM=1
# Without Slurm, "srun" ranks are processes this script starts itself, node by emulated node
if [ "$USE_SLURM" = 0 ] && [ "$LAUNCHER" = srun ]; then LAUNCHER=processes; fi
if [ "$LAUNCHER" = mpi ] && [ "$USE_SLURM" = 0 ]; then
  command -v mpirun >/dev/null 2>&1 ||
    die "--launcher: mpi without Slurm needs mpirun (apt-get install openmpi-bin); allowed here: srun, torchrun"
  LAUNCHER=mpi-local
fi

OUT=$(realpath -m "$OUT")
STUDY_DIR=$OUT/$STUDY
REPORT=${REPORT:-report/$STUDY}
LOG_DIR=$STUDY_DIR/logs
RUNS_TSV=$STUDY_DIR/study_runs.tsv
GRACE_S=${VIT_SCALE_STEP_GRACE_S:-60}   # after one rank ends, how long the others get to finish

# ---------------------------------------------------------------------------- launching
free_port() {
  "$HELPER_PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

if [ "$IN_SLURM" = 1 ]; then
  mapfile -t JOB_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
fi

# The rendezvous address: the first node of the step, found the way the system profile says.
# Emulated nodes (n1, n2) do not resolve, so `nodeaddr` asks Slurm for the address it uses.
master_addr() {
  local node=$1
  case $SYS_MASTER_ADDR in
    nodeaddr) scontrol show node "$node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -n 1 ;;
    *) echo "$node" ;;
  esac
}

# Starts the ranks of one run, waits for them, returns the run's exit code (rank 0's: every
# rank of the trainer exits with the run's status). If a rank ends badly the others get GRACE_S
# seconds to write the record, then they are stopped; so is a run past --run-time-limit.
wait_ranks() {
  local pids=("$@") pid code alive started=$SECONDS failed_at="" stop_at="" killed=0
  declare -A done_code=()
  while :; do
    alive=()
    for pid in "${pids[@]}"; do
      [ -n "${done_code[$pid]+set}" ] && continue
      if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); continue; fi
      wait "$pid"
      done_code[$pid]=$?
      if [ "${done_code[$pid]}" -ne 0 ] && [ -z "$failed_at" ]; then failed_at=$SECONDS; fi
    done
    [ ${#alive[@]} -eq 0 ] && break
    if [ -z "$stop_at" ]; then
      if [ "$INTERRUPTED" = 1 ] ||
         { [ -n "$failed_at" ] && [ $((SECONDS - failed_at)) -gt "$GRACE_S" ]; } ||
         { [ -n "$RUN_TIME_LIMIT" ] && [ $((SECONDS - started)) -gt $((RUN_TIME_LIMIT * 60)) ]; }; then
        stop_at=$SECONDS
        kill -TERM "${alive[@]}" 2>/dev/null
      fi
    elif [ "$killed" = 0 ] && [ $((SECONDS - stop_at)) -gt 20 ]; then
      # the trainer writes its record within ~10 s of SIGTERM; a rank stuck in a collective may not
      killed=1
      kill -KILL "${alive[@]}" 2>/dev/null
    fi
    sleep 0.2
  done
  code=${done_code[${pids[0]}]}
  for pid in "${pids[@]}"; do
    [ "$code" -ne 0 ] && break
    code=${done_code[$pid]}
  done
  return "$code"
}

# build_launch NODES OVERRIDE...: the command of one run. Fills CMD (one command to start), or
# GROUP_CMDS (several to start side by side: the emulated nodes or the ranks, without Slurm)
build_launch() {
  local nodes=$1; shift
  local ranks=$((nodes * RANKS_PER_NODE)) nodelist="" flags=() mpi_flags=() time_flags=() i
  CMD=() GROUP_CMDS=()
  read -r -a mpi_flags <<< "$SYS_MPI_FLAGS"
  if [ "$IN_SLURM" = 1 ]; then
    nodelist=$(IFS=,; echo "${JOB_NODES[*]:0:$nodes}")
    [ -n "$RUN_TIME_LIMIT" ] && time_flags=(--time="$RUN_TIME_LIMIT")
  fi
  case $LAUNCHER in
    srun|mpi)
      read -r -a flags <<< "${SYS_SRUN_FLAGS//\{ranks_per_node\}/$RANKS_PER_NODE}"
      [ "$LAUNCHER" = mpi ] || mpi_flags=()
      CMD=(srun --nodes="$nodes" --ntasks="$ranks" ${nodelist:+--nodelist="$nodelist"} "${flags[@]}"
           "${mpi_flags[@]}" --kill-on-bad-exit=0 --wait="$GRACE_S" "${time_flags[@]}"
           "$PYTHON" -m vit_scale train system.launcher="$([ "$LAUNCHER" = mpi ] && echo mpi || echo srun)" "$@") ;;
    torchrun)
      local rdzv=(--nnodes="$nodes" --nproc_per_node="$RANKS_PER_NODE")
      if [ "$USE_SLURM" = 1 ]; then
        read -r -a flags <<< "${SYS_TORCHRUN_SRUN_FLAGS//\{ranks_per_node\}/$RANKS_PER_NODE}"
        CMD=(srun --nodes="$nodes" --ntasks="$nodes" ${nodelist:+--nodelist="$nodelist"} "${flags[@]}"
             --kill-on-bad-exit=0 --wait="$GRACE_S" "${time_flags[@]}"
             "$PYTHON" -m torch.distributed.run "${rdzv[@]}" --rdzv_backend=c10d
             --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv_id="${SLURM_JOB_ID:-0}.$RUN_INDEX"
             -m vit_scale train system.launcher=torchrun "$@")
      else
        for ((i = 0; i < nodes; i++)); do
          local node_cmd=(env VIT_SCALE_NODE_NAME="local$i" "$PYTHON" -m torch.distributed.run "${rdzv[@]}"
                          --node_rank="$i" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT"
                          -m vit_scale train system.launcher=torchrun "$@")
          GROUP_CMDS+=("$(show_cmd "${node_cmd[@]}")")
        done
      fi ;;
    mpi-local)
      local root=()
      [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
      CMD=(mpirun "${root[@]}" --oversubscribe)
      for ((i = 0; i < nodes; i++)); do
        # MPMD: one app context per emulated node, each with its node name
        [ "$i" -gt 0 ] && CMD+=(:)
        CMD+=(-np "$RANKS_PER_NODE" env VIT_SCALE_NODE_NAME="local$i" "$PYTHON" -m vit_scale train system.launcher=mpi "$@")
      done ;;
    processes)
      # what torchrun would give each rank (env://), without torchrun's agent processes
      for ((i = 0; i < ranks; i++)); do
        local rank_cmd=(env RANK="$i" WORLD_SIZE="$ranks" LOCAL_RANK=$((i % RANKS_PER_NODE))
                        LOCAL_WORLD_SIZE="$RANKS_PER_NODE" GROUP_RANK=$((i / RANKS_PER_NODE)) GROUP_WORLD_SIZE="$nodes"
                        MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$MASTER_PORT" VIT_SCALE_NODE_NAME="local$((i / RANKS_PER_NODE))"
                        "$PYTHON" -m vit_scale train system.launcher=torchrun "$@")
        GROUP_CMDS+=("$(show_cmd "${rank_cmd[@]}")")
      done ;;
  esac
}

run_launch() {  # runs CMD or GROUP_CMDS; output to the run's log; returns the run's exit code
  local log=$1 pids=() group
  if [ ${#GROUP_CMDS[@]} -gt 0 ]; then
    for group in "${GROUP_CMDS[@]}"; do
      eval "$group" >> "$log" 2>&1 &
      pids+=($!)
    done
  else
    "${CMD[@]}" >> "$log" 2>&1 &
    pids+=($!)
  fi
  wait_ranks "${pids[@]}"
}

status_of_code() {  # the trainer's exit codes, for a run that left no record
  case $1 in
    0) echo ok ;; 2) echo bad-input ;; 3) echo oom ;; 4) echo diverged ;; 5) echo timeout ;; 6) echo skipped ;;
    *) echo failed ;;
  esac
}

# ---------------------------------------------------------------------------- the study
INTERRUPTED=0
trap 'INTERRUPTED=1' INT TERM

describe_launcher() {
  case $LAUNCHER in
    srun) echo "srun ${SYS_SRUN_FLAGS//\{ranks_per_node\}/$RANKS_PER_NODE}" ;;
    torchrun) echo "torchrun, one per node" ;;
    mpi) echo "srun $SYS_MPI_FLAGS, mpi4py bootstrap" ;;
    mpi-local) echo "mpirun, mpi4py bootstrap (no Slurm)" ;;
    processes) echo "processes started here, $RANKS_PER_NODE per emulated node (no Slurm)" ;;
  esac
}

TOTAL=${#RUNS[@]}
if [ "$ANALYSIS_ONLY" = 0 ]; then
  echo "vit-scale study '$STUDY' on $SYSTEM: $TOTAL run$([ "$TOTAL" = 1 ] || echo s) (${#MODELS[@]} model(s) x ${#STRATEGIES[@]} strateg$([ ${#STRATEGIES[@]} = 1 ] && echo y || echo ies)${GRID:+ x grid $GRID} x nodes $(IFS=,; echo "${NODES[*]}"))"
  echo "  $RANKS_PER_NODE ranks per node, launcher: $(describe_launcher)${SLURM_JOB_ID:+, job $SLURM_JOB_ID on $SLURM_JOB_NODELIST}"
  echo "  settings: ${COMMON_OVERRIDES[*]}"
  echo "  records: $STUDY_DIR   logs: $LOG_DIR"
  [ "$DRY_RUN" = 1 ] && echo "  dry run: nothing is started"
fi

if [ "$DRY_RUN" = 0 ]; then
  mkdir -p "$LOG_DIR" || die "--out: cannot create $LOG_DIR"
  [ -s "$RUNS_TSV" ] || printf 'time\tjob\tmodel\tstrategy\tvariant\tnodes\tranks\tlauncher\texit_code\tstatus\timages_per_s\tseconds\trun_dir\tlog\n' >> "$RUNS_TSV"
  # node-local directories the env script asked for (e.g. MIOpen's cache under /tmp), on every node
  if [ "$IN_SLURM" = 1 ] && [ -n "${VIT_SCALE_NODE_DIRS:-}" ] && [ "$ANALYSIS_ONLY" = 0 ]; then
    # shellcheck disable=SC2086  # a space-separated list of directories
    srun --nodes="$ALLOC_NODES" --ntasks-per-node=1 mkdir -p $VIT_SCALE_NODE_DIRS ||
      note "could not create $VIT_SCALE_NODE_DIRS on every node"
  fi
fi

STUDY_START=$SECONDS
RUN_INDEX=0 FAILED=0
for run in "${RUNS[@]}"; do
  [ "$ANALYSIS_ONLY" = 1 ] && break
  [ "$INTERRUPTED" = 1 ] && break
  RUN_INDEX=$((RUN_INDEX + 1))
  read -r model strategy nodes variant extra <<< "$run"
  ranks=$((nodes * RANKS_PER_NODE))
  variant_overrides=() system_overrides=()
  if [ "$extra" != - ]; then
    IFS=, read -r -a run_extra <<< "$extra"
    for kv in "${run_extra[@]}"; do
      case $kv in system.*) system_overrides+=("$kv") ;; *) variant_overrides+=("$kv") ;; esac
    done
  fi
  label="[$RUN_INDEX/$TOTAL] $model $strategy n$nodes ($ranks ranks)"
  [ "$variant" = - ] || label+=" ${variant//,/ }"
  run_parent=$STUDY_DIR/$model/$strategy/n$nodes

  # what makes two runs the same measurement: everything but where it is written and how launched
  same=(model="$model" strategy="$strategy" "${COMMON_OVERRIDES[@]}" "${variant_overrides[@]}"
        system.ranks_per_node="$RANKS_PER_NODE")
  if [ "$FORCE" = 0 ] && earlier=$(study_py find-ok "$run_parent" "${same[@]}"); then
    echo "$label ... ok earlier, skipped (--force runs it again): $earlier"
    if [ "$DRY_RUN" = 0 ]; then
      read -r _ ips _ <<< "$(study_py record "$earlier")"
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "${SLURM_JOB_ID:--}" \
        "$model" "$strategy" "$variant" "$nodes" "$ranks" "$LAUNCHER" - ok "$ips" 0 "$earlier" - >> "$RUNS_TSV"
    fi
    continue
  fi

  run_id=$(date -u +%Y%m%d-%H%M%S)-$([ "$IN_SLURM" = 1 ] && echo "j$SLURM_JOB_ID" || echo "p$$").$RUN_INDEX
  log=$LOG_DIR/$model.$strategy.n$nodes.$run_id.log
  if [ "$IN_SLURM" = 1 ]; then
    MASTER_ADDR=$(master_addr "${JOB_NODES[0]}")
  else
    MASTER_ADDR=127.0.0.1
  fi
  MASTER_PORT=$(free_port)
  if [ "$IN_SLURM" = 0 ] && [ "$USE_SLURM" = 1 ]; then
    # a dry run outside the allocation: both are found when the job runs
    MASTER_ADDR="{address of the first node}" MASTER_PORT="{a free port}"
  fi
  export MASTER_ADDR MASTER_PORT
  build_launch "$nodes" "${same[@]}" "${system_overrides[@]}" \
    output.dir="$OUT" output.study="$STUDY" output.run_id="$run_id"

  if [ "$DRY_RUN" = 1 ]; then
    echo "$label"
    if [ ${#GROUP_CMDS[@]} -gt 0 ]; then
      printf '    %s &\n' "${GROUP_CMDS[@]}"
    else
      echo "    MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT $(show_cmd "${CMD[@]}")"
    fi
    continue
  fi

  printf '%s ... ' "$label"
  started=$SECONDS
  { echo "# $(date -u +%FT%TZ) MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
    if [ ${#GROUP_CMDS[@]} -gt 0 ]; then printf '# %s &\n' "${GROUP_CMDS[@]}"; else echo "# $(show_cmd "${CMD[@]}")"; fi
  } > "$log"
  run_launch "$log"
  code=$?
  seconds=$((SECONDS - started))
  run_dir=$run_parent/$run_id
  read -r status ips error <<< "$(study_py record "$run_dir")"
  if [ "$status" = none ]; then
    # no end record: the run died before it could write one, or never started
    status=$(status_of_code "$code")
    [ "$status" = ok ] && status=failed
    error="exit code $code, $error; last line of the log: $(grep -v '^#' "$log" | tail -n 1)"
  fi
  if [ "$status" = ok ]; then
    echo "ok $ips img/s (${seconds} s)"
  elif [ "$status" = skipped ]; then
    echo "skipped: ${error:-does not fit}"
  else
    FAILED=$((FAILED + 1))
    echo "${status^^} (exit $code, ${seconds} s): ${error:0:300}"
    echo "      log: $log"
  fi
  [ -d "$run_dir" ] || run_dir=-
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "${SLURM_JOB_ID:--}" \
    "$model" "$strategy" "$variant" "$nodes" "$ranks" "$LAUNCHER" "$code" "$status" "$ips" "$seconds" "$run_dir" "$log" >> "$RUNS_TSV"
done

[ "$DRY_RUN" = 1 ] && exit 0

# ---------------------------------------------------------------------------- the end
elapsed=$((SECONDS - STUDY_START))
echo
if [ "$INTERRUPTED" = 1 ]; then
  echo "Study '$STUDY' interrupted after $RUN_INDEX of $TOTAL runs. Submit the same command again to resume: runs recorded as ok are skipped."
elif [ "$ANALYSIS_ONLY" = 0 ]; then
  echo "Study '$STUDY' on $SYSTEM: $TOTAL run$([ "$TOTAL" = 1 ] || echo s) in $((elapsed / 60))m$((elapsed % 60))s, $FAILED failed."
else
  echo "Study '$STUDY': the runs recorded in $STUDY_DIR"
fi
if [ -s "$RUNS_TSV" ]; then
  study_py summary "$RUNS_TSV"
fi
echo "  run records: $STUDY_DIR"

REPORT_OK=1
if [ "$ANALYSIS" = 1 ] && [ "$INTERRUPTED" = 0 ]; then
  analysis=$HOME_DIR/analysis/weak_scaling.py
  if [ ! -f "$analysis" ]; then
    note "no $analysis: the report was not made"
  elif "$PYTHON" "$analysis" "$STUDY_DIR" --out "$REPORT" > "$LOG_DIR/analysis.log" 2>&1; then
    REPORT=$(cd "$REPORT" && pwd)
    echo "  report:      $REPORT/report.md"
    plots=$(cd "$REPORT" && ls -- *.png 2>/dev/null | paste -sd' ' -)
    echo "  plots:       $REPORT/ ${plots:-(none)}"
    echo "  table:       $REPORT/results.csv"
  else
    note "the analysis failed; see $LOG_DIR/analysis.log"
    tail -n 5 "$LOG_DIR/analysis.log" >&2
    REPORT_OK=0
  fi
fi

[ "$INTERRUPTED" = 1 ] && exit 143
[ "$FAILED" -gt 0 ] && exit 1
[ "$REPORT_OK" = 1 ] || exit 1
exit 0
}
