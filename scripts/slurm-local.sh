#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the Slurm executor's tests, CI and the demo.
#
#   scripts/slurm-local.sh start    # munge, slurmctld, 16 slurmd (gpu01..gpu16, 8 GPUs each), slurmrestd
#   scripts/slurm-local.sh stop     # stops what start started and removes the state directory
#   scripts/slurm-local.sh status   # exit 0 when slurmctld answers and slurmrestd's socket is up
#   scripts/slurm-local.sh env      # prints SLURM_CONF=..., TOPOWEB_SLURMRESTD=... and
#                                   # TOPOWEB_SLURM_JWT_KEY=... lines to eval
#
# Another shape beside it (bench/slurm_vs_topo.py compares on both): its own directory and ports,
#   TOPOWEB_SLURM_DIR=/tmp/topoweb-slurm-b TOPOWEB_SLURM_CTLD_PORT=16917 TOPOWEB_SLURM_NODE_PORT=17101 \
#   TOPOWEB_SLURM_NODES=12 TOPOWEB_SLURM_GPUS=4 TOPOWEB_SLURM_LEAF_NODES=3 scripts/slurm-local.sh start
# (TOPOWEB_SLURM_NODES nodes of TOPOWEB_SLURM_GPUS GPUs, leaves of TOPOWEB_SLURM_LEAF_NODES nodes;
# defaults 16, 8 and 4).
#
# Needs root and Debian's slurm-wlm, slurmrestd, slurm-wlm-jwt-plugin and munge (Slurm 22.05).
# Every node is a `slurmd -N` on localhost with its own port; the GPUs are character devices made
# with mknod (Slurm refuses regular files in gres.conf), each its own device number (195:N, the
# NVIDIA major) so the devices cgroup tells them apart; topology/tree sees 4 leaf switches of 4
# nodes under one spine. Start is idempotent: it only starts what is not running.
#
# Authentication: munge for the daemons and the commands, and auth/jwt beside it
# (AuthAltTypes=auth/jwt with a generated HS256 key, $BASE/etc/jwt_hs256.key, owned by slurm,
# mode 0600). TOPOWEB_SLURM_REST_AUTH picks how slurmrestd authenticates its clients:
#   jwt (default)  rest_auth/jwt: every request names its user and token (X-SLURM-USER-NAME,
#                  X-SLURM-USER-TOKEN), so TopoWeb submits each job as its owner. slurmrestd must
#                  not run as root or SlurmUser: it starts as root and drops to nobody (-u/-g),
#                  with SLURM_JWT=daemon so it loads auth/jwt without a token of its own.
#   local          rest_auth/local, for single-user set-ups: slurmrestd runs as the `slurm` user
#                  and every client of its socket acts as that user.
# TOPOWEB_SLURM_CGROUP: 1 runs task/cgroup (cgroup/v1) with ConstrainDevices=yes, as production
# clusters run GPUs (a step opens only its granted GPU device files, which CUDA_VISIBLE_DEVICES
# renumbers from 0); 0 runs task/none. Default: 1 when the cgroup v1 devices controller is
# mounted writable at /sys/fs/cgroup/devices, else 0.
set -euo pipefail

BASE=${TOPOWEB_SLURM_DIR:-/tmp/topoweb-slurm}
NODES=${TOPOWEB_SLURM_NODES:-16}
GPUS=${TOPOWEB_SLURM_GPUS:-8}
LEAF_NODES=${TOPOWEB_SLURM_LEAF_NODES:-4}
CTLD_PORT=${TOPOWEB_SLURM_CTLD_PORT:-16817}
FIRST_NODE_PORT=${TOPOWEB_SLURM_NODE_PORT:-17001}
SOCKET="$BASE/rest/slurmrestd.sock"
CONF="$BASE/etc/slurm.conf"
MUNGE_SOCKET="$BASE/munge/munge.socket"
JWT_KEY="$BASE/etc/jwt_hs256.key"
REST_AUTH=${TOPOWEB_SLURM_REST_AUTH:-jwt}
if [ -z "${TOPOWEB_SLURM_CGROUP:-}" ]; then
  TOPOWEB_SLURM_CGROUP=0
  test -w /sys/fs/cgroup/devices/devices.allow && TOPOWEB_SLURM_CGROUP=1
