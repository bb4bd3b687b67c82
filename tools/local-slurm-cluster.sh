#!/usr/bin/env bash
# A real, throw-away Slurm cluster on one machine: munged, slurmctld and one slurmd per emulated
# node, with every file (config, keys, sockets, pids, logs, state) under one directory, and no
# systemd. The test suite starts one per session; you can use it to try jobs/weak_scaling.sh
# on a laptop before you take it to a cluster.
#
#   sudo tools/local-slurm-cluster.sh up /tmp/vs-slurm       # start; prints the SLURM_CONF to export
#   eval "$(tools/local-slurm-cluster.sh env /tmp/vs-slurm)"  # point sbatch/squeue/srun at it
#   sbatch -N 2 jobs/weak_scaling.sh --system local
#   sudo tools/local-slurm-cluster.sh down /tmp/vs-slurm     # stop everything it started, by PID
#
# Settings, read by "up" from the environment:
#   NODES=2          emulated nodes, named n1..nN
#   CPUS=$(nproc)    CPUs each node claims (may exceed the real count)
#   GPUS=0           fake GPUs per node (gres/gpu backed by /dev/null-like devices), to try --gpus flags
#   PARTITION=debug  name of the single partition
#   UP_TIMEOUT=30    seconds to wait for every node to report idle
#   MIN_JOB_AGE=300  seconds scontrol keeps showing a finished job (the test suite reads jobs it started
#                    minutes before)
#
# Needs root (slurmd starts job steps as their owner) and, on Debian/Ubuntu:
#   apt-get install --no-install-recommends slurm-wlm munge
# For --launcher mpi (srun --mpi=pmix) also install openmpi-bin and libpmix-dev BEFORE "up": the
# pmix plugin loads the unversioned libpmix.so, which only libpmix-dev ships (openmpi-bin brings
# libpmix2 alone), and slurmd looks for it only when it starts.
# Every slurmd shares the host's network and cores: putting each in its node's network namespace
# (vit_scale/cluster/emulation.py, what a study without Slurm does) would need sbatch/srun/squeue in the
# host's namespace to reach them, i.e. a host address on the emulated subnet, which the rule that such
# traffic stays between the run's own namespaces forbids (docs/jobs.md, "Isolated emulated nodes").
# Tested with Slurm 22.05 (Debian 12). Accounting (sacct) is left out; without slurmdbd, finished
# jobs are listed one per line in DIR/log/jobcomp.txt instead.
set -euo pipefail

usage() { echo "usage: $0 up|down|env|status DIR" >&2; exit 2; }

action=${1:-}
[ $# -eq 2 ] || usage
CLUSTER_DIR=$(realpath -m "$2")
CONF=$CLUSTER_DIR/etc/slurm.conf

say() { echo "local-slurm-cluster: $*" >&2; }

# Free TCP ports on the loopback interface, one per daemon; each cluster gets its own set so that
# two clusters (two test sessions) can run side by side.
pick_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))
EOF
}

