#!/bin/bash
# Single-device plugin comparison (seeds 000 and 001): every strategy on one device, for each
# per-device batch size, one `python -m vit_scale train` run each; images/s and peak memory go
# into the run records. A run that fails (OOM, a label this device cannot run) is recorded and
# the comparison goes on. At the end: python analysis/weak_scaling.py (tables and plots).
#
#   sbatch jobs/plugin_comparison.sh --system cuda            # one node, one GPU
#   bash jobs/plugin_comparison.sh --system local --model vit_micro --batch-sizes 2,4 \
#        --strategies DDP,CAI_DDP --steps 4                     # no Slurm: a smoke test on a CPU
#   bash jobs/plugin_comparison.sh --help
#
# Defaults are in configs/studies/plugin_comparison.yaml; options given here win.
#
#SBATCH --job-name=vit-plugin-comparison
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus=1
#SBATCH --time=02:00:00
#SBATCH --output=%x-%j.out
# your project, if the site requires one:
##SBATCH --account=PROJECT

# No `set -e`: a run that fails must not end the comparison.
set -uo pipefail

PROG=plugin_comparison.sh

die() { echo "$PROG: $*" >&2; exit 2; }
note() { echo "$PROG: $*" >&2; }

usage() {
  cat <<'EOF'
usage: sbatch jobs/plugin_comparison.sh [options]
       bash jobs/plugin_comparison.sh [options]

  --config FILE          study file (default: configs/studies/plugin_comparison.yaml)
  --study NAME           runs go to OUT/NAME (default: the file's, plugin_comparison)
  --model NAME           e.g. vit_base (default), vit_micro for a smoke test
  --strategies LIST      comma-separated labels (default: the file's: DDP, FSDP, ZeRO and CAI_* labels)
  --batch-sizes LIST     comma-separated per-device batch sizes (default: 8,32,64,128,256)
  --steps N              steps per run (default: the file's)
  --warmup-steps N       first steps left out of the figures
  --precision P          fp32, bf16 or fp16 for every strategy (default: per strategy, as the seeds ran)
  --set KEY=VALUE        any trainer key for every run (repeatable), e.g. --set colossalai.cpu_offload=true
  --system NAME          local, cuda or frontier: sources env/NAME.sh (default: cuda if nvidia-smi
                         is found, frontier if rocm-smi is, else local)
  --out DIR              run records (default: runs)
  --report DIR           analysis output (default: report/STUDY)
  --run-time-limit MIN   stop a run that takes longer than MIN minutes
  --dry-run              print the runs; run nothing
  --no-analysis          skip the analysis at the end
  -h, --help             this text
Exit code: 0 every run ok, 1 some run failed, 2 bad input (nothing was run).
EOF
}

# ---------------------------------------------------------------------------- where we are
# sbatch runs a copy of this script from Slurm's spool directory; Slurm remembers the real path
find_home() {
  local script=${BASH_SOURCE[0]}
  if [ ! -f "$(dirname "$script")/../vit_scale/recipes/train.py" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    script=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
  fi
  if [ -n "$script" ] && [ -f "$(dirname "$script")/../vit_scale/recipes/train.py" ]; then
    (cd "$(dirname "$script")/.." && pwd)
  elif [ -n "${VIT_SCALE_HOME:-}" ] && [ -f "$VIT_SCALE_HOME/vit_scale/recipes/train.py" ]; then
    echo "$VIT_SCALE_HOME"
  else
    die "cannot find the vit-scale repository; set VIT_SCALE_HOME to it"
  fi
}
HOME_DIR=$(find_home) || exit 2

# ---------------------------------------------------------------------------- options
CONFIG="" STUDY="" MODEL="" STRATEGIES="" BATCH_SIZES="" STEPS="" WARMUP="" PRECISION=""
SYSTEM="" OUT="runs" REPORT="" RUN_TIME_LIMIT="" DRY_RUN=0 ANALYSIS=1
SETS=()
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --no-analysis) ANALYSIS=0; shift; continue ;;
    --*=*) value=${opt#*=}; opt=${opt%%=*}; shift ;;
    --*) [ $# -ge 2 ] || die "$opt: needs a value (see --help)"; value=$2; shift 2 ;;
    *) die "unexpected argument '$opt'; options start with -- (see --help)" ;;
  esac
  case $opt in
    --config) CONFIG=$value ;;
    --study) STUDY=$value ;;
    --model) MODEL=$value ;;
    --strategies) STRATEGIES=$value ;;
    --batch-sizes) BATCH_SIZES=$value ;;
    --steps) STEPS=$value ;;
    --warmup-steps) WARMUP=$value ;;
    --precision) PRECISION=$value ;;
    --set) [[ $value == *=* ]] || die "--set: expected KEY=VALUE, got '$value'"; SETS+=("$value") ;;
    --system) SYSTEM=$value ;;
    --out) OUT=$value ;;
    --report) REPORT=$value ;;
    --run-time-limit) RUN_TIME_LIMIT=$value ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
