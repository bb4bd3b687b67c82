#!/bin/bash
# The study across allocations: one job per node count (and per model with --per-model), each
# running jobs/weak_scaling.sh on its own node count, then an analysis job that Slurm starts once
# all of them have ended, however they ended (--dependency=afterany). Small jobs get through a
# queue sooner than one big one, and a job cut by its time limit leaves the others intact.
#
#   jobs/submit_sweep.sh --system frontier --nodes 1,2,4,8 --account PROJECT --time 02:00:00
#   jobs/submit_sweep.sh --system frontier --nodes 1,2,4,8 --account PROJECT --dry-run   # print, submit nothing
#   jobs/submit_sweep.sh --system cuda --gpus-per-node 4 --max-nodes 8 --per-model
#
# Every study option of jobs/weak_scaling.sh (--models, --strategies, --batch-size, --config ...)
# is passed on to each job. Submitting the same sweep again resumes it: runs whose record says
# ok are skipped (unless --force). Everything is checked before the first sbatch.
set -euo pipefail

# shellcheck disable=SC2034  # read by the helpers in jobs/lib/common.sh
PROG=submit_sweep.sh
HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# die, note, show_cmd, find_helper_python, study_py, is_study_option, on_frontier, system_file
# shellcheck source=jobs/lib/common.sh
source "$HOME_DIR/jobs/lib/common.sh"

