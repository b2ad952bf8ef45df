#!/usr/bin/env bash
# A single-node Slurm for the integration test (docs/slurm.md), everything under one directory.
#
#   tests/slurm/cluster.sh start DIR   install Slurm and munge if missing, start munged (unless one
#                                      answers), slurmctld -c and slurmd on free ports, wait until
#                                      the node is idle; clients then need SLURM_CONF=DIR/slurm.conf
#   tests/slurm/cluster.sh stop DIR    cancel the jobs, stop the daemons started for DIR, wait
#
# Needs root (slurmd runs jobs as their user; apt-get installs). The machine may have no
# systemd: the packages' daemons are not started by the install, so they are started here.
# The configuration, state, spool, logs and pid files stay in DIR: nothing under /etc/slurm
# is read or written, and a Slurm already on the machine keeps its ports.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start DIR | stop DIR" >&2
  exit 2
}

install_if_missing() {
  local missing=0 tool
  for tool in slurmctld slurmd sbatch scontrol sinfo munged munge unmunge; do
    command -v "$tool" >/dev/null 2>&1 || missing=1
  done
  [ "$missing" -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and there is no apt-get"
  echo "cluster.sh: installing ${PACKAGES[*]}" >&2
  # The recommended set is five times larger and brings nothing the test uses.
  if ! { DEBIAN_FRONTEND=noninteractive apt-get -qq update \
    && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends \
      "${PACKAGES[@]}"; } >"$DIR/apt.log" 2>&1; then
    tail -n 20 "$DIR/apt.log" >&2
    die "could not install ${PACKAGES[*]} (log: $DIR/apt.log)"
  fi
}

munge_works() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

start_munge() {
  # A munged that answers (the machine's own, or another cluster's) is shared, never stopped.
  munge_works && return 0
  local key=/etc/munge/munge.key i
  if [ ! -s "$key" ]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile="$key" >/dev/null 2>&1 \
      || dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge "$key"
  chmod 700 /etc/munge
  chmod 600 "$key"
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  runuser -u munge -- munged || die "munged did not start"
  for i in $(seq 50); do
    munge_works && break
    sleep 0.1
  done
  munge_works || die "munged started but munge -n | unmunge fails"
  # Stop it at the end: it was started for this cluster.
  cp /run/munge/munged.pid "$DIR/munged.pid"
}

free_port() {
  # A port nothing listens on: connecting to it is refused. The daemons bind it moments later.
  # Below the kernel's ephemeral range: a port it has handed to an outgoing connection (one
  # in TIME_WAIT after the test suite's many) refuses a connection and a bind alike, and
  # slurmctld then fails with "Address already in use".
  local port i low
  low="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)"
  [ "${low:-0}" -gt 11000 ] || low=32768
  for i in $(seq 100); do
    port=$((10000 + RANDOM % (low - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  die "no free port found"
}

write_conf() {
  local host cpus mem ctld_port slurmd_port
  host="$(hostname -s)"
  cpus="$(nproc)"
  mem="$(free -m | awk '/^Mem:/ {print int($2 * 0.95)}')"
  ctld_port="$(free_port)"
  slurmd_port="$(free_port)"
  [ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$((ctld_port + 1))
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat >"$DIR/slurm.conf" <<EOF
# Written by tests/slurm/cluster.sh: a single-node cluster for the integration test.
ClusterName=restorepoint
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
# Fast tests: 5 s is the smallest credential lifetime (a requeued job restarts after about
# twice that); the scheduler looks every 2 s; KILL follows TERM after 5 s.
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=2,bf_interval=2
KillWait=5
# Preemption: a job of the high partition requeues the low partition's jobs it needs room
# from; with preempt_send_user_signal they get their --signal first, TERM after GraceTime.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=low Nodes=$host Default=YES PriorityTier=1 GraceTime=10 MaxTime=INFINITE State=UP
PartitionName=high Nodes=$host PriorityTier=2 MaxTime=INFINITE State=UP
EOF
}

show_logs() {
  local log
  for log in "$DIR"/log/*.log; do
    [ -f "$log" ] || continue
    echo "--- $log" >&2
    tail -n 15 "$log" >&2
  done
}

start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs the jobs; apt-get installs)"
  mkdir -p "$DIR"
  install_if_missing
  start_munge
  write_conf
  export SLURM_CONF="$DIR/slurm.conf"
  # -c: no job state from an earlier cluster.
  slurmctld -c -f "$SLURM_CONF" || { show_logs; die "slurmctld did not start"; }
  slurmd -f "$SLURM_CONF" || { show_logs; die "slurmd did not start"; }
  local state="" i
  for i in $(seq 120); do
    # Exactly "idle": a trailing "*" means the node does not respond yet.
    state="$(sinfo -h -N -o %t 2>/dev/null | head -n 1 || true)"
    [ "$state" = "idle" ] && break
    sleep 0.25
  done
  if [ "$state" != "idle" ]; then
    show_logs
    stop
    die "the node did not become idle within 30 s (state: ${state:-none})"
  fi
  echo "cluster.sh: Slurm is up; export SLURM_CONF=$SLURM_CONF" >&2
}

stop() {
  export SLURM_CONF="$DIR/slurm.conf"
  local pids=() name pid i alive
  if [ -f "$SLURM_CONF" ] && [ -f "$DIR/slurmctld.pid" ]; then
    # Jobs left running would outlive slurmd (their slurmstepd is not its child).
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for i in $(seq 40); do
      [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  # The daemons delete their pid files before they have finished exiting: read them first,
  # then wait on the processes.
  for name in slurmd slurmctld munged; do
    if [ -f "$DIR/$name.pid" ]; then
      pid="$(cat "$DIR/$name.pid")"
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        pids+=("$pid")
        kill -TERM "$pid" 2>/dev/null || true
      fi
    fi
  done
  for i in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$DIR/munged.pid"
}

[ $# -eq 2 ] || usage
DIR="$2"
case "$DIR" in
  /*) ;;
  *) DIR="$PWD/$DIR" ;;
esac
case "$1" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
