#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the Slurm executor's tests, CI and the demo.
#
#   scripts/slurm-local.sh start    # munge, slurmctld, 16 slurmd (gpu01..gpu16, 8 GPUs each), slurmrestd
#   scripts/slurm-local.sh stop     # stops what start started and removes the state directory
#   scripts/slurm-local.sh status   # exit 0 when slurmctld answers and slurmrestd's socket is up
#   scripts/slurm-local.sh env      # prints SLURM_CONF=... and TOPOWEB_SLURMRESTD=... lines to eval
#
# Needs root and Debian's slurm-wlm, slurmrestd and munge (Slurm 22.05). Every node is a `slurmd -N`
# on localhost with its own port; the GPUs are character devices made with mknod (Slurm refuses
# regular files in gres.conf); topology/tree sees 4 leaf switches of 4 nodes under one spine.
# Start is idempotent: it only starts what is not running.
set -euo pipefail

BASE=${TOPOWEB_SLURM_DIR:-/tmp/topoweb-slurm}
NODES=${TOPOWEB_SLURM_NODES:-16}
GPUS=8
CTLD_PORT=${TOPOWEB_SLURM_CTLD_PORT:-16817}
FIRST_NODE_PORT=17001
SOCKET="$BASE/rest/slurmrestd.sock"
CONF="$BASE/etc/slurm.conf"
MUNGE_SOCKET="$BASE/munge/munge.socket"

node_name() { printf 'gpu%02d' "$1"; }

