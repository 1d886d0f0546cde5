#!/usr/bin/env bash
# A real one-node SLURM cluster for the tests (Debian's slurmctld + slurmd + munge, no systemd).
#
#   tests/slurm/setup_slurm.sh install install the Debian packages (apt) if they are missing
#   tests/slurm/setup_slurm.sh start   install (if missing), configure, start; wait until idle
#   tests/slurm/setup_slurm.sh stop    stop the daemons this script started (by their pid files)
#   tests/slurm/setup_slurm.sh status  exit 0 when the node answers `sinfo` as idle/mixed/allocated
#
# Needs root. Everything it writes lives under $QWEN3EXP_SLURM_DIR (default /var/lib/qwen3exp-slurm)
# plus /etc/slurm/slurm.conf and /etc/munge/munge.key (the places the Debian binaries read).
# The partition is called `qwen3exp` and is the default one.
set -euo pipefail

STATE=${QWEN3EXP_SLURM_DIR:-/var/lib/qwen3exp-slurm}
CONF=/etc/slurm/slurm.conf
PARTITION=qwen3exp

log() { echo "setup_slurm: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then log "needs root"; exit 3; fi
}

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sbatch >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || { log "slurm is not installed and apt-get is not available"; exit 4; }
  log "installing slurmctld slurmd slurm-client munge (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

alive() {  # alive PIDFILE
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

munge_answers() {  # a munged answers on the default socket
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

configure() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  # A bit under the free memory: slurmd refuses a node that claims more than it has.
  mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) * 9 / 10 ))
  mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /etc/munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  cat > "$CONF" <<EOF
# Written by qwen3exp tests/slurm/setup_slurm.sh: a one-node cluster for the tests.
ClusterName=qwen3exp
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
MpiDefault=none
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  need_root
  install
  configure
  # munge: reuse a munged that answers on the default socket (another cluster's, the system's):
  # it is not ours, so nothing is recorded and `stop` leaves it alone. Otherwise start one in the
  # foreground so that $! is its pid (never a pid looked up by name), and record that.
  if ! alive "$STATE/munged.pid" && ! munge_answers; then
    rm -f "$STATE/munged.pid"
    munged --foreground --force >>"$STATE/log/munged.log" 2>&1 &
    echo $! > "$STATE/munged.pid"
    for _ in $(seq 1 50); do munge_answers && break; sleep 0.1; done
    munge_answers || { log "munged did not start; see $STATE/log/munged.log"; exit 5; }
  fi
  alive "$STATE/slurmctld.pid" || slurmctld
  sleep 1
  alive "$STATE/slurmd.pid" || slurmd
  for _ in $(seq 1 60); do
    if status; then log "up: partition $PARTITION on $(hostname -s)"; return 0; fi
    sleep 0.5
  done
  log "the node did not become idle; see $STATE/log/"
  sinfo >&2 || true
  exit 5
}

status() {
  sinfo -h -p "$PARTITION" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'
}

stop_one() {  # stop_one PIDFILE NAME
  local pidfile=$1 name=$2 pid
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  log "stopped $name ($pid)"
}

stop() {
  # Cancel what is left so no job step outlives the cluster.
  scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  stop_one "$STATE/slurmd.pid" slurmd
  stop_one "$STATE/slurmctld.pid" slurmctld
  stop_one "$STATE/munged.pid" munged  # only one this script started (its pid file; none when reused)
}

case "${1:-start}" in
  install) need_root; install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