done

# ---------------------------------------------------------------------------- environment
if [ -z "$SYSTEM" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then SYSTEM=cuda
  elif command -v rocm-smi >/dev/null 2>&1; then SYSTEM=frontier
  else SYSTEM=local
  fi
fi
case $SYSTEM in
  local|cuda|frontier) ;;
  *) die "--system: '$SYSTEM' is not allowed; allowed: local, cuda, frontier" ;;
esac
cd "$HOME_DIR" || die "cannot enter $HOME_DIR"
if [ -f "env/$SYSTEM.sh" ]; then
  # shellcheck source=/dev/null
  source "env/$SYSTEM.sh" || { note "env/$SYSTEM.sh could not set up the environment (see above); nothing was run"; exit 1; }
fi
PYTHON=${VIT_SCALE_PYTHON:-python}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  PYTHON=python3
fi

# ---------------------------------------------------------------------------- the plan
# The study file, the options and their checks in Python (PyYAML and the trainer's own tables of
# models and strategies, which import no torch); it prints shell assignments, or one error line.
CONFIG=${CONFIG:-configs/studies/plugin_comparison.yaml}
[ -f "$CONFIG" ] || die "--config: no such file: $CONFIG"
PLAN=$("$PYTHON" - "$CONFIG" "$STUDY" "$MODEL" "$STRATEGIES" "$BATCH_SIZES" "$STEPS" "$WARMUP" "$PRECISION" \
       "$RUN_TIME_LIMIT" <<'PY'
import re, shlex, sys

def fail(message):
    print(f"plugin_comparison.sh: {message}", file=sys.stderr)
    sys.exit(2)

try:
    import yaml
    from vit_scale.distributed import parse_strategy
    from vit_scale.errors import UserError
    from vit_scale.models import get_spec
except ImportError as exc:
    fail(f"cannot import PyYAML or vit_scale ({exc}); build the venv first (env/setup_venv.sh)")

path, study, model, strategies, batch_sizes, steps, warmup, precision, limit = sys.argv[1:]
try:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
except (OSError, yaml.YAMLError) as exc:
    fail(f"--config: cannot read {path}: {' '.join(str(exc).split())}")
known = {"study", "description", "model", "strategies", "batch_sizes", "steps", "warmup_steps", "precision", "settings"}
unknown = sorted(set(data) - known)
if unknown:
    fail(f"--config: unknown key {unknown[0]!r} in {path}; allowed: {', '.join(sorted(known))}")

def as_list(text, default):
    if text:
        return [x.strip() for x in text.split(",") if x.strip()]
    return [str(x) for x in (default or [])]

study = study or str(data.get("study", "plugin_comparison"))
if not re.fullmatch(r"[A-Za-z0-9._-]+", study):
    fail(f"--study: {study!r} must be letters, digits, '.', '_' or '-'")
model = model or str(data.get("model", "vit_base"))
try:
    get_spec(model)
except UserError as exc:
    fail(f"--model: {str(exc).split(': ', 1)[1]}")
labels = as_list(strategies, data.get("strategies"))
if not labels:
    fail("--strategies: no strategy given")
for label in labels:
    try:
        parse_strategy(label)
    except UserError as exc:
        fail(f"--strategies: {str(exc).split(': ', 1)[1]}")
sizes = as_list(batch_sizes, data.get("batch_sizes"))
if not sizes or not all(re.fullmatch(r"[1-9]\d*", s) for s in sizes):
    fail(f"--batch-sizes: expected positive whole numbers separated by commas, got {','.join(sizes) or 'nothing'}")

def whole(name, option, text, default, minimum):
    value = text or str(data.get(name, default))
    if not re.fullmatch(r"\d+", value) or int(value) < minimum:
        fail(f"{option}: expected a whole number of at least {minimum}, got {value!r}")
    return int(value)

steps_n = whole("steps", "--steps", steps, 25, 2)
warmup_n = whole("warmup_steps", "--warmup-steps", warmup, 5, 0)
if not warmup and warmup_n >= steps_n:  # a short smoke test (--steps 4) keeps most steps timed
    warmup_n = max(1, steps_n // 4)
if warmup_n >= steps_n:
    fail(f"--warmup-steps: must be less than --steps ({steps_n}) so that some steps are timed, got {warmup_n}")
if limit and not re.fullmatch(r"[1-9]\d*", limit):
    fail(f"--run-time-limit: expected whole minutes, got {limit!r}")
precisions = ("fp32", "bf16", "fp16")
table = data.get("precision", {"default": "fp32"})
if isinstance(table, str):
    table = {"default": table}
if not isinstance(table, dict):
    fail(f"--config: precision in {path} must be a precision or a mapping of strategy to precision")
if precision and precision not in precisions:
    fail(f"--precision: {precision!r} is not allowed; allowed: {', '.join(precisions)}")
for key, value in table.items():
    if value not in precisions:
        fail(f"--config: precision of {key} in {path} is {value!r}; allowed: {', '.join(precisions)}")
settings = data.get("settings") or {}
if not isinstance(settings, dict) or not all(isinstance(v, list) and all("=" in str(x) for x in v)
                                              for v in settings.values() if v is not None):
    fail(f"--config: settings in {path} must map a strategy to a list of key=value")

print(f"STUDY={shlex.quote(study)}")
print(f"MODEL={shlex.quote(model)}")
print(f"STEPS={steps_n}")
print(f"WARMUP={warmup_n}")
print("LABELS=(" + " ".join(shlex.quote(x) for x in labels) + ")")
print("SIZES=(" + " ".join(sizes) + ")")
print("declare -gA PRECISION_OF=()")
print("declare -gA SETTINGS_OF=()")
for label in labels:
    print(f"PRECISION_OF[{label}]={shlex.quote(precision or table.get(label, table.get('default', 'fp32')))}")
    print(f"SETTINGS_OF[{label}]={shlex.quote(' '.join(str(x) for x in settings.get(label) or []))}")
PY
) || exit 2
eval "$PLAN"
REPORT=${REPORT:-report/$STUDY}

# ---------------------------------------------------------------------------- the runs
TOTAL=$(( ${#LABELS[@]} * ${#SIZES[@]} ))
note "$STUDY: $MODEL, ${#LABELS[@]} strategies x ${#SIZES[@]} batch sizes = $TOTAL runs on one device ($SYSTEM) -> $OUT/$STUDY"
LOG_DIR="$OUT/$STUDY/logs"
[ "$DRY_RUN" = 1 ] || mkdir -p "$LOG_DIR" || die "--out: cannot create $LOG_DIR"

declare -a RESULTS=()
FAILED=0
n=0
for label in "${LABELS[@]}"; do
  read -r -a extra <<< "${SETTINGS_OF[$label]}"
  for batch in "${SIZES[@]}"; do
    n=$((n + 1))
    cmd=("$PYTHON" -m vit_scale train "model=$MODEL" "strategy=$label" "train.batch_size=$batch"
         "train.steps=$STEPS" "train.warmup_steps=$WARMUP" "train.precision=${PRECISION_OF[$label]}"
         "output.study=$STUDY" "output.dir=$OUT" system.launcher=single "${extra[@]}" "${SETS[@]}")
    if [ -n "$RUN_TIME_LIMIT" ]; then
      cmd=(timeout --signal=TERM --kill-after=60 "${RUN_TIME_LIMIT}m" "${cmd[@]}")
    fi
    if [ "$DRY_RUN" = 1 ]; then
      printf '%q ' "${cmd[@]}"; echo
      continue
    fi
    log="$LOG_DIR/$label-b$batch.log"
    note "[$n/$TOTAL] $label batch $batch (${PRECISION_OF[$label]})"
    "${cmd[@]}" > "$log" 2>&1
    rc=$?
    case $rc in
      0) result=ok ;; 2) result="bad input" ;; 3) result=oom ;; 4) result=diverged ;; 5|124|137) result=timeout ;;
      6) result=skipped ;; *) result=failed ;;
    esac
    summary=$(grep -m1 -E 'images/s [0-9]' "$log" | sed 's/^ *//')
    reason=$(grep -m1 -E '^(vit-scale: error: |  error: )' "$log" | sed 's/^ *//')
    RESULTS+=("$(printf '%-20s %6s  %-10s %s' "$label" "$batch" "$result" "${summary:-$reason}")")
    [ "$rc" = 0 ] || { FAILED=$((FAILED + 1)); note "  $result (exit $rc): ${reason:-see $log}"; }
  done
done
[ "$DRY_RUN" = 1 ] && exit 0

echo
printf '%-20s %6s  %-10s %s\n' strategy batch status "images/s (timed steps)"
printf '%s\n' "${RESULTS[@]}"

# ---------------------------------------------------------------------------- the analysis
if [ "$ANALYSIS" = 1 ]; then
  if [ ! -f analysis/weak_scaling.py ]; then
    note "analysis/weak_scaling.py not found: no report"
  elif "$PYTHON" analysis/weak_scaling.py "$OUT/$STUDY" --out "$REPORT" > "$LOG_DIR/analysis.log" 2>&1; then
    note "report: $REPORT"
  else
    note "the analysis failed (see $LOG_DIR/analysis.log); the run records are in $OUT/$STUDY"
  fi
fi
[ "$FAILED" = 0 ] || { note "$FAILED of $TOTAL runs did not finish ok"; exit 1; }
exit 0