check_prerequisites() {
  local missing=() tool
  for tool in munged mungekey slurmctld slurmd sinfo python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "missing ${missing[*]}; install with: apt-get install --no-install-recommends slurm-wlm munge python3"
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    say "must run as root: slurmd starts every job step as the user who submitted it"
    exit 1
  fi
  # munged refuses a socket below any directory that others cannot traverse, e.g. pytest's
  # /tmp/pytest-of-root (mode 0700), with a message that does not name the directory.
  local dir
  dir=$(dirname "$CLUSTER_DIR")
  while [ "$dir" != / ]; do
    if [ -d "$dir" ] && [ $(( 8#$(stat -c %a "$dir") & 1 )) -eq 0 ]; then
      say "$dir is not world-executable, so munged would refuse its socket; use a directory such as \$(mktemp -d /tmp/vs-slurm.XXXXXX)"
      exit 1
    fi
    dir=$(dirname "$dir")
  done
}

write_slurm_conf() {  # write_slurm_conf CTLD_PORT NODE_PORT...
  local ctld_port=$1; shift
  local memory gres="" i=0 port
  # a node that claims more memory than slurmd detects is drained, so every node claims exactly that
  memory=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  if [ "$GPUS" -gt 0 ]; then
    gres=" Gres=gpu:$GPUS"
    # gres/gpu accepts only device files; /dev/null's numbers (1,3) make harmless ones
    for i in $(seq 0 $((GPUS - 1))); do
      rm -f "$CLUSTER_DIR/dev/gpu$i"
      mknod "$CLUSTER_DIR/dev/gpu$i" c 1 3
    done
    echo "Name=gpu File=$CLUSTER_DIR/dev/gpu[0-$((GPUS - 1))]" > "$CLUSTER_DIR/etc/gres.conf"
  fi
  cat > "$CONF" <<EOF
ClusterName=vitscale
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$CLUSTER_DIR/run/munge.socket
StateSaveLocation=$CLUSTER_DIR/state
# %n: every emulated node needs its own spool and TmpFS (mpi/pmix puts per-step dirs in TmpFS)
SlurmdSpoolDir=$CLUSTER_DIR/spool/%n
TmpFS=$CLUSTER_DIR/tmp/%n
SlurmctldPidFile=$CLUSTER_DIR/run/slurmctld.pid
SlurmdPidFile=$CLUSTER_DIR/run/slurmd.%n.pid
SlurmctldLogFile=$CLUSTER_DIR/log/slurmctld.log
SlurmdLogFile=$CLUSTER_DIR/log/slurmd.%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# start batch jobs at once instead of on the default 3-second tick
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
# no cgroups: processes are tracked by parentage, nothing is bound or limited
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
# lets a node claim more CPUs than the machine has instead of being drained
SlurmdParameters=config_overrides
# a job that depends on a failed one is cancelled instead of pending forever
DependencyParameters=kill_invalid_depend
# an impossible request (-N 3 on 2 nodes) is refused at submission instead of pending forever
EnforcePartLimits=ALL
JobCompType=jobcomp/filetxt
JobCompLoc=$CLUSTER_DIR/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
KillWait=5
MinJobAge=${MIN_JOB_AGE:-300}
GresTypes=gpu
EOF
  i=0
  for port in "$@"; do
    i=$((i + 1))
    mkdir -p "$CLUSTER_DIR/tmp/n$i"
    # every node is this host: NodeAddr is what srun connects to, since n1, n2... do not resolve
    echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS RealMemory=$memory$gres State=UNKNOWN" >> "$CONF"
  done
  echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$CONF"
}

wait_until_idle() {
  local deadline=$(( $(date +%s) + UP_TIMEOUT )) states
  while :; do
    states=$(sinfo -h -N -o '%t' 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ' || true)
    [ "$states" = " $NODES idle " ] && return 0
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "nodes not idle after ${UP_TIMEOUT}s (sinfo says:$states); logs are in $CLUSTER_DIR/log"
      tail -n 5 "$CLUSTER_DIR"/log/*.log >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

start_cluster() {
  NODES=${NODES:-2} CPUS=${CPUS:-$(nproc)} GPUS=${GPUS:-0} PARTITION=${PARTITION:-debug}
  UP_TIMEOUT=${UP_TIMEOUT:-30}
  check_prerequisites
  if [ -e "$CLUSTER_DIR/run/slurmctld.pid" ]; then
    say "$CLUSTER_DIR already holds a running cluster; stop it first with: $0 down $CLUSTER_DIR"
    exit 1
  fi
  mkdir -p "$CLUSTER_DIR"/{etc,munge,run,state,spool,log,dev,tmp}
  chmod 755 "$CLUSTER_DIR" "$CLUSTER_DIR/run"  # munged: others must reach the socket
  chmod 700 "$CLUSTER_DIR/munge"                # munged: the key directory must be private

  local ports
  read -r -a ports <<< "$(pick_ports $((NODES + 1)))"

  mungekey --create --keyfile="$CLUSTER_DIR/munge/munge.key" --force
  munged --key-file="$CLUSTER_DIR/munge/munge.key" --socket="$CLUSTER_DIR/run/munge.socket" \
         --pid-file="$CLUSTER_DIR/run/munged.pid" --log-file="$CLUSTER_DIR/log/munged.log" \
         --seed-file="$CLUSTER_DIR/munge/munged.seed"
  local i
  for i in $(seq 50); do
    [ -S "$CLUSTER_DIR/run/munge.socket" ] && break
    sleep 0.1
  done

  write_slurm_conf "${ports[@]}"
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF"
  for i in $(seq 1 "$NODES"); do
    slurmd -f "$CONF" -N "n$i"   # -N: one slurmd per emulated node on the same host
  done
  wait_until_idle
  say "$NODES node(s) with $CPUS CPUs each are idle; now run: export SLURM_CONF=$CONF"
}

# Processes of THIS cluster that outlived their daemons: step daemons holding files under the
# cluster directory, and job processes started with this cluster's SLURM_CONF (even those that
# detached from their job). Nothing else on the machine matches.
leftover_pids() {
  local proc pid environment
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    if [[ "$(readlink "$proc/exe" 2>/dev/null || true)" == */slurmstepd ]]; then
      if find "$proc/fd" "$proc/cwd" -maxdepth 1 -lname "$CLUSTER_DIR/*" 2>/dev/null | grep -q .; then
        echo "$pid"
      fi
      continue
    fi
    # 2>/dev/null first: processes come and go while we read
    environment=$(tr '\0' '\n' 2>/dev/null < "$proc/environ") || continue
    if grep -qxF "SLURM_CONF=$CONF" <<< "$environment" && grep -q '^SLURM_JOB_ID=' <<< "$environment"; then
      echo "$pid"
    fi
  done
}

stop_pids() {  # SIGTERM all at once (each daemon takes ~2 s to exit), SIGKILL what is left after 10 s
  local pid alive
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 100); do
    alive=()
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); fi
    done
    [ ${#alive[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  say "still running after SIGTERM, killing: ${alive[*]}"
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

pids_from() {  # the PIDs in the given pid files that exist
  local file
  for file in "$@"; do
    if [ -s "$file" ]; then cat "$file"; fi
  done
}

stop_cluster() {
  export SLURM_CONF=$CONF
  local ctld jobs daemons stuck
  ctld=$(pids_from "$CLUSTER_DIR/run/slurmctld.pid")
  if [ -n "$ctld" ] && kill -0 "$ctld" 2>/dev/null; then
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086  # one job id per word
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [ -z "$(squeue -h 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  mapfile -t daemons < <(pids_from "$CLUSTER_DIR"/run/slurmd.*.pid "$CLUSTER_DIR/run/slurmctld.pid")
  stop_pids "${daemons[@]}"
  # step daemons ignore SIGTERM; whatever is left now is stuck
  mapfile -t stuck < <(leftover_pids)
  if [ ${#stuck[@]} -gt 0 ]; then
    say "killing left-over processes of this cluster: ${stuck[*]}"
    kill -KILL "${stuck[@]}" 2>/dev/null || true
  fi
  mapfile -t daemons < <(pids_from "$CLUSTER_DIR/run/munged.pid")
  stop_pids "${daemons[@]}"
  rm -f "$CLUSTER_DIR"/run/*.pid
}

case "$action" in
  up)
    # a half-started cluster is stopped again, so a failed "up" leaves no daemons behind
    undo_failed_start() {
      local status=$?
      if [ "$status" -ne 0 ]; then
        set +e
        say "up failed, stopping what was started"
        stop_cluster
      fi
    }
    trap undo_failed_start EXIT
    start_cluster
    trap - EXIT ;;
  down) stop_cluster ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  status)
    export SLURM_CONF=$CONF
    sinfo -N
    squeue ;;
  *) usage ;;
esac
