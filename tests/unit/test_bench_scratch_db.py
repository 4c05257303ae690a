"""The benchmarks' scratch database helper refuses names it must never create or drop."""

import argparse
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
