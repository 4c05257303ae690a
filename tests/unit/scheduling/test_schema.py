"""The OpenAPI schema of the whole API generates and validates with no warnings or errors."""

import io

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_openapi_schema_has_no_warnings_and_covers_the_scheduling_api(tmp_path):
    target = tmp_path / "schema.yaml"
    err = io.StringIO()
    # --fail-on-warn turns any warning (unresolvable serializer, enum collision, ...) into an error.
    call_command("spectacular", "--file", str(target), "--validate", "--fail-on-warn", stderr=err)
    schema = yaml.safe_load(target.read_text())
    paths = schema["paths"]
    for path in (
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/jobs/{id}/start/",
        "/api/v1/jobs/{id}/complete/",
        "/api/v1/jobs/{id}/fail/",
        "/api/v1/jobs/{id}/placement/",
        "/api/v1/jobs/{id}/rankmap/",
        "/api/v1/placements/preview/",
        "/api/v1/migrations/{id}/apply/",
        "/api/v1/clusters/import/",
        "/api/v1/clusters/{id}/export/",
        "/api/v1/gpus/",
    ):
        assert path in paths, path
    formats = next(
        p for p in paths["/api/v1/jobs/{id}/rankmap/"]["get"]["parameters"] if p["name"] == "format"
    )
    assert sorted(formats["schema"]["enum"]) == ["json", "openmpi", "slurm", "slurm-hostfile", "torchrun"]
    assert "application/yaml" in paths["/api/v1/jobs/"]["post"]["requestBody"]["content"]
    assert "launcherAuth" in schema["components"]["securitySchemes"]