pid_alive() { test -f "$1" && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
  mkdir -p "$BASE/etc" "$BASE/state" "$BASE/log" "$BASE/run" "$BASE/dev" "$BASE/munge"
  for i in $(seq 0 $((GPUS - 1))); do
    test -c "$BASE/dev/nvidia$i" || { rm -f "$BASE/dev/nvidia$i"; mknod "$BASE/dev/nvidia$i" c 1 3; }
  done
  local last
  last=$(node_name "$NODES")
  local last_port=$((FIRST_NODE_PORT + NODES - 1))
  cat >"$CONF" <<EOF
ClusterName=topoweb
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CryptoType=crypto/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
GresTypes=gpu
TopologyPlugin=topology/tree
SlurmdParameters=config_overrides
ReturnToService=1
JobRequeue=0
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=600
MessageTimeout=10
NodeName=gpu[01-${last#gpu}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$FIRST_NODE_PORT-$last_port CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:$GPUS State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  cat >"$BASE/etc/gres.conf" <<EOF
NodeName=gpu[01-${last#gpu}] Name=gpu File=$BASE/dev/nvidia[0-$((GPUS - 1))]
EOF
  # Leaves of 4 nodes under one spine.
  : >"$BASE/etc/topology.conf"
  local leaves=$(((NODES + 3) / 4))
  for l in $(seq 1 "$leaves"); do
    local lo=$(((l - 1) * 4 + 1)) hi=$((l * 4))
    test "$hi" -le "$NODES" || hi=$NODES
    printf 'SwitchName=leaf%d Nodes=gpu[%02d-%02d]\n' "$l" "$lo" "$hi" >>"$BASE/etc/topology.conf"
  done
  printf 'SwitchName=spine Switches=leaf[1-%d]\n' "$leaves" >>"$BASE/etc/topology.conf"
  chmod 755 "$BASE" "$BASE/etc"
}

start_munge() {
  if pid_alive "$BASE/munge/munged.pid"; then return; fi
  if ! test -s /etc/munge/munge.key; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  chown munge:munge "$BASE/munge"
  chmod 755 "$BASE/munge"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --pid-file="$BASE/munge/munged.pid" \
    --log-file="$BASE/munge/munged.log" --seed-file="$BASE/munge/munged.seed" --force
  for _ in $(seq 50); do test -S "$MUNGE_SOCKET" && return; sleep 0.1; done
  echo "munged did not start; see $BASE/munge/munged.log" >&2
  exit 1
}

start_slurm() {
  export SLURM_CONF="$CONF"
  if ! pid_alive "$BASE/run/slurmctld.pid"; then
    /usr/sbin/slurmctld -f "$CONF"
  fi
  for i in $(seq 1 "$NODES"); do
    local n
    n=$(node_name "$i")
    mkdir -p "$BASE/spool/$n"
    pid_alive "$BASE/run/slurmd-$n.pid" || /usr/sbin/slurmd -f "$CONF" -N "$n"
  done
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
  # Nodes register within a few seconds; wait until none is still unknown or not responding.
  for _ in $(seq 150); do
    if ! sinfo -h -N -o '%N %t' 2>/dev/null | grep -qE 'unk|\*|down|^$'; then
      test -n "$(sinfo -h -N -o '%N' 2>/dev/null)" && break
    fi
    sleep 0.2
  done
}

start_rest() {
  if pid_alive "$BASE/run/slurmrestd.pid" && test -S "$SOCKET"; then return; fi
  rm -f "$SOCKET"
  # rest_auth/local refuses to run as root: slurmrestd runs as the slurm user and a client on the
  # unix socket acts as that user.
  mkdir -p "$BASE/rest"
  chown slurm:slurm "$BASE/rest"
  runuser -u slurm -- env SLURM_CONF="$CONF" setsid /usr/sbin/slurmrestd -s openapi/v0.0.38 \
    -a rest_auth/local "unix:$SOCKET" >>"$BASE/log/slurmrestd.log" 2>&1 </dev/null &
  echo $! >"$BASE/run/slurmrestd.pid"
  for _ in $(seq 50); do test -S "$SOCKET" && break; sleep 0.1; done
  test -S "$SOCKET" || { echo "slurmrestd did not start; see $BASE/log/slurmrestd.log" >&2; exit 1; }
  chmod 777 "$SOCKET"
}

do_start() {
  test "$(id -u)" = 0 || { echo "slurm-local.sh start needs root" >&2; exit 1; }
  for b in slurmctld slurmd slurmrestd munged scontrol; do
    command -v "$b" >/dev/null || test -x "/usr/sbin/$b" || {
      echo "missing $b: apt-get install slurm-wlm slurmrestd munge" >&2
      exit 1
    }
  done
  write_config
  # The daemons keep the directory they start in as theirs: not the caller's checkout, which may be
  # removed while the Slurm runs (slurmrestd then fails every job submission on getcwd).
  cd "$BASE"
  start_munge
  start_slurm
  start_rest
  do_status
}

stop_pidfile() {
  local f=$1
  if pid_alive "$f"; then
    local p
    p=$(cat "$f")
    kill "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}

do_stop() {
  test -d "$BASE" || return 0
  export SLURM_CONF="$CONF"
  if pid_alive "$BASE/run/slurmctld.pid"; then
    scancel --quiet --full $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
  fi
  stop_pidfile "$BASE/run/slurmrestd.pid"
  for f in "$BASE"/run/slurmd-*.pid; do test -e "$f" && stop_pidfile "$f"; done
  stop_pidfile "$BASE/run/slurmctld.pid"
  stop_pidfile "$BASE/munge/munged.pid"
  rm -rf "$BASE"
}

do_status() {
  export SLURM_CONF="$CONF"
  test -f "$CONF" || { echo "not started ($BASE)"; return 1; }
  scontrol ping | grep -q 'is UP' || { echo "slurmctld down"; return 1; }
  test -S "$SOCKET" || { echo "slurmrestd socket missing"; return 1; }
  sinfo -N -o '%N %t %G' | head -3
  echo "... $(sinfo -h -N | wc -l) nodes; slurmrestd unix:$SOCKET"
}

do_env() {
  echo "export SLURM_CONF=$CONF"
  echo "export TOPOWEB_SLURMRESTD=unix:$SOCKET"
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  env) do_env ;;
  *)
    echo "usage: $0 start|stop|status|env" >&2
    exit 2
    ;;
esac
