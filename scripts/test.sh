#!/usr/bin/env bash
# `make test`: every check, in named stages, on a fresh machine as in CI.
#
#   bash scripts/test.sh [STAGE...]   # stages: lint core unit browser integration (default: all)
#
# Before the stages, as root with a working apt-get, it installs the system packages the tests use
# (Chromium, Redis, Prometheus, Slurm, munge) and starts Postgres, Redis and the local Slurm when
# they are down. Where it cannot (not root, no network, a package missing), it runs everything
# else: a stage without what it needs is skipped, a test without its service skips itself, and the
# last line names what was skipped and why. Under CI=true nothing may be skipped: a missing
# package or service fails the run.
#
# Stages: core (apps/placement and apps/agent tests, without Django), unit (the other unit tests,
# SQLite and eager Celery), browser (tests/e2e, the system Chromium), integration (Postgres,
# Redis, a real Slurm and Prometheus). Each prints its slowest tests (--durations) into the log.
#
# The stages run in three lanes at once (2 cores: the integration tests mostly wait): lint then
# unit here, core then browser in the background, and the integration stage in the background as
# two pytest processes (TEST_DATABASE_URL and TEST_BROKER_URL, then TEST_DATABASE_URL_2 and
# TEST_BROKER_URL_2: by default the same names with "_2" and the next Redis db). The background
# lanes' logs follow when they end. TEST_INTEGRATION_SHARDS=1 runs the integration tests in one
# process, TEST_OVERLAP=0 every stage one after another.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DB_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
BROKER_URL=${TEST_BROKER_URL:-redis://127.0.0.1:6379/0}
DURATIONS=${TEST_DURATIONS:-25}
DB_URL_2=${TEST_DATABASE_URL_2:-${DB_URL}_2}
# The next Redis db number (db 0 when the URL names none).
broker_db=${BROKER_URL##*/}
[[ $broker_db =~ ^[0-9]+$ ]] || broker_db=0
BROKER_URL_2=${TEST_BROKER_URL_2:-${BROKER_URL%/*}/$((broker_db + 1))}
[[ $BROKER_URL =~ ^redis://[^/]+$ ]] && BROKER_URL_2=${TEST_BROKER_URL_2:-$BROKER_URL/1}
SHARDS=${TEST_INTEGRATION_SHARDS:-2}
OVERLAP=${TEST_OVERLAP:-1}
# The first integration process's files (the longest waits: Slurm's, the agents', Prometheus');
# the second runs every other file of tests/integration.
SHARD_1=(tests/integration/test_slurm.py tests/integration/test_agents.py
  tests/integration/test_metrics_prometheus.py tests/integration/test_ops_metrics_prometheus.py)
CHROMIUM=/usr/lib/chromium/chromium
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(lint core unit browser integration)

ci() { case "${CI:-}" in 1 | true | TRUE | yes) return 0 ;; *) return 1 ;; esac }

SKIPS_FILE=$(mktemp)
trap 'rm -f "$SKIPS_FILE"' EXIT
export TOPOWEB_SKIPS_FILE=$SKIPS_FILE # tests/conftest.py appends each skipped test's reason
declare -a SKIPPED=() FAILED=()
# A stage or package skipped; under CI=true that is a failure (CI must run everything).
skip() {
  SKIPPED+=("$1")
  echo "== skipped: $1"
  if ci; then FAILED+=("$1 (CI=true)"); fi
}

# -- system packages and services ---------------------------------------------------------------
APT_UPDATED=0
WHY="" # why the last apt_install could not install
apt_install() { # apt_install PACKAGE...: installs, or sets WHY and fails
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    WHY="installing $* needs root and apt-get"
    return 1
  fi
  if [ $APT_UPDATED = 0 ]; then
    if ! apt-get update -qq >/dev/null 2>&1; then
      WHY="apt-get update failed (no network?)"
      return 1
    fi
    APT_UPDATED=1
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
    WHY="apt-get install $* failed"
    return 1
  fi
}

have_chromium() { test -x "$CHROMIUM"; }
have_slurm() {
  command -v slurmctld >/dev/null && command -v slurmrestd >/dev/null && command -v munged >/dev/null &&
    ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1
}
pg_up() { pg_isready -d "$DB_URL" -q 2>/dev/null; }
redis_up() { "$PY" -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=3).ping()" \
  "$BROKER_URL" >/dev/null 2>&1; }
wants() { local s; for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

BROWSER_WHY=""
if wants browser && ! have_chromium; then
  apt_install chromium chromium-driver || BROWSER_WHY=$WHY
fi
if wants integration; then
  # The fault tests start a private redis-server and look up worker processes with ps; the metrics
  # tests start a real Prometheus (promtool, same package, checks deploy/prometheus/ rules).
  if ! command -v redis-server >/dev/null || ! command -v ps >/dev/null || ! command -v prometheus >/dev/null; then
    apt_install redis-server procps prometheus || skip "Redis and Prometheus packages: $WHY"
  fi
  # The Slurm executor's tests run against a real Slurm on this host (16 slurmd).
  if ! have_slurm; then
    apt_install slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge || skip "Slurm packages: $WHY"
  fi
  if [ "$(id -u)" = 0 ] && have_slurm; then
    bash scripts/slurm-local.sh start >/dev/null || skip "Slurm tests: scripts/slurm-local.sh start failed"
  fi
  if ! pg_up && [ "$(id -u)" = 0 ] && command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | tail -1)" main start >/dev/null 2>&1
    for _ in $(seq 30); do pg_up && break; sleep 1; done
  fi
  if ! redis_up && command -v redis-server >/dev/null && [ "$BROKER_URL" != "${BROKER_URL#redis://127.0.0.1:6379}" ]; then
    mkdir -p /tmp/topoweb-redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /tmp/topoweb-redis --logfile /tmp/topoweb-redis/test.log >/dev/null 2>&1
    for _ in $(seq 30); do redis_up && break; sleep 1; done
  fi
fi
if ci && [ ${#SKIPPED[@]} -gt 0 ]; then
  echo "CI=true: nothing may be skipped (${SKIPPED[*]})" >&2
  exit 1
fi

# -- stages ---------------------------------------------------------------------------------------
stage() { # stage NAME COMMAND...: runs it, timed, and records a failure
  local name=$1 t0=$SECONDS
  shift
  echo "== stage $name"
  if "$@"; then
    echo "== stage $name: passed in $((SECONDS - t0)) s"
  else
    echo "== stage $name: FAILED after $((SECONDS - t0)) s"
    FAILED+=("$name")
  fi
}
UNIT_ENV=(env -u DATABASE_URL -u CELERY_BROKER_URL TOPOWEB_TESTING=1)
PYTEST=("$PY" -m pytest -q --durations="$DURATIONS")

lint() { .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports &&
  "$PY" manage.py check && "$PY" manage.py makemigrations --check --dry-run; }

# integration: two pytest processes at once (one with SHARDS=1), the second's log after the first's.
integration() {
  local run1=(env DATABASE_URL="$DB_URL" CELERY_BROKER_URL="$BROKER_URL" TOPOWEB_TESTING=1 "${PYTEST[@]}")
  if [ "$SHARDS" = 1 ]; then
    "${run1[@]}" -m integration tests/integration
    return
  fi
  local log2 pid2 rc1 rc2 f ignore=()
  log2=$(mktemp)
  for f in "${SHARD_1[@]}"; do ignore+=(--ignore="$f"); done
  env DATABASE_URL="$DB_URL_2" CELERY_BROKER_URL="$BROKER_URL_2" TOPOWEB_TESTING=1 "${PYTEST[@]}" \
    -m integration tests/integration "${ignore[@]}" >"$log2" 2>&1 &
  pid2=$!
  echo "== integration: ${SHARD_1[*]} (the other files at once, database ${DB_URL_2##*/}, $BROKER_URL_2)"
  "${run1[@]}" -m integration "${SHARD_1[@]}"
  rc1=$?
  wait "$pid2"
  rc2=$?
  echo "== integration: the other files of tests/integration"
  cat "$log2"
  rm -f "$log2"
  [ "$rc1" = 0 ] && [ "$rc2" = 0 ]
}
# Whether the integration stage can run (Postgres and Redis answer); skips it otherwise.
integration_ready() {
  if ! pg_up; then
    skip "integration stage: no Postgres at ${DB_URL%/*}"
  elif ! redis_up; then
    skip "integration stage: no Redis at $BROKER_URL"
  else
    return 0
  fi
  return 1
}

for name in "${STAGES[@]}"; do
  case $name in
  lint | core | unit | browser | integration) ;;
  *)
    echo "unknown stage $name (stages: lint core unit browser integration)" >&2
    exit 2
    ;;
  esac
