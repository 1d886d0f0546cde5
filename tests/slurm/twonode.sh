#!/usr/bin/env bash
# A real two-node SLURM cluster on this one machine, for the tests: two network namespaces with
# their own address and hostname (a veth pair each, on a bridge in the root namespace), one
# slurmctld in the root namespace, one slurmd per namespace, and a munged of its own.
# Recipe and measurements: ../shared/notes/slurm.md ("Two nodes on one machine").
#
#   tests/slurm/twonode.sh start DIR   create everything, wait until both nodes are idle, print
#                                      KEY=VALUE lines (SLURM_CONF, PARTITION, NODES, ...)
#   tests/slurm/twonode.sh stop DIR    cancel its jobs, stop and remove everything `start` created
#
# Needs root. Nothing outside DIR is touched except what `start` records in DIR/created, one line
# per thing, written right after it exists: `stop` undoes exactly those lines, in reverse, also
# after a `start` that failed half-way. In particular:
# - the munged is its own (own key and pid file under DIR, own socket in /run/qwen3exp-twonode-<id>;
#   SLURM reaches it through AuthInfo=socket=...), so a munged already running for another cluster is never touched;
# - daemons are stopped by the pid files they (or this script, for munged's $!) wrote, never by name;
# - /etc/hosts gets two lines marked `# qwen3exp-twonode <id>`, removed by that mark;
# - the one-node cluster's /etc/slurm/slurm.conf and ports are not used (own slurm.conf and ports:
#   point every SLURM command at DIR/slurm.conf with SLURM_CONF).
set -euo pipefail

log() { echo "twonode: $*" >&2; }

[ "$#" -eq 2 ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 3; }
CMD=$1
DIR=$(realpath -m "$2")
CREATED=$DIR/created
CONF=$DIR/slurm.conf
PARTITION=twonode

record() { echo "$*" >> "$CREATED"; }

