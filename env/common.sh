# Helpers for env/frontier.sh, env/cuda.sh and env/local.sh. Sourced by them, never run.
#
# The rule they follow: check everything first (the module command, every module, the venv),
# and only then change the environment. A check that fails prints one line and returns 1, so
# the shell that sourced the script keeps running with its environment as it was, instead of
# half of it set.
# shellcheck shell=bash

vs_fail() {
  echo "${VS_ENV_SCRIPT:-env}: $*" >&2
  return 1
}

# A batch script is not a login shell, so `module` may not be defined yet. Lmod's init script
# defines it; the places below are where Lmod lives on Debian/Ubuntu, on Cray systems, and
# where Environment Modules lives on RHEL.
vs_module_command() {
  declare -F module >/dev/null && return 0
  local init
  for init in "${LMOD_PKG:+$LMOD_PKG/init/bash}" /usr/share/lmod/lmod/init/bash \
              /opt/cray/pe/lmod/lmod/init/bash /usr/share/Modules/init/bash; do
    if [ -n "$init" ] && [ -r "$init" ]; then
      # shellcheck source=/dev/null
      source "$init" >/dev/null 2>&1
      declare -F module >/dev/null && return 0
    fi
  done
  vs_fail "the 'module' command (Lmod) is not available here; load modules by hand or set VIT_SCALE_MODULES='' to load none"
}

# vs_check_modules MODULE...: every one is available, or one line naming the first that is not
vs_check_modules() {
  local name
  [ $# -gt 0 ] || return 0
  vs_module_command || return 1
  for name in "$@"; do
    if ! module is-avail "$name" >/dev/null 2>&1; then
      vs_fail "module '$name' is not available (MODULEPATH=${MODULEPATH:-unset}); nothing was loaded. See 'module spider ${name%%/*}', then set VIT_SCALE_MODULES to the names this site uses"
      return 1
    fi
  done
}

vs_load_modules() {
  [ $# -gt 0 ] || return 0
  # Lmod loads all of them or none, and says why on stderr
  module load "$@" || vs_fail "module load $* failed (see Lmod's message above)"
}

# The venv that env/setup_venv.sh builds: VIT_SCALE_VENV, else .venv at the repository root.
# VIT_SCALE_VENV set to an empty string means "use the python already on PATH" (a conda env,
# a container): the check is then only that this python can import the toolkit.
vs_check_venv() {
  if [ "${VIT_SCALE_VENV-unset}" = "" ]; then
    python -c 'import vit_scale' 2>/dev/null ||
      vs_fail "VIT_SCALE_VENV is empty, so the python on PATH is used, but it cannot import vit_scale; run: pip install -e $VIT_SCALE_HOME"
    return
  fi
  local venv=${VIT_SCALE_VENV:-$VIT_SCALE_HOME/.venv}
  if [ ! -x "$venv/bin/python" ]; then
    vs_fail "no Python venv at $venv; build it with: bash $VIT_SCALE_HOME/env/setup_venv.sh ${VS_SYSTEM:-local} (or set VIT_SCALE_VENV)"
    return 1
  fi
  VS_VENV=$venv
}

vs_activate_venv() {
  [ -n "${VS_VENV:-}" ] || return 0
  # what `source bin/activate` does, minus the prompt: srun starts tasks with this PATH, so
  # every rank runs the venv's python and its torch
  export VIRTUAL_ENV=$VS_VENV
  # the venv's python first
  export PATH=$VS_VENV/bin:$PATH
}