done

# One stage by name (the stage function records its time and a failure).
run_stage() {
  case $1 in
  lint) stage lint lint ;;
  # Without pytest-django: proves the placement core and the node agent run without Django.
  core) stage core "${UNIT_ENV[@]}" "${PYTEST[@]}" -p no:django -W ignore::pytest.PytestConfigWarning \
    tests/unit/placement tests/unit/agent ;;
  unit) stage unit "${UNIT_ENV[@]}" "${PYTEST[@]}" -m "not integration" tests/unit \
    --ignore=tests/unit/placement --ignore=tests/unit/agent ;;
  browser) stage browser "${UNIT_ENV[@]}" "${PYTEST[@]}" -m "not integration" tests/e2e ;;
  integration) stage integration integration ;;
  esac
}
# The stages asked for that can run: browser needs Chromium, integration Postgres and Redis.
declare -a RUN=()
for s in "${STAGES[@]}"; do
  if [ "$s" = browser ] && ! have_chromium; then
    skip "browser stage: no Chromium at $CHROMIUM${BROWSER_WHY:+ ($BROWSER_WHY)}"
  elif [ "$s" != integration ] || integration_ready; then
    RUN+=("$s")
  fi
done
runs() { local s; for s in ${RUN[@]+"${RUN[@]}"}; do [ "$s" = "$1" ] && return 0; done; return 1; }

