"""The simulation tests use the scheduling tests' fixtures: eager Celery (autouse) and pod-256."""

from tests.unit.scheduling.conftest import eager_celery, pod256  # noqa: F401
