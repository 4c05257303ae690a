"""Every bad request is a 4xx whose body names the field, never a 500: one case per class of
input that used to escape validation (non-ASCII digits, model limits, YAML error bodies,
non-object bodies, huge integers, NUL bytes, out-of-range filters)."""

from __future__ import annotations

import pytest

from .conftest import small_spec

pytestmark = pytest.mark.django_db

BIG = 10**400


@pytest.fixture
def alice_raw(alice_api):
    # A 500 must come back as a response here, not as an exception raised into the test.
    alice_api.raise_request_exception = False
    return alice_api


@pytest.fixture
def admin_raw(admin_api):
    admin_api.raise_request_exception = False
    return admin_api


def _named(response, field: str) -> bool:
    body = response.json()
    return field in body or field in str(body)


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/jobs/?cluster=%C2%B2", "cluster"),
        ("/api/v1/jobs/?owner=%C2%B2", "owner"),
        ("/api/v1/migrations/?cluster=%C2%B2", "cluster"),
        ("/api/v1/nodes/?cluster=%C2%B2", "cluster"),
        ("/api/v1/gpus/?cluster=%C2%B9%C2%B2", "cluster"),
        ("/api/v1/jobs/?priority_min=1e30", "priority_min"),
        ("/api/v1/jobs/?priority_min=" + "9" * 400, "priority_min"),
        ("/api/v1/migrations/?job=99999999999999999999999", "job"),
        ("/api/v1/gpus/?index=99999999999999999999999", "index"),
        ("/api/v1/jobs/?cluster=" + "9" * 400, "cluster"),
        ("/api/v1/jobs/?name=a%00b", "name"),
        ("/api/v1/nodes/?leaf=a%00b", "leaf"),
        ("/api/v1/links/?switch=x%00", "switch"),
    ],
)
def test_bad_query_parameters_are_a_400_naming_the_parameter(case44, alice_raw, url, field):
    response = alice_raw.get(url)
    assert response.status_code == 400, response.content[:300]
    assert _named(response, field)


def test_bad_master_port_is_a_400_naming_it(case44, admin_raw, committed):
    job = committed(admin_raw.post, "/api/v1/jobs/", small_spec("p", 2), format="json").json()
    assert admin_raw.get(f"/api/v1/jobs/{job['id']}/rankmap/?master_port=29600").status_code == 200
    for port in ("%C2%B2", "0", "70000", "9" * 400, "-1", "x%00"):
        response = admin_raw.get(f"/api/v1/jobs/{job['id']}/rankmap/?master_port={port}")
        assert response.status_code == 400, (port, response.content[:200])
        assert _named(response, "master_port")


def test_nul_in_a_url_is_a_400(case44, alice_raw, alice, client):
    for url in ("/api/v1/jobs/1%00/", "/api/v1/clusters/%00/", "/api/v1/jobs/?cluster=a%00"):
        assert alice_raw.get(url).status_code == 400, url
    response = alice_raw.post("/api/v1/jobs/?cluster=%00", small_spec("n", 2), format="json")
    assert response.status_code == 400 and _named(response, "cluster")
    client.force_login(alice)
    for url in ("/queue/?owner=%00", "/clusters/x%00/", "/queue/?%00=1"):
        assert client.get(url).status_code == 400, url


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "n" * 201}, "name"),
        ({"priority": 2**63}, "priority"),
        ({"priority": BIG}, "priority"),
        ({"estimated_runtime_s": BIG}, "estimated_runtime_s"),
        ({"name": "a\x00b"}, "name"),
        ({"user": "a\x00b"}, "user"),
        ({"gpus": BIG}, "gpus"),
    ],
)
def test_bad_job_fields_are_a_400_naming_the_field(case44, alice_raw, overrides, field):
    spec = {**small_spec("bad", 2), **overrides}
    # A preview stores nothing, so only submission knows the name column's 200 characters.
    urls = (
        ["/api/v1/jobs/"]
        if overrides == {"name": "n" * 201}
        else ["/api/v1/jobs/", "/api/v1/placements/preview/"]
    )
    for url in urls:
        response = alice_raw.post(url, spec, format="json")
        assert response.status_code == 400, (url, response.content[:300])
        assert _named(response, field), response.json()


