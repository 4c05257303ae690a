# TopoWeb: `make run` serves the demo on 127.0.0.1:8000, `make test` runs every check.
PY := .venv/bin/python
PIP := .venv/bin/pip
# The integration run's services (.ci/run starts them when they are down).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_BROKER_URL ?= redis://127.0.0.1:6379/0
# `make run PORT=8001`: the web port; the demo's simulated dcgm-exporter listens 1400 above it.
PORT ?= 8000
DCGM_PORT ?= $(shell expr $(PORT) + 1400)

.PHONY: run run-slurm test test-lint test-core test-unit test-browser test-integration lint format bench venv \
	chaos chaos-fast

venv: .venv/.installed

.venv/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements.txt
	# The console scripts `topoweb` and `topoweb-agent`, pointing at this checkout.
	$(PIP) install --quiet --no-deps -e .
	touch $@

run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_demo
	$(PY) manage.py serve_embedded --addr 127.0.0.1:$(PORT) --dcgm-port $(DCGM_PORT)

# The demo beside a real Slurm on this host (root; Debian's slurm-wlm, slurmrestd, munge): cluster
# slurm-local runs its jobs through slurmrestd. `bash scripts/slurm-local.sh stop` stops the Slurm.
run-slurm: venv
	bash scripts/slurm-local.sh start
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_demo
	$(PY) manage.py slurm_connect --cluster slurm-local
	$(PY) manage.py serve_embedded --addr 127.0.0.1:8000

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

format: venv
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

# Every check in named stages (scripts/test.sh): lint, core (placement and agent without Django),
# unit (SQLite, eager Celery), browser (tests/e2e, Chromium), integration (Postgres, Redis, Slurm,
# Prometheus); as root it installs the system packages and starts the services first. The
# integration tests (they mostly wait) run as two processes, with their own databases and Redis dbs
# (TEST_DATABASE_URL_2, TEST_BROKER_URL_2: by default the names above with "_2" and the next db),
# beside the other stages. The last line names whatever it skipped and why. `make test-unit` (or -core, -browser, -integration,
# -lint): one stage.
TEST_STAGES = lint core unit browser integration
TEST_ENV = TEST_DATABASE_URL=$(TEST_DATABASE_URL) TEST_BROKER_URL=$(TEST_BROKER_URL)

test: venv
	$(TEST_ENV) bash scripts/test.sh $(TEST_STAGES)

$(addprefix test-,$(TEST_STAGES)): test-%: venv
	$(TEST_ENV) bash scripts/test.sh $*

# The fault matrix (tests/chaos: root, cgroups, useradd; Postgres and Redis as for `make test`):
# every class CHAOS_ROUNDS times, the 3-minute web outage included; then the figures' table.
# `make chaos-fast`: each class once, without the outage.
CHAOS_ROUNDS ?= 2
CHAOS_RESULTS ?= tests/chaos/.results.jsonl
CHAOS_ENV = env DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) TOPOWEB_TESTING=1 \
	TOPOWEB_CHAOS_RESULTS=$(CHAOS_RESULTS)

chaos: venv
	rm -f $(CHAOS_RESULTS)
	$(CHAOS_ENV) TOPOWEB_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(PY) -m pytest -m chaos tests/chaos -p no:randomly; \
		status=$$?; $(PY) bench/chaos_report.py $(CHAOS_RESULTS); exit $$status

chaos-fast: venv
	rm -f $(CHAOS_RESULTS)
	$(CHAOS_ENV) TOPOWEB_CHAOS_ROUNDS=1 $(PY) -m pytest -m "chaos and not chaos_slow" tests/chaos -p no:randomly; \
		status=$$?; $(PY) bench/chaos_report.py $(CHAOS_RESULTS); exit $$status

bench: venv
	$(PY) bench/placement_quality.py
	$(PY) bench/placement_speed.py
	$(PY) bench/calibrate_pollux.py
