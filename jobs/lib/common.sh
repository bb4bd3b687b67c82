# Sourced by the scripts of jobs/; never run. They set PROG (the script's name, for messages) first.
# shellcheck shell=bash

HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# the study's Python code is imported from this checkout, also by a Python that has no vit-scale installed
export PYTHONPATH="$HOME_DIR${PYTHONPATH:+:$PYTHONPATH}"


# A Python that can read configs/ (PyYAML) before the system's environment is set up: the one
# given in VIT_SCALE_PYTHON, else the venv's, else the system's.
find_helper_python() {
  local candidate
  for candidate in "${VIT_SCALE_PYTHON:-}" "${VIT_SCALE_VENV:-$HOME_DIR/.venv}/bin/python" python3; do
    if [ -n "$candidate" ] && "$candidate" -c 'import yaml' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "$PROG: no Python with PyYAML to read configs/; build the venv first: bash env/setup_venv.sh local" >&2
  return 2
}

# run_vit_scale COMMAND ARG...: what every job script does, and the last thing it does.
#  1. every option is checked before anything is set up: `--which-env` answers with the env script
#     of the chosen system, or `none` when there is nothing to set up (--help, --dry-run);
#  2. the system's modules, venv and RCCL/NCCL variables come from that script (env/<system>.sh);
#  3. `python -m vit_scale COMMAND` replaces this shell (exec), so Slurm's signals reach it directly.
# Bad input ends here with the command's own one line and exit code 2, before any module is loaded.
run_vit_scale() {
  local vs_command=$1 vs_helper vs_env_script vs_nothing="nothing was run"
  shift
  [ "$vs_command" = check ] && vs_nothing="nothing was checked"
  vs_helper=$(find_helper_python) || exit 2
  vs_env_script=$("$vs_helper" -m vit_scale "$vs_command" --prog "$PROG" --which-env "$@") || exit
  if [ "$vs_env_script" = none ]; then
    exec "$vs_helper" -m vit_scale "$vs_command" --prog "$PROG" "$@"
  fi
  # shellcheck source=/dev/null
  source "$HOME_DIR/$vs_env_script" ||
    { echo "$PROG: $vs_env_script could not set up the environment (see above); $vs_nothing" >&2; exit 1; }
  exec "${VIT_SCALE_PYTHON:-python}" -m vit_scale "$vs_command" --prog "$PROG" "$@"
}
