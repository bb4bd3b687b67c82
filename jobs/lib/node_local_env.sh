# Sourced by jobs/lib/common.sh; never run. Start-up at scale (docs/jobs.md): once per allocation, the
# venv and the vit_scale package go to node-local storage on every node of the job, and every rank (and
# the study itself) then runs from there instead of opening thousands of files on the shared file system.
#
#   1. prepare    on every node: the directory, and room for the copy
#   2. pack       the venv and vit_scale/ into one tar file on this (the first) node's node-local storage
#   3. broadcast  the tar file to every node with sbcast (Slurm's tree-shaped file broadcast); without
#                 sbcast each node copies the venv from the shared file system itself (one reader a node,
#                 once, instead of every rank of every run)
#   4. unpack     on every node
#   5. verify     on every node: its python is the copy, and it imports vit_scale from the copy
#
# Each step is one line in the job log with its time. A step that fails on any node ends the job with
# one line naming the node(s), before any run starts; nothing of the study is touched.
# shellcheck shell=bash

# milliseconds since the epoch (date, not EPOCHREALTIME, which bash 4.4 on SLES 15 lacks)
vs_ms() { date +%s%3N; }

# seconds since a vs_ms stamp, one decimal
vs_since() {
  local ms=$(($(vs_ms) - $1))
  printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
}

# KiB as MiB, one decimal
vs_mib() { awk -v k="$1" 'BEGIN {printf "%.1f MiB", k / 1024}'; }

# this node's name as Slurm knows it
vs_nl_here() { echo "${SLURMD_NODENAME:-$(hostname)}"; }

vs_nl_say() { echo "$PROG: node-local environment: $*"; }

# One line and a non-zero status: the step, the nodes it failed on, the first node's message
vs_nl_fail() {
  local step=$1 lines=$2 nodes first
  nodes=$(sed -n 's/^FAILED \([^:]*\):.*/\1/p' <<< "$lines" | sort -u | paste -sd, -)
  first=$(sed -n 's/^FAILED [^:]*: //p' <<< "$lines" | head -n 1)
  if [ -z "$nodes" ]; then  # srun itself failed: its last line says why
    nodes=$(vs_nl_here)
    first=$(grep -v '^$' <<< "$lines" | tail -n 1)
  fi
  echo "$PROG: node-local environment: $step failed on ${nodes//,/, }: ${first:-no message}; nothing was run (VIT_SCALE_NODE_LOCAL_ENV=0 runs from the shared file system)" >&2
  return 1
}

# vs_nl_each_node SCRIPT: the bash SCRIPT once on every node of the allocation; its output (FAILED lines)
# on stdout, the status non-zero when any node failed
vs_nl_each_node() {
  local nodes=${SLURM_JOB_NUM_NODES:-1}
  srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$1" 2>&1
}

# What every per-node script starts with: the node's name and how it reports a failure
# shellcheck disable=SC2016  # expanded on each node, not here
VS_NL_NODE='set -o pipefail; node=${SLURMD_NODENAME:-$(hostname)}; fail() { echo "FAILED $node: $*"; exit 1; }'

# The per-node steps; VS_NL_DEST, VS_NL_NEED_KB, VS_NL_SOURCES reach them through srun's environment
# shellcheck disable=SC2016
VS_NL_PREPARE='
msg=$(mkdir -p "$VS_NL_DEST" 2>&1) || fail "cannot create $VS_NL_DEST: ${msg##*: }"
[ -w "$VS_NL_DEST" ] || fail "cannot write to $VS_NL_DEST"
free=$(df -Pk "$VS_NL_DEST" | awk "NR == 2 {print \$4}")
mib() { awk -v k="$1" "BEGIN {printf \"%.1f MiB\", k / 1024}"; }
[ "${free:-0}" -ge "$VS_NL_NEED_KB" ] ||
  fail "$VS_NL_DEST has $(mib "${free:-0}") free, the copy needs $(mib "$VS_NL_NEED_KB")"
