"""Schemathesis against the served OpenAPI schema, in-process through the WSGI app, as a normal
user (the coordinator of their account) and as an admin: no 5xx, and every response's status, content type and body conform to the
schema. Derandomized with a fixed number of examples per operation, so a CI run is repeatable
and takes a known time (about 1,900 generated cases, each sent as both callers)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from django.test import Client
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from rest_framework.throttling import SimpleRateThrottle
from schemathesis.config import SchemathesisConfig

from apps.scheduling import services
from apps.scheduling.models import Account, AccountMembership, Qos

from .conftest import small_spec

# Per operation and per caller: with the API's operations, about 2,000 cases in all.
EXAMPLES_PER_OPERATION = 32
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


RAW_SCHEMA: dict = {}
# Cases run per (caller, operation), to hold the run to its promised size.
CASES: Counter = Counter()
MIN_CASES = 2000
# Only the fuzzing phase, whose case count max_examples sets (the coverage phase adds hundreds of
# boundary cases per operation).
CONFIG = SchemathesisConfig.from_dict(
    {"phases": {"coverage": {"enabled": False}, "examples": {"enabled": False}}}
)


@pytest.fixture
def api_schema(db, case44, make_user, committed, monkeypatch):
    # The fuzzer's thousands of requests are not what throttling is tested by.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {})
    cache.clear()
    owner = make_user("fuzz-user")
    make_user("fuzz-admin", staff=True)
    # The user coordinates their own account: its jobs' hold, release, requeue and priority and its
    # memberships' QOS are fuzzed past the permission check too.
    team = Account.objects.create(name="fuzz-team")
    team.qos.add(Qos.objects.get(cluster=case44, name="normal"))
    AccountMembership.objects.create(user=owner, account=team, is_default=True, is_coordinator=True)
    # Some ids the generated paths may hit: a placed job, a queued one, a launcher token.
    committed(services.job_submit, user=owner, spec=small_spec("placed", 8))
    committed(services.job_submit, user=owner, spec=small_spec("waiting", 16))
    services.launcher_token_create(cluster=case44)
    if not RAW_SCHEMA:
        # Generating the schema takes seconds: once per run, not once per operation.
        RAW_SCHEMA.update(Client().get("/api/schema/", {"format": "json"}).json())
    loaded = schemathesis.openapi.from_dict(copy.deepcopy(RAW_SCHEMA), config=CONFIG)
    loaded.app = get_wsgi_application()
    return loaded


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module", autouse=True)
def enough_cases():
    """After the module: when every operation ran for both callers, at least MIN_CASES cases ran."""
    CASES.clear()
    yield
    operations = len({op for _, op in CASES})
    print(f"\nschemathesis: {sum(CASES.values())} cases over {operations} operations")
    if RAW_SCHEMA and len(CASES) == 2 * _operation_count(RAW_SCHEMA) and operations:
        assert sum(CASES.values()) >= MIN_CASES, (
            f"only {sum(CASES.values())} cases over {operations} operations"
        )


def _operation_count(raw: dict) -> int:
    methods = {"get", "put", "post", "patch", "delete"}
    return sum(1 for item in raw["paths"].values() for method in item if method in methods)


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _call(case, username: str) -> None:
    CASES[(username, case.operation.label)] += 1
    key = Token.objects.get_or_create(user=get_user_model().objects.get(username=username))[0].key
    case.call_and_validate(headers={"Authorization": f"Token {key}"}, checks=CHECKS)


@schema.parametrize()
@FUZZ_SETTINGS
def test_as_a_user_and_as_an_admin_no_request_gets_a_5xx_or_a_response_outside_the_schema(case):
    # Each generated request goes to both callers: generating it is most of the run's time.
    for username in ("fuzz-user", "fuzz-admin"):
        _call(case, username)