# Lanes: with OVERLAP, the integration stage (it mostly waits) and core then browser run in the
# background while lint then unit run here; each background lane's output is printed, and its
# failures counted, once the lanes here are done. TEST_OVERLAP=0 runs the stages one after another.
declare -a LANE_PIDS=() LANE_LOGS=() HERE=()
LANE_FAILED=$(mktemp)
trap 'rm -f "$SKIPS_FILE" "$LANE_FAILED" ${LANE_LOGS[@]+"${LANE_LOGS[@]}"}' EXIT
lane() { # lane STAGE...: runs the wanted ones of them one after another in the background
  local wanted=() s
  for s in "$@"; do runs "$s" && wanted+=("$s"); done
  [ ${#wanted[@]} -eq 0 ] && return
  local log
  log=$(mktemp)
  LANE_LOGS+=("$log")
  (
    FAILED=() # this lane's own failures: those recorded before it are counted already
    for s in "${wanted[@]}"; do run_stage "$s"; done
    [ ${#FAILED[@]} -eq 0 ] || printf '%s\n' "${FAILED[@]}" >>"$LANE_FAILED"
  ) >"$log" 2>&1 &
  LANE_PIDS+=($!)
  echo "== stages ${wanted[*]}: started in the background (their output follows the other stages)"
}
if [ "$OVERLAP" != 0 ] && [ ${#RUN[@]} -gt 1 ]; then
  lane integration
  lane core browser
  for s in lint unit; do runs "$s" && HERE+=("$s"); done
else
  HERE=(${RUN[@]+"${RUN[@]}"})
fi
for name in ${HERE[@]+"${HERE[@]}"}; do run_stage "$name"; done
for i in "${!LANE_PIDS[@]}"; do
  wait "${LANE_PIDS[$i]}"
  cat "${LANE_LOGS[$i]}"
done
while read -r name; do FAILED+=("$name"); done <"$LANE_FAILED"

# -- one line: what was skipped and why ---------------------------------------------------------------
tests_skipped=$(sed '/^$/d' "$SKIPS_FILE" | sort | uniq -c | sort -rn |
  awk '{n = $1; sub(/^ *[0-9]+ /, ""); printf "%s%d test%s: %s", (NR > 1 ? "; " : ""), n, (n == 1 ? "" : "s"), $0}')
[ -n "$tests_skipped" ] && SKIPPED+=("$tests_skipped")
summary="stages ${STAGES[*]}"
[ ${#FAILED[@]} -gt 0 ] && summary="$summary; FAILED: ${FAILED[*]}"
if [ ${#SKIPPED[@]} -gt 0 ]; then
  joined=$(printf '%s; ' "${SKIPPED[@]}")
  echo "make test: $summary; skipped: ${joined%; }"
else
  echo "make test: $summary; nothing skipped"
fi
[ ${#FAILED[@]} -eq 0 ]
