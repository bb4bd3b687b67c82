# Sourced by the scripts of jobs/; never run. They set PROG (the script's name, for messages) first.
# shellcheck shell=bash

HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# vs_node_local_env: the environment on node-local storage, for large allocations
# shellcheck source=jobs/lib/node_local_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/node_local_env.sh"
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
#     of the chosen system, or `none` when there is nothing to set up (--help, --dry-run), and on a
#     second line the node-local directory when this job copies its environment there;
#  2. the system's modules, venv and RCCL/NCCL variables come from that script (env/<system>.sh);
#  3. for a large allocation, the venv goes to node-local storage on every node (node_local_env.sh);
#  4. `python -m vit_scale COMMAND` replaces this shell (exec), so Slurm's signals reach it directly.
#     With a node-local copy it runs as a child instead, so that the copies are removed after it.
# Bad input ends here with the command's own one line and exit code 2, before any module is loaded.
run_vit_scale() {
  local vs_command=$1 vs_helper vs_answer vs_env_script vs_node_local="" vs_nothing="nothing was run" vs_code
  shift
  [ "$vs_command" = check ] && vs_nothing="nothing was checked"
  vs_helper=$(find_helper_python) || exit 2
  vs_answer=$("$vs_helper" -m vit_scale "$vs_command" --prog "$PROG" --which-env "$@") || exit
  { read -r vs_env_script; read -r vs_node_local; } <<< "$vs_answer"
  if [ "$vs_env_script" = none ]; then
    exec "$vs_helper" -m vit_scale "$vs_command" --prog "$PROG" "$@"
  fi
  # shellcheck source=/dev/null
  source "$HOME_DIR/$vs_env_script" ||
    { echo "$PROG: $vs_env_script could not set up the environment (see above); $vs_nothing" >&2; exit 1; }
  if [ -z "$vs_node_local" ]; then
    exec "${VIT_SCALE_PYTHON:-python}" -m vit_scale "$vs_command" --prog "$PROG" "$@"
  fi
  vs_node_local_env "$vs_node_local" || exit 1
  # Slurm signals every process of the batch step (time limit, scancel --batch): python ends on its
  # own, then this shell removes the copies, if the job still has the time
  trap : TERM INT
  "${VIT_SCALE_PYTHON:-python}" -m vit_scale "$vs_command" --prog "$PROG" "$@"
  vs_code=$?
  if [ -n "${VS_NODE_LOCAL_DEST:-}" ]; then
    local t0
    t0=$(vs_ms)
    vs_nl_clean "$VS_NODE_LOCAL_DEST"
    vs_nl_say "removed from every node in $(vs_since "$t0")"
  fi
  exit "$vs_code"
}