alive() {  # alive PIDFILE
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

free_port() {  # a free TCP port of the root namespace
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

wait_until() {  # wait_until SECONDS CMD...: 0 once CMD succeeds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

start() {
  if [ -e "$CREATED" ]; then log "$DIR already holds a cluster (run stop first)"; exit 4; fi
  for tool in slurmctld slurmd munged ip nsenter unshare python3; do
    command -v "$tool" >/dev/null || { log "$tool is not installed"; exit 4; }
  done
  mkdir -p "$DIR"/{ctld,spool,log,munge}
  : > "$CREATED"
  local id subnet host
  id=$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')
  # munged wants every folder above its socket searchable by all (a test's tmp dir is not).
  local sockdir=/run/qwen3exp-twonode-$id
  mkdir -m 755 "$sockdir"
  record dir "$sockdir"
  subnet="10.213.$(( 16#${id:0:2} % 200 + 20 ))"
  host=$(hostname -s)
  echo "$id" > "$DIR/id"

  # munge: a daemon of our own, started in the foreground so that $! is its pid.
  dd if=/dev/urandom of="$DIR/munge/key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/key"
  local sock=$sockdir/munge.socket
  munged --foreground --socket="$sock" --key-file="$DIR/munge/key" --pid-file="$DIR/munge/munged.pid" \
    --seed-file="$DIR/munge/seed" --log-file="$DIR/log/munged.log" >>"$DIR/log/munged.log" 2>&1 &
  echo $! > "$DIR/munged.pid"
  record pid "$DIR/munged.pid"
  wait_until 10 sh -c "munge -n -S '$sock' | unmunge -S '$sock'" || { log "munged did not answer"; exit 5; }

  # network: a bridge with the controller's address, one namespace + veth per node.
  local br="q3x${id}br"
  ip link add "$br" type bridge
  record link "$br"
  ip addr add "$subnet.1/24" dev "$br"
  ip link set "$br" up
  local nodes=() i ns node
  for i in 0 1; do
    ns="q3x${id}n$i"; node="q3x${id}n$i"
    ip netns add "$ns"
    record netns "$ns"
    ip link add "q3x${id}v$i" type veth peer name eth0 netns "$ns"
    record link "q3x${id}v$i"
    ip link set "q3x${id}v$i" master "$br" up
    ip -n "$ns" addr add "$subnet.1$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    nodes+=("$node")
  done
  record hosts "$id"
  {
    echo "$subnet.10 ${nodes[0]} # qwen3exp-twonode $id"
    echo "$subnet.11 ${nodes[1]} # qwen3exp-twonode $id"
  } >> /etc/hosts

  local ctld_port
  ctld_port=$(free_port)
  cat > "$CONF" <<EOF
# Written by qwen3exp tests/slurm/twonode.sh: two nodes in network namespaces ($id).
ClusterName=q3x$id
SlurmctldHost=$host($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
# The main scheduling loop every 5 s, not 60: a requeued job starts soon after its StartTime.
SchedulerParameters=sched_interval=5
MpiDefault=none
KillWait=5
InactiveLimit=0
MinJobAge=30
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=${nodes[0]} NodeAddr=$subnet.10 CPUs=2 RealMemory=8000 State=UNKNOWN
NodeName=${nodes[1]} NodeAddr=$subnet.11 CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=$PARTITION Nodes=${nodes[0]},${nodes[1]} Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$CONF
  record pid "$DIR/slurmctld.pid"
  slurmctld -f "$CONF"
  wait_until 20 scontrol ping || { log "slurmctld did not answer; see $DIR/log/"; exit 5; }
  for i in 0 1; do
    node=${nodes[$i]}
    mkdir -p "$DIR/spool/$node"
    record pid "$DIR/slurmd-$node.pid"
    # nsenter --net, not `ip netns exec` (that remounts /sys and slurmd then cannot find cgroups).
    nsenter --net="/var/run/netns/q3x${id}n$i" unshare --uts sh -c "hostname $node && exec slurmd -f '$CONF' -N $node"
  done
  if ! wait_until 60 sh -c "[ \"\$(sinfo -h -p $PARTITION -o '%t' | grep -cE '^idle')\" = 1 ] \
                             && [ \"\$(sinfo -h -N -p $PARTITION -o '%t' | grep -c idle)\" = 2 ]"; then
    log "the nodes did not become idle; see $DIR/log/"
    sinfo -N >&2 || true
    exit 5
  fi
  log "up: partition $PARTITION on ${nodes[*]} ($subnet.10, $subnet.11), controller $host:$ctld_port"
  echo "SLURM_CONF=$CONF"
  echo "PARTITION=$PARTITION"
  echo "NODES=${nodes[0]},${nodes[1]}"
  echo "ADDRS=$subnet.10,$subnet.11"
  echo "NETNS=q3x${id}n0,q3x${id}n1"
}

stop_pid() {  # stop_pid PIDFILE: TERM, then KILL after 5 s
  local pidfile=$1 pid
  alive "$pidfile" || return 0
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  log "stopped $(basename "$pidfile" .pid) ($pid)"
}

kill_netns() {  # every process left inside a namespace this script created (job steps, ranks)
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null || true
  sleep 1
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

stop() {
  [ -f "$CREATED" ] || { log "nothing recorded in $DIR"; return 0; }
  export SLURM_CONF=$CONF
  # Cancel what is left so that no job step outlives the cluster (slurmstepd outlives slurmd).
  if alive "$DIR/slurmctld.pid"; then
    scancel --full --quiet --user=root 2>/dev/null || true
    wait_until 15 sh -c '[ -z "$(squeue -h -o %i)" ]' || true
  fi
  # Namespaces first: their processes (slurmd, slurmstepd, job steps) go before the controller.
  local kind arg
  while read -r kind arg; do
    [ "$kind" = netns ] && kill_netns "$arg"
  done < "$CREATED"
  tac "$CREATED" | while read -r kind arg; do
    case $kind in
      pid) stop_pid "$arg"; rm -f "$arg" ;;
      netns) kill_netns "$arg"; ip netns del "$arg" 2>/dev/null || true ;;
      dir) rm -rf "$arg" ;;
      link) ip link del "$arg" 2>/dev/null || true ;;
      hosts)
        # Rewrite in place (/etc/hosts may be a bind mount that cannot be replaced by a rename).
        grep -v "# qwen3exp-twonode $arg\$" /etc/hosts > "$DIR/hosts.new" || true
        cat "$DIR/hosts.new" > /etc/hosts
        rm -f "$DIR/hosts.new" ;;
    esac
  done
  rm -f "$CREATED"
  log "stopped and removed ($DIR)"
}

case "$CMD" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
