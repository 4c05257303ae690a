"""The API docs: every write operation has an example body, every request example is accepted by
the code that reads that body, and status enums say what each status means."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command

from apps.api.examples import EXAMPLES
from apps.executors.agents.api.serializers import AgentSyncSerializer
from apps.metrics.api.serializers import JobReportSerializer
from apps.placement.jobs import load_job
from apps.placement.topology import load_topology
from apps.scheduling.api.node_serializers import DrainSerializer
from apps.scheduling.api.serializers import JobFailSerializer
from apps.topology.api.serializers import ClusterSerializer

pytestmark = pytest.mark.django_db
WRITES = ("post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def schema(django_db_blocker, tmp_path_factory):
    target = tmp_path_factory.mktemp("schema") / "schema.yaml"
    with django_db_blocker.unblock():
        call_command("spectacular", "--file", str(target), "--validate", stderr=io.StringIO())
    return yaml.safe_load(target.read_text())


def write_operations(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in WRITES:
                yield path, method, op


def test_every_write_operation_shows_an_example(schema):
    missing = []
    for path, method, op in write_operations(schema):
        body = op.get("requestBody", {}).get("content", {})
        if body:
            missing += [f"{method} {path} ({media})" for media, c in body.items() if not c.get("examples")]
            continue
        success = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        if all(not r.get("content") for r in success.values()):
            continue  # 204 No Content: neither side has a body to show
        if not any(b.get("examples") for r in success.values() for b in r.get("content", {}).values()):
            missing.append(f"{method} {path} (response)")
    assert not missing, f"write operations without an example: {missing}"
    # And no example is left over for an operation that no longer exists.
    ids = {op["operationId"] for _, _, op in write_operations(schema)}
    assert set(EXAMPLES) <= ids, set(EXAMPLES) - ids


def request_examples(op_id):
    for media, named in EXAMPLES[op_id].get("request", {}).items():
        for key, (_, value) in named.items():
            # YAML examples are the JSON ones as text.
            yield media, key, yaml.safe_load(value) if isinstance(value, str) else value


@pytest.mark.parametrize("op_id", ["v1_jobs_create", "v1_placements_preview_create"])
def test_job_spec_examples_load(op_id):
    for media, key, value in request_examples(op_id):
        assert load_job(value).gpus > 0, (media, key)


@pytest.mark.parametrize("op_id", ["v1_clusters_create", "v1_clusters_import_create"])
def test_topology_examples_load(op_id):
    seen = 0
    for media, key, value in request_examples(op_id):
        if media != "multipart/form-data":
            assert load_topology(value).n_gpus > 0, (media, key)
            seen += 1
    assert seen >= 2


@pytest.mark.parametrize(
    "op_id, serializer",
    [
        ("v1_jobs_fail_create", JobFailSerializer),
        ("v1_jobs_report_create", JobReportSerializer),
        ("v1_node_health_drain_create", DrainSerializer),
        ("v1_agents_sync_create", AgentSyncSerializer),
        ("v1_clusters_update", ClusterSerializer),
        ("v1_clusters_partial_update", ClusterSerializer),
    ],
)
def test_body_examples_pass_their_serializers(op_id, serializer):
    for media, key, value in request_examples(op_id):
        checked = serializer(data=value, partial=op_id.endswith("partial_update"))
        if serializer is ClusterSerializer:
            checked.fields["name"].required = False  # a settings change names no cluster
        assert checked.is_valid(), (media, key, checked.errors)


def test_docs_page_links_back_to_the_site(client):
    html = client.get("/api/docs/").content.decode()
    assert '<a href="/" id="back-to-site">' in html and 'id="swagger-ui"' in html


def test_status_enums_say_what_each_status_means(schema):
    from apps.scheduling.choices import JOB_STATUS_HELP, PROPOSAL_STATUS_HELP

    described = schema["components"]["schemas"]["JobStatusEnum"]["description"]
    for status, text in JOB_STATUS_HELP.items():
        assert f"* `{status}`: {text}" in described
    assert (
        PROPOSAL_STATUS_HELP["stale"] in schema["components"]["schemas"]["ProposalStatusEnum"]["description"]
    )