'
# Into a folder of the node's own, then renamed into place: nodes that share a disk (emulated ones) never
# see a half-written copy; the second to finish finds the first one's copy there and keeps it
# shellcheck disable=SC2016
VS_NL_UNPACK='
part=$VS_NL_DEST/.part-$node
rm -rf "$part" && mkdir -p "$part" || fail "cannot create $part"
if [ -n "${VS_NL_SOURCES:-}" ]; then  # no sbcast: straight from the shared file system
  msg=$( { eval "tar -cf - $VS_NL_SOURCES" | tar -xf - -C "$part"; } 2>&1) || fail "copy: $(tail -n 1 <<< "$msg")"
else
  msg=$(tar -xf "$VS_NL_DEST/env.tar" -C "$part" 2>&1) || fail "unpack: $(tail -n 1 <<< "$msg")"
fi
touch "$part/venv/.vit-scale-complete" || fail "cannot write to $part"
if ! mv -T "$part" "$VS_NL_DEST/env" 2>/dev/null; then
  rm -rf "$part"
  [ -f "$VS_NL_DEST/env/venv/.vit-scale-complete" ] || fail "cannot move the copy into $VS_NL_DEST/env"
fi
'
# shellcheck disable=SC2016
VS_NL_VERIFY='
rm -f "$VS_NL_DEST/env.tar"
env=$VS_NL_DEST/env
out=$(PYTHONPATH="$env/src${PYTHONPATH:+:$PYTHONPATH}" "$env/venv/bin/python" -c "import sys, vit_scale; print(sys.prefix); print(vit_scale.__file__)" 2>&1) ||
  fail "verify: $env/venv/bin/python: $(tail -n 1 <<< "$out")"
[ "$(sed -n 1p <<< "$out")" = "$env/venv" ] || fail "verify: python runs from $(sed -n 1p <<< "$out"), not $env/venv"
[[ "$(sed -n 2p <<< "$out")" == "$env/src/"* ]] || fail "verify: vit_scale comes from $(sed -n 2p <<< "$out"), not $env/src"
'