fi
CGROUP=$TOPOWEB_SLURM_CGROUP

node_name() { printf 'gpu%02d' "$1"; }

pid_alive() { test -f "$1" && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
  mkdir -p "$BASE/etc" "$BASE/state" "$BASE/log" "$BASE/run" "$BASE/dev" "$BASE/munge"
  for i in $(seq 0 $((GPUS - 1))); do
    if [ "$(stat -c '%F %t:%T' "$BASE/dev/nvidia$i" 2>/dev/null)" != "character special file c3:$(printf '%x' "$i")" ]; then
      rm -f "$BASE/dev/nvidia$i"
      mknod -m 666 "$BASE/dev/nvidia$i" c 195 "$i"
    fi
  done
  test -s "$JWT_KEY" || dd if=/dev/urandom bs=32 count=1 of="$JWT_KEY" status=none
  chown slurm:slurm "$JWT_KEY"
  chmod 0600 "$JWT_KEY"
  local task=task/none
  if [ "$CGROUP" = 1 ]; then
    task=task/cgroup
    cat >"$BASE/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainDevices=yes
ConstrainCores=no
ConstrainRAMSpace=no
EOF
  else
    rm -f "$BASE/etc/cgroup.conf"
  fi
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
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
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
TaskPlugin=$task
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
  # Leaves of LEAF_NODES nodes under one spine.
  : >"$BASE/etc/topology.conf"
  local leaves=$(((NODES + LEAF_NODES - 1) / LEAF_NODES))
  for l in $(seq 1 "$leaves"); do
    local lo=$(((l - 1) * LEAF_NODES + 1)) hi=$((l * LEAF_NODES))
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
  mkdir -p "$BASE/rest"
  if [ "$REST_AUTH" = local ]; then
    # rest_auth/local refuses to run as root: slurmrestd runs as the slurm user and a client on
    # the unix socket acts as that user.
    chown slurm:slurm "$BASE/rest"
    runuser -u slurm -- env SLURM_CONF="$CONF" setsid /usr/sbin/slurmrestd -s openapi/v0.0.38 \
      -a rest_auth/local "unix:$SOCKET" >>"$BASE/log/slurmrestd.log" 2>&1 </dev/null &
  else
    # rest_auth/jwt: started as root, slurmrestd drops to nobody before it serves a request (it
    # refuses to serve as root or SlurmUser); the socket's folder is nobody's so it can bind there.
    chown nobody:nogroup "$BASE/rest"
    env SLURM_CONF="$CONF" SLURM_JWT=daemon setsid /usr/sbin/slurmrestd -s openapi/v0.0.38 \
      -a rest_auth/jwt -u "$(id -u nobody)" -g "$(id -g nobody)" "unix:$SOCKET" \
      >>"$BASE/log/slurmrestd.log" 2>&1 </dev/null &
  fi
  echo $! >"$BASE/run/slurmrestd.pid"
  for _ in $(seq 50); do test -S "$SOCKET" && break; sleep 0.1; done
  test -S "$SOCKET" || { echo "slurmrestd did not start; see $BASE/log/slurmrestd.log" >&2; exit 1; }
  chmod 777 "$SOCKET"
}

do_start() {
  test "$(id -u)" = 0 || { echo "slurm-local.sh start needs root" >&2; exit 1; }
  test -e /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so || ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || {
    echo "missing auth/jwt: apt-get install slurm-wlm-jwt-plugin" >&2
    exit 1
  }
  for b in slurmctld slurmd slurmrestd munged scontrol; do
    command -v "$b" >/dev/null || test -x "/usr/sbin/$b" || {
      echo "missing $b: apt-get install slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge" >&2
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
  echo "... $(sinfo -h -N | wc -l) nodes; slurmrestd unix:$SOCKET ($(tr '\0' ' ' </proc/"$(cat "$BASE/run/slurmrestd.pid")"/cmdline | grep -o 'rest_auth/[a-z]*' 2>/dev/null || echo '?')); $(grep '^TaskPlugin' "$CONF")"
}

do_env() {
  echo "export SLURM_CONF=$CONF"
  echo "export TOPOWEB_SLURMRESTD=unix:$SOCKET"
  echo "export TOPOWEB_SLURM_JWT_KEY=$JWT_KEY"
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
