# Helpers for jobs/weak_scaling.sh and jobs/submit_sweep.sh; sourced, never run.
# They expect PROG (the script's name, for messages) and HOME_DIR (the repository).
# shellcheck shell=bash

# Bad input: one line naming the option and what is allowed, exit 2 (the trainer's code for it),
# before anything is submitted or launched.
die() { echo "$PROG: $*" >&2; exit 2; }
note() { echo "$PROG: $*" >&2; }

# A command as you could paste it into a shell.
show_cmd() {
  local arg out=()
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./=:,+@%{}-]+$ ]]; then out+=("$arg"); else out+=("$(printf '%q' "$arg")"); fi
  done
  echo "${out[*]}"
}

# Python for jobs/lib/study.py, which reads configs/ with PyYAML: VIT_SCALE_PYTHON, else the
# venv's if it is built, else the system's.
find_helper_python() {
  local candidate
  for candidate in "${VIT_SCALE_PYTHON:-}" "$HOME_DIR/.venv/bin/python" python3; do
    if [ -n "$candidate" ] && "$candidate" -c 'import yaml' 2>/dev/null; then
      HELPER_PY=$candidate
      return 0
    fi
  done
  die "no Python with PyYAML to read configs/; build the venv first: bash env/setup_venv.sh local"
}

study_py() { "$HELPER_PY" "$HOME_DIR/jobs/lib/study.py" --prog "$PROG" "$@"; }

# Options of jobs/weak_scaling.sh that say what to study; jobs/lib/study.py checks their values.
STUDY_OPTIONS=(--study --models --strategies --nodes --batch-size --steps --warmup-steps --launcher
               --precision --backward-prefetch --limit-all-gathers --forward-prefetch --fsdp-version
               --activation-checkpointing --use-orig-params --skip-if-not-fits --set)
is_study_option() { [[ " ${STUDY_OPTIONS[*]} " == *" $1 "* ]]; }

# Frontier says who it is through Lmod (LMOD_SYSTEM_NAME), or in its host names
on_frontier() { [ "${LMOD_SYSTEM_NAME:-}" = frontier ] || [[ $(hostname -f 2>/dev/null) == *frontier* ]]; }

# system_file NAME: the profile configs/systems/NAME.yaml, or one line listing the known ones
system_file() {
  local known
  if [ ! -f "$HOME_DIR/configs/systems/$1.yaml" ]; then
    known=$(cd "$HOME_DIR/configs/systems" && find . -name '*.yaml' | sed 's|^\./||; s/\.yaml$//' | sort | paste -sd, - | sed 's/,/, /g')
    die "--system: unknown system '$1'; allowed: $known"
  fi
  echo "$HOME_DIR/configs/systems/$1.yaml"
}