usage() {
  cat <<'EOF'
usage: jobs/submit_sweep.sh [sweep options] [study options of jobs/weak_scaling.sh]

Sweep options:
  --nodes LIST          node counts, one job each (default: the study file's list)
  --max-nodes N         with a study whose nodes are 'ladder': 1, 2, 4 ... N
  --per-model           one job per node count and model
  --system NAME         frontier cuda local (default: $VIT_SCALE_SYSTEM, else frontier on
                        Frontier, else local)
  --account A           sbatch -A
  --partition P         sbatch -p
  --qos Q               sbatch -q
  --time T              time limit of each study job (default: the #SBATCH line of weak_scaling.sh)
  --analysis-time T     time limit of the analysis job (default 00:30:00)
  --gpus-per-node N     GPUs (ranks) per node; needed for --system cuda
  --logs DIR            where the jobs' output goes (default: logs, created if missing)
  --out DIR             run records (default: runs)
  --dry-run             print every sbatch command and the srun lines of each job; submit nothing
  -h, --help            this text
Study options (passed to every job): --config --study --models --strategies --batch-size --steps
  --warmup-steps --precision --backward-prefetch --limit-all-gathers --forward-prefetch
  --fsdp-version --activation-checkpointing --use-orig-params --skip-if-not-fits --set
  --launcher --ranks-per-node --run-time-limit --force --report
EOF
}

# on a Frontier login node Lmod names the system; a CUDA cluster's login node has no GPUs to tell
default_system=local
if on_frontier; then default_system=frontier; fi
SYSTEM=${VIT_SCALE_SYSTEM:-$default_system} NODES_OPT="" MAX_NODES=0 PER_MODEL=0 DRY_RUN=0
ACCOUNT="" PARTITION="" QOS="" TIME="" ANALYSIS_TIME=00:30:00 GPUS="" LOGS=logs OUT=runs STUDY_FILE=""
PASS=()   # options for every weak_scaling.sh job
CLI=()    # the same, for study.py's checks
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --per-model) PER_MODEL=1; shift; continue ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --force) PASS+=(--force); shift; continue ;;
    --*=*) value=${opt#*=}; opt=${opt%%=*}; shift ;;
    --*) { [ $# -ge 2 ] && [[ $2 != --* ]]; } || die "$opt: needs a value (see --help)"
         value=$2; shift 2 ;;
    *) die "unexpected argument '$opt'; options start with -- (see --help)" ;;
  esac
  case $opt in
    --nodes) NODES_OPT=$value ;;
    --max-nodes) [[ $value =~ ^[1-9][0-9]*$ ]] || die "--max-nodes: '$value' is not allowed; allowed: a whole number of at least 1"
                 MAX_NODES=$value ;;
    --system) SYSTEM=$value ;;
    --account) ACCOUNT=$value ;;
    --partition) PARTITION=$value ;;
    --qos) QOS=$value ;;
    --time) TIME=$value ;;
    --analysis-time) ANALYSIS_TIME=$value ;;
    --gpus-per-node) [[ $value =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node: '$value' is not allowed; allowed: a whole number of at least 1"
                     GPUS=$value ;;
    --logs) LOGS=$value ;;
    --out) OUT=$value ;;
    --config) STUDY_FILE=$value; PASS+=("$opt" "$value") ;;
    --report|--run-time-limit) PASS+=("$opt" "$value") ;;
    --ranks-per-node) [[ $value =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node: '$value' is not allowed; allowed: a whole number of at least 1"
                      GPUS=${GPUS:-$value}; PASS+=("$opt" "$value") ;;
    --models) CLI+=(--cli "models=$value") ;;   # each job gets its own --models
    *) is_study_option "$opt" ||
         die "unknown option '$opt'; allowed: --nodes --max-nodes --per-model --system --account --partition --qos --time --analysis-time --gpus-per-node --logs --out --dry-run and the study options of jobs/weak_scaling.sh (see --help)"
       key=${opt#--}
       CLI+=(--cli "${key//-/_}=$value")
       PASS+=("$opt" "$value") ;;
  esac
done

find_helper_python
SYSTEM_FILE=$(system_file "$SYSTEM") || exit 2
eval "$(study_py system "$SYSTEM_FILE")"
if [ "$SYS_RANKS_PER_NODE" = gpus ]; then
  [ -n "$GPUS" ] || die "--gpus-per-node: $SYSTEM runs one rank per GPU, so say how many GPUs each node gets; allowed: a whole number such as 4"
  RANKS=$GPUS
else
  RANKS=${GPUS:-$SYS_RANKS_PER_NODE}
fi
[ "$DRY_RUN" = 1 ] || command -v sbatch >/dev/null 2>&1 || die "--dry-run: sbatch is not on PATH, so nothing can be submitted here; allowed without Slurm: --dry-run"

# The whole study, checked now: a bad model or strategy must fail here, not in the queue an hour later
[ -n "$NODES_OPT" ] && CLI+=(--cli "nodes=$NODES_OPT")
STUDY_FILE=${STUDY_FILE:-$HOME_DIR/$SYS_DEFAULT_STUDY}
[ -f "$STUDY_FILE" ] || die "--config: no such file: $STUDY_FILE; the studies are in configs/studies/"
plan_vars=$(study_py plan --study-file "$STUDY_FILE" --system-file "$SYSTEM_FILE" --ranks-per-node "$RANKS" \
  --alloc-nodes "$MAX_NODES" "${CLI[@]}") || exit 2
eval "$plan_vars"   # STUDY MODELS NODES ...

OUT=$(realpath -m "$OUT")
LOGS=$(realpath -m "$LOGS")
if [ "$DRY_RUN" = 0 ]; then
  # Slurm fails a job whose --output directory is missing, silently: make it before submitting
  mkdir -p "$LOGS" || die "--logs: cannot create $LOGS"
fi

common=(--output="$LOGS/%x-%j.out")
[ -n "$ACCOUNT" ] && common+=(--account="$ACCOUNT")
[ -n "$PARTITION" ] && common+=(--partition="$PARTITION")
[ -n "$QOS" ] && common+=(--qos="$QOS")
[ "$SYS_RANKS_PER_NODE" = gpus ] && common+=(--gpus-per-node="$GPUS")
read -r -a site_flags <<< "$SYS_SBATCH_FLAGS"
common+=("${site_flags[@]}")
job_args=(--system "$SYSTEM" --study "$STUDY" --out "$OUT")
[ "$SYS_RANKS_PER_NODE" = gpus ] && job_args+=(--ranks-per-node "$GPUS")

exec 3>&1   # what a dry run prints goes to stdout, past the $(...) that catches job ids
submit() {  # submit NAME SBATCH_OPTION... -- SCRIPT_ARG...: prints the job id (or a stand-in in a dry run)
  local name=$1; shift
  local sbatch_opts=() cmd
  while [ "$1" != -- ]; do sbatch_opts+=("$1"); shift; done
  shift
  cmd=(sbatch --parsable --job-name="$name" "${common[@]}" "${sbatch_opts[@]}" "$HOME_DIR/jobs/weak_scaling.sh" "$@")
  if [ "$DRY_RUN" = 1 ]; then
    show_cmd "${cmd[@]}" >&3
    echo "{$name}"
  else
    "${cmd[@]}" | cut -d';' -f1   # --parsable prints "id" or "id;cluster"
  fi
}

if [ "$PER_MODEL" = 1 ]; then model_groups=("${MODELS[@]}"); else model_groups=("$(IFS=,; echo "${MODELS[*]}")"); fi
job_ids=()
say() { if [ "$DRY_RUN" = 1 ]; then echo "$*"; else echo "$*" >&2; fi; }   # stdout holds only job ids
say "Sweep of study '$STUDY' on $SYSTEM: ${#NODES[@]} node count(s) x ${#model_groups[@]} model group(s), then the analysis"
for nodes in "${NODES[@]}"; do
  for models in "${model_groups[@]}"; do
    name=vit-$STUDY-n$nodes
    [ "$PER_MODEL" = 1 ] && name+=-$models
    time_opt=()
    [ -n "$TIME" ] && time_opt=(--time="$TIME")
    id=$(submit "$name" --nodes="$nodes" "${time_opt[@]}" -- \
           "${job_args[@]}" --nodes "$nodes" --models "$models" --no-analysis "${PASS[@]}") ||
      { note "sbatch refused $name; jobs submitted so far: ${job_ids[*]:-none}"; exit 1; }
    job_ids+=("$id")
    if [ "$DRY_RUN" = 1 ]; then
      # what that job will run, step by step
      bash "$HOME_DIR/jobs/weak_scaling.sh" --dry-run "${job_args[@]}" --nodes "$nodes" --models "$models" \
        --ranks-per-node "$RANKS" "${PASS[@]}" | grep -E '^\[|^    ' | sed 's/^/    /' 
    else
      say "submitted $name: job $id"
    fi
  done
done

dependency=afterany:$(IFS=:; echo "${job_ids[*]}")
analysis_id=$(submit "vit-$STUDY-analysis" --nodes=1 --time="$ANALYSIS_TIME" --dependency="$dependency" -- \
                "${job_args[@]}" --analysis-only "${PASS[@]}") ||
  { note "sbatch refused the analysis job; the study jobs ${job_ids[*]} are queued"; exit 1; }
if [ "$DRY_RUN" = 1 ]; then
  say "dry run: nothing was submitted"
else
  say "submitted vit-$STUDY-analysis: job $analysis_id, after jobs ${job_ids[*]} end"
  say "job output: $LOGS/   run records: $OUT/$STUDY   report: report/$STUDY (once job $analysis_id has run)"
  # the job ids on stdout, for scripts: study jobs first, the analysis job last
  echo "${job_ids[*]} $analysis_id"
fi
