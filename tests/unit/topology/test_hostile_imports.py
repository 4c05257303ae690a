"""Every topology importer against hostile documents: a clear error, within a time and memory
budget, and no row written (import command, REST JSON/YAML/multipart, the import page)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client
from hypothesis import HealthCheck, given, settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.api.roles import role_grant
from tests.unit.hostile_inputs import hostile_topology_documents, within_budget

TIME_BUDGET_S = 5.0
MEMORY_BUDGET_B = 64 * 1024 * 1024
HOSTILE = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture
def staff_api(db) -> APIClient:
    user = get_user_model().objects.create_user("ops", password="pw", is_staff=True)
    role_grant(user=user, role="admin")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def staff_page(db) -> Client:
    client = Client()
    user = get_user_model().objects.create_user("page-ops", password="pw", is_staff=True)
    role_grant(user=user, role="admin")
    client.force_login(user)
    return client


def budget(fn):
    return within_budget(fn, seconds=TIME_BUDGET_S, peak_bytes=MEMORY_BUDGET_B)


def assert_refused(response) -> None:
    assert response.status_code in (400, 413), (response.status_code, response.content[:300])
    assert len(response.content) < 20_000


@HOSTILE
@given(hostile_topology_documents())
def test_import_command_refuses_hostile_files(tmp_path_factory, row_counts, document):
    path = tmp_path_factory.mktemp("specs") / "hostile.yaml"
    path.write_bytes(document)
    before = row_counts()
    with pytest.raises(CommandError) as err:
        budget(lambda: call_command("import_topology", str(path)))
    assert "nothing was imported" in str(err.value)
    assert len(str(err.value)) < 20_000
    assert row_counts() == before


@HOSTILE
@given(hostile_topology_documents())
def test_rest_import_refuses_hostile_bodies(staff_api, row_counts, document):
    before = row_counts()
    for content_type in ("application/json", "application/yaml", "text/yaml"):
        response = budget(
            lambda ct=content_type: staff_api.generic("POST", "/api/v1/clusters/import/", document, ct)
        )
        assert_refused(response)
    upload = SimpleUploadedFile("hostile.yaml", document)
    response = budget(
        lambda: staff_api.post("/api/v1/clusters/import/", {"file": upload}, format="multipart")
    )
    assert_refused(response)
    assert row_counts() == before


@HOSTILE
@given(hostile_topology_documents())
def test_import_page_refuses_hostile_uploads(staff_page, row_counts, document):
    before = row_counts()
    upload = SimpleUploadedFile("hostile.yaml", document)
    response = budget(lambda: staff_page.post("/import/", {"file": upload, "action": "import"}))
    # The page shows the text back for editing (escaped), and one line per problem.
    assert response.status_code == 400
    assert len(response.content) < 6 * len(document) + 30_000
    assert row_counts() == before


def test_rest_bodies_over_the_endpoint_limit_are_413_naming_it(staff_api, row_counts):
    from topoweb.bodylimits import body_limit

    limit = body_limit("/api/v1/clusters/import/")
    before = row_counts()
    response = staff_api.generic(
        "POST", "/api/v1/clusters/import/", b"{}", "application/json", CONTENT_LENGTH=str(limit + 1)
    )
    assert response.status_code == 413
    assert response.json()["limit_bytes"] == limit and str(limit) in response.json()["detail"]
    assert row_counts() == before


def test_a_chunked_body_without_a_length_is_411_not_read_as_empty(staff_api, row_counts):
    """Django reads Content-Length bytes only: a chunked spec would arrive as no body at all."""
    before = row_counts()
    for path in ("/api/v1/clusters/import/", "/api/v1/jobs/"):
        response = staff_api.generic("POST", path, b"", "application/json", HTTP_TRANSFER_ENCODING="chunked")
        assert response.status_code == 411
        assert "Content-Length" in response.json()["detail"]
    assert row_counts() == before


@pytest.mark.parametrize("name", ["a;reboot", "$(id)", "a b", "-rf", "x" * 101, "n\u00f6de"])
def test_rows_refuse_the_names_the_importer_refuses(import_example, name):
    """The admin editor validates rows with the same name pattern as spec v1."""
    from django.core.exceptions import ValidationError

    cluster = import_example("case-4-4")
    node = cluster.nodes.first()
    node.name = name
    with pytest.raises(ValidationError) as err:
        node.full_clean()
    assert "name" in err.value.message_dict
    model = cluster.gpu_models.first()
    model.name = "NVIDIA H100 80GB HBM3"
    model.full_clean()