# vs_node_local_env PARENT: the copy under PARENT/vit-scale-JOB on every node, then this shell's environment
# pointed at it (PATH, VIRTUAL_ENV, PYTHONPATH, VIT_SCALE_PYTHON). Status 1 after one line when it failed.
vs_node_local_env() {
  local parent=$1 venv=${VS_VENV:-} nodes=${SLURM_JOB_NUM_NODES:-1} dest pack t0 out size_kb need_kb sources
  if [ -z "$venv" ]; then
    vs_nl_say "not made: VIT_SCALE_VENV is empty (the python on PATH is used); pack such an environment yourself (conda-pack) or give a venv"
    return 0
  fi
  dest=$parent/vit-scale-${SLURM_JOB_ID:-$$}
  # what tar reads: the venv as venv/, the checkout's vit_scale/ as src/vit_scale/ (S: symbolic links'
  # targets are left as they are)
  printf -v sources '%q ' --transform 's,^\.,venv,S' -C "$venv" . -C "$HOME_DIR" --transform 's,^vit_scale,src/vit_scale,S' vit_scale
  vs_nl_say "$venv and $HOME_DIR/vit_scale to $dest/env on each of $nodes node(s)"
  # the toolkit's commit for the records of runs that import vit_scale from the copy, which is no checkout
  # (record/versions.py): the checkout's, read here
  VIT_SCALE_COPIED_REVISION=$(cd "$HOME_DIR" && "$venv/bin/python" -c 'from vit_scale.record.versions import git_revision; print(git_revision() or "")' 2>/dev/null)
  export VIT_SCALE_COPIED_REVISION

  t0=$(vs_ms)
  size_kb=$(du -sk "$venv/" "$HOME_DIR/vit_scale/" 2>/dev/null | awk '{s += $1} END {print s + 0}')
  need_kb=$size_kb
  command -v sbcast >/dev/null && need_kb=$((2 * size_kb))  # the tar file and what it unpacks to
  out=$(VS_NL_DEST=$dest VS_NL_NEED_KB=$need_kb vs_nl_each_node "$VS_NL_NODE$VS_NL_PREPARE") ||
    { vs_nl_clean "$dest"; vs_nl_fail prepare "$out"; return 1; }
  vs_nl_say "prepare: $(vs_mib "$size_kb") to copy, $dest made and room for it on $nodes node(s), in $(vs_since "$t0")"

  if ! command -v sbcast >/dev/null; then
    t0=$(vs_ms)
    out=$(VS_NL_DEST=$dest VS_NL_SOURCES=$sources vs_nl_each_node "$VS_NL_NODE$VS_NL_UNPACK") ||
      { vs_nl_clean "$dest"; vs_nl_fail copy "$out"; return 1; }
    vs_nl_say "copy: no sbcast here, so each of $nodes node(s) read the venv from the shared file system, in $(vs_since "$t0")"
  else
    t0=$(vs_ms)
    # on this node's own storage, beside (not at) the path sbcast writes to
    pack=$dest/pack-$(vs_nl_here).tar
    out=$(eval "tar -cf \"\$pack\" $sources" 2>&1) ||
      { vs_nl_clean "$dest"; vs_nl_fail pack "FAILED $(vs_nl_here): $(tail -n 1 <<< "$out")"; return 1; }
    vs_nl_say "pack: $(vs_mib $(($(stat -c %s "$pack") / 1024))) into one file in $(vs_since "$t0")"

    t0=$(vs_ms)
    out=$(sbcast -f "$pack" "$dest/env.tar" 2>&1) ||
      { vs_nl_clean "$dest"; vs_nl_fail broadcast "FAILED $(vs_nl_here): sbcast: $(tail -n 1 <<< "$out")"; return 1; }
    rm -f "$pack"
    vs_nl_say "broadcast: sbcast to $nodes node(s) in $(vs_since "$t0")"

    t0=$(vs_ms)
    out=$(VS_NL_DEST=$dest VS_NL_SOURCES="" vs_nl_each_node "$VS_NL_NODE$VS_NL_UNPACK") ||
      { vs_nl_clean "$dest"; vs_nl_fail unpack "$out"; return 1; }
    vs_nl_say "unpack: on $nodes node(s) in $(vs_since "$t0")"
  fi

  t0=$(vs_ms)
  out=$(VS_NL_DEST=$dest vs_nl_each_node "$VS_NL_NODE$VS_NL_VERIFY") ||
    { vs_nl_clean "$dest"; vs_nl_fail verify "$out"; return 1; }
  vs_nl_say "verify: python and vit_scale from $dest/env on $nodes node(s) in $(vs_since "$t0")"

  # ---- every rank, and this shell's study, runs from the copy
  # the copied venv: what `source bin/activate` would set
  export VIRTUAL_ENV=$dest/env/venv
  # the copy's python first; srun gives every rank this PATH, and the path is the same on every node
  export PATH=$dest/env/venv/bin:$PATH
  # vit_scale from the copy, ahead of the checkout (whose configs/ and analysis/ VIT_SCALE_HOME still names)
  export PYTHONPATH=$dest/env/src${PYTHONPATH:+:$PYTHONPATH}
  if [[ ${VIT_SCALE_PYTHON:-} == "$venv"/bin/* ]]; then
    # the same interpreter, in the copy
    export VIT_SCALE_PYTHON=$dest/env/venv/bin/${VIT_SCALE_PYTHON##*/}
  elif [ -n "${VIT_SCALE_PYTHON:-}" ]; then
    vs_nl_say "note: VIT_SCALE_PYTHON=$VIT_SCALE_PYTHON is not the venv's python, so the ranks run it as given"
  fi
  VS_VENV=$dest/env/venv
  # removed at the end of the job (run_vit_scale calls vs_nl_clean), not left to the site's epilog
  # shellcheck disable=SC2034  # read by jobs/lib/common.sh
  VS_NODE_LOCAL_DEST=$dest
}

# vs_nl_clean DEST: the copies on every node; quiet, best effort
vs_nl_clean() {
  VS_NL_DEST=$1 vs_nl_each_node 'rm -rf "$VS_NL_DEST"' >/dev/null 2>&1 || true
}
