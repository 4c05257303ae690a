"""Integration tests: everything under this folder carries the `integration` marker and runs on the
real Postgres (`make test` runs them with DATABASE_URL and CELERY_BROKER_URL set)."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def django_db_setup(require_postgres, django_db_setup):
    """The test database of integration tests is Postgres: checked before it is created."""
    yield
