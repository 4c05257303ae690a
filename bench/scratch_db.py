"""The scratch Postgres database of the benchmarks that need one (agents_scale, cycle_scale,
metrics_scale, api_throughput, history_scale): `--postgres` (the server) and `--db-name`, created
before the run and dropped after it, even when the run fails; and the environment the benchmarks that serve
the API under granian run it with (`served_env`: the settings module `SERVED_SETTINGS`).

    parser = argparse.ArgumentParser()
    scratch_db.add_arguments(parser, "cycle")
    with scratch_db.scratch_database(parser.parse_args()) as url:  # postgres://.../<db-name>
        ...
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432"
BENCH_SECRET_KEY = "bench-only-secret-key-not-for-production-use-0123456789"

SERVED_SETTINGS = """\
from topoweb.settings import *  # noqa: F401,F403
from topoweb.settings import REST_FRAMEWORK, STORAGES

# The benchmark measures the service, not the per-user throttles.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {
        **REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
        "user": "10000000/min",
        "submit": "10000000/min",
        "agent_sync": "10000000/min",
    },
}
# The API needs no collected static files (the app refuses to start on a missing manifest).
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
"""

# Names the parent's environment may hold that a benchmark's processes must not inherit.
NOT_INHERITED = ("TOPOWEB_TESTING", "CELERY_BROKER_URL", "CACHE_URL")


def served_env(url: str, settings_dir: str, **extra: str) -> dict[str, str]:
    """The environment of manage.py and the web server serving the API on the database `url`: the
    settings module SERVED_SETTINGS (written into `settings_dir`), quiet logs, no test mode, and
    no broker or cache but those `extra` names (extra: variable names to values)."""
    Path(settings_dir, "bench_settings.py").write_text(SERVED_SETTINGS)
    env = {name: value for name, value in os.environ.items() if name not in NOT_INHERITED}
    env.update(
        DATABASE_URL=url,
        SECRET_KEY=BENCH_SECRET_KEY,
        DJANGO_SETTINGS_MODULE="bench_settings",
        PYTHONPATH=os.pathsep.join([settings_dir, str(REPO)]),
        TOPOWEB_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


# Databases a benchmark must never create, let alone drop.
RESERVED = frozenset({"postgres", "template0", "template1", "test"})


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--postgres (BENCH_POSTGRES or the local server) and --db-name (topoweb_bench_<name>_<pid>)."""
    parser.add_argument(
        "--postgres",
        default=os.environ.get("BENCH_POSTGRES", DEFAULT_SERVER),
        help="Postgres server URL, without a database name",
    )
    parser.add_argument(
        "--db-name",
        default=f"topoweb_bench_{name}_{os.getpid()}",
        help="scratch database (created, then dropped)",
    )


@contextmanager
def scratch_database(args: argparse.Namespace) -> Iterator[str]:
    """Create the scratch database `args.db_name` on `args.postgres` (dropping a leftover one of
    that name first), yield its URL, and drop it at the end, closing whatever still uses it."""
    import psycopg

    name = args.db_name
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name) or name in RESERVED:
        raise SystemExit(
            f"--db-name: {name!r} is not a scratch database name (a-z, 0-9, _; not {sorted(RESERVED)})"
        )
    server = args.postgres.rstrip("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{server}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def in_process_django(args: argparse.Namespace) -> Iterator[str]:
    """`scratch_database`, with this process's environment set for Django on it (no Celery broker,
    no Redis cache, quiet logs); Django's connections are closed before the database is dropped."""
    with scratch_database(args) as url:
        os.environ.update(
            DATABASE_URL=url,
            SECRET_KEY=BENCH_SECRET_KEY,
            DJANGO_SETTINGS_MODULE="topoweb.settings",
            TOPOWEB_LOG_LEVEL="WARNING",
        )
        for name in NOT_INHERITED:
            os.environ.pop(name, None)
        try:
            yield url
        finally:
            if "django" in sys.modules:
                from django.db import connections

                connections.close_all()
