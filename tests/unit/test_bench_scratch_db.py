"""The benchmarks' scratch database helper refuses names it must never create or drop."""

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import scratch_db  # noqa: E402


@pytest.mark.parametrize("name", ["test", "postgres", "template1", "Bench", "x; DROP", "a" * 64, ""])
def test_names_that_are_not_scratch_databases_are_refused_before_connecting(name):
    args = argparse.Namespace(postgres="postgres://nobody@127.0.0.1:1", db_name=name)
    with pytest.raises(SystemExit, match="--db-name"), scratch_db.scratch_database(args):
        pass


def test_the_default_name_is_per_benchmark_and_process():
    parser = argparse.ArgumentParser()
    scratch_db.add_arguments(parser, "cycle")
    args = parser.parse_args([])
    assert args.db_name.startswith("topoweb_bench_cycle_") and args.postgres.startswith("postgres://")


def test_the_served_environment_names_the_settings_it_writes_and_inherits_no_test_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOWEB_TESTING", "1")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/9")
    env = scratch_db.served_env("postgres://h/db", str(tmp_path), CACHE_URL="redis://127.0.0.1:6379/8")
    assert (tmp_path / "bench_settings.py").read_text() == scratch_db.SERVED_SETTINGS
    assert env["DJANGO_SETTINGS_MODULE"] == "bench_settings" and env["DATABASE_URL"] == "postgres://h/db"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(scratch_db.REPO)]
    assert env["CACHE_URL"] == "redis://127.0.0.1:6379/8"
    assert "TOPOWEB_TESTING" not in env and "CELERY_BROKER_URL" not in env