@pytest.mark.parametrize("body", ["[1]", '"x"', "null", "1", "true", "[]"])
@pytest.mark.parametrize("url", ["/api/v1/clusters/import/", "/api/v1/clusters/", "/api/v1/jobs/"])
def test_non_object_bodies_are_a_400(case44, admin_raw, url, body):
    response = admin_raw.post(url, body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]


def test_a_body_of_a_media_type_no_parser_reads_is_a_documented_415(case44, admin_raw, client):
    response = admin_raw.generic(
        "POST", "/api/v1/clusters/", b"--x\r\n", content_type="application/x-unheard-of"
    )
    assert response.status_code == 415 and "application/x-unheard-of" in response.json()["detail"]
    schema = client.get("/api/schema/", {"format": "json"}).json()
    assert "415" in schema["paths"]["/api/v1/clusters/"]["post"]["responses"]
    assert "415" not in schema["paths"]["/api/v1/clusters/"]["get"]["responses"]


def test_errors_render_as_yaml_when_yaml_is_asked_for(case44, admin_raw):
    response = admin_raw.get("/api/v1/clusters/999999/export/?format=yaml")
    assert response.status_code == 404
    assert b"detail" in response.content
    response = admin_raw.get("/api/v1/clusters/%C2%B2/export/?format=yaml")
    assert 400 <= response.status_code < 500


def test_nul_in_a_topology_body_is_a_400_naming_the_field(admin_raw, case44):
    from apps.placement.topology import read_spec_file

    from .conftest import EXAMPLES

    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    spec["name"] = "c\x00"
    response = admin_raw.post("/api/v1/clusters/import/", spec, format="json")
    assert response.status_code == 400 and _named(response, "name")
    spec["name"] = "other"
    spec["description"] = "x\x00"
    response = admin_raw.post("/api/v1/clusters/import/", spec, format="json")
    assert response.status_code == 400 and _named(response, "description")


def test_cluster_settings_reject_nul_and_bad_policies(case44, admin_raw):
    url = f"/api/v1/clusters/{case44.pk}/"
    response = admin_raw.patch(url, {"description": "a\x00"}, format="json")
    assert response.status_code == 400 and _named(response, "description")
    response = admin_raw.patch(url, {"policy": "x" * 500}, format="json")
    assert response.status_code == 400 and _named(response, "policy")
    response = admin_raw.patch(url, [1], format="json")
    assert response.status_code == 400


@pytest.mark.parametrize("digits", [25, 400, 5000])
@pytest.mark.parametrize("content_type", ["application/json", "application/yaml"])
def test_huge_integers_in_any_body_are_a_400(case44, alice_raw, digits, content_type):
    body = '{"version": 1, "name": "big", "cluster": "case-4-4", "gpus": %s}' % ("9" * digits)
    response = alice_raw.post("/api/v1/jobs/", body, content_type=content_type)
    assert response.status_code == 400, response.content[:200]
    # The message names the field (or the parse error) without echoing thousands of digits.
    assert len(response.content) < 2000


@pytest.mark.parametrize(
    ("url", "bulk"),
    [("/api/v1/jobs/", False), ("/api/v1/placements/preview/", False), ("/api/v1/jobs/", True)],
)
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"step": {"compute_ms": 5e-324}, "model": {"flops_per_step": 1e12}}, "step.compute_ms"),
        ({"model": {"flops_per_step": 5e-324}}, "model.flops_per_step"),
        ({"comm": [{"group": "dp", "collective": "allreduce", "bytes": 5e-324}]}, "comm[0].bytes"),
        ({"estimated_runtime_s": 5e-324}, "estimated_runtime_s"),
    ],
)
def test_subnormal_floats_are_a_400_naming_the_field(case44, alice_raw, url, bulk, change, field):
    spec = small_spec("tiny", 2) | change
    body = [spec] if bulk else spec
    response = alice_raw.post(url, body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert _named(response, field)
