# Sourced by the scripts of jobs/; never run. They expect PROG (the script's name, for messages).
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

