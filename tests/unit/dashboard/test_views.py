"""Dashboard pages through Django's test client: permissions, visibility, import, migrations."""

import json
import re

import pytest
from django.urls import reverse

from apps.scheduling.models import MigrationProposal
from apps.topology.models import Cluster

from .conftest import EXAMPLES, job_spec, run_job


def payload(response) -> dict:
    """The cluster figure and client data embedded in a page."""
    m = re.search(
        rb'<script id="cluster-data" type="application/json">(.*?)</script>', response.content, re.S
    )
    assert m, "the page embeds no cluster data"
    return json.loads(m.group(1))


def gpu_count(data: dict) -> int:
    return sum(
        len(t["customdata"]) for t in data["figure"]["data"] if t["meta"]["role"] in ("gpu-free", "gpu-job")
    )


@pytest.mark.parametrize("name", ["dashboard:home", "dashboard:queue", "dashboard:import"])
def test_pages_send_anonymous_users_to_the_login_page(client, db, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_login_page_renders_the_form(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content and b"csrfmiddlewaretoken" in response.content


def test_home_opens_the_cluster_with_placed_jobs(client, people, naive_case44):
    client.force_login(people["alice"])
    response = client.get("/")
    assert response.status_code == 200
    data = payload(response)
    assert data["client"]["cluster"] == "case-4-4"
    assert gpu_count(data) == 16
    assert [j["label"] for j in data["client"]["jobs"]] == [f"job {naive_case44.pk} · bert-large-16 (alice)"]


def test_home_without_clusters_points_staff_to_the_import(client, people):
    client.force_login(people["ops"])
    response = client.get("/")
    assert response.status_code == 200
    assert reverse("dashboard:import").encode() in response.content


def test_unknown_cluster_is_404(client, people, case44_db):
    client.force_login(people["alice"])
    assert client.get("/clusters/nope/").status_code == 404


def test_other_users_jobs_are_anonymous_on_the_graph(client, people, naive_case44):
    client.force_login(people["bob"])
    (job,) = payload(client.get("/clusters/case-4-4/"))["client"]["jobs"]
    assert job["label"] == f"job {naive_case44.pk} (other user)"
    assert job["details"] is False and job["url"] is None and job["groups"] == {}


def test_the_picker_lists_every_cluster(client, people, case44_db):
    from apps.placement.topology import read_spec_file
    from apps.topology.services import cluster_import

    cluster_import(data=read_spec_file(str(EXAMPLES / "pod-256.yaml")))
    client.force_login(people["alice"])
    body = client.get("/clusters/pod-256/").content.decode()
    assert '<option value="case-4-4">' in body and '<option value="pod-256" selected>' in body
    assert client.get("/clusters/?name=case-4-4")["Location"] == "/clusters/case-4-4/"


def test_graph_is_rebuilt_when_allocations_change(client, people, naive_case44):
    from apps.scheduling import services

    client.force_login(people["ops"])
    before = payload(client.get("/clusters/case-4-4/"))
    assert len(before["client"]["jobs"]) == 1
    services.job_cancel(job=naive_case44)
    after = payload(client.get("/clusters/case-4-4/"))
    assert after["client"]["jobs"] == []
    assert set(after["client"]["gpu_job"]) == {-1}


def test_queue_hides_other_users_details(client, people, naive_case44):
    client.force_login(people["bob"])
    body = client.get("/queue/").content.decode()
    assert f"job {naive_case44.pk} (other user)" in body
    assert "bert-large-16" not in body and "alice" not in body


def test_queue_owner_filter_reveals_nothing_about_other_users(client, people, naive_case44):
    client.force_login(people["bob"])
    body = client.get("/queue/?owner=alice").content.decode()
    assert "No jobs match" in body
    client.force_login(people["ops"])
    body = client.get("/queue/?owner=alice").content.decode()
    assert "bert-large-16" in body


def test_queue_status_filter_and_fragment(client, people, case44_db, naive_case44):
    waiting = run_job(case44_db, people["alice"], job_spec(16, name="waits"))
    assert waiting.status == "queued"
    client.force_login(people["alice"])
    body = client.get("/queue/?status=queued&fragment=1").content.decode()
    assert "waits" in body and "bert-large-16" not in body
    assert "<html" not in body  # the fragment is the table alone
    assert waiting.pending_reason and waiting.pending_reason.split(";")[0] in body
    # Not placed yet: the step time shown is the lower bound.
    from apps.dashboard.templatetags.dashboard import ms
    from apps.placement.bounds import lower_bound
    from apps.placement.jobs import load_job
    from apps.topology.services import cluster_topology

    bound = lower_bound(cluster_topology(cluster=case44_db), load_job(waiting.spec))
    assert f"≥ {ms(bound.step_ms)}" in body


def test_job_page_is_404_for_other_users_and_open_to_staff(client, people, naive_case44):
    url = reverse("dashboard:job", args=[naive_case44.pk])
    client.force_login(people["bob"])
    assert client.get(url).status_code == 404
    client.force_login(people["ops"])
    assert client.get(url).status_code == 200


def test_job_page_shows_groups_rank_grid_whatif_and_rank_maps(client, people, naive_case44):
    client.force_login(people["alice"])
    body = client.get(reverse("dashboard:job", args=[naive_case44.pk])).content.decode()
    assert 'id="rank-grid"' in body and "node-a" in body and "node-b" in body
    assert "109 ms" in body  # each DP group crosses the 11 GB/s NIC
    assert body.count('data-policy="') == 5
    assert "no measurements" in body
    assert "Lower bound" in body and "step 103 ms" in body
    for fmt in ("openmpi", "slurm-hostfile", "torchrun"):
        assert f"/api/v1/jobs/{naive_case44.pk}/rankmap/?format={fmt}" in body
    # Only staff get the apply button.
    assert "Apply</button>" not in body


def test_staff_applies_a_migration_with_a_post(client, people, naive_case44):
    proposal = MigrationProposal.objects.get(job=naive_case44, status="proposed")
    url = reverse("dashboard:proposal-apply", args=[naive_case44.pk, proposal.pk])
    client.force_login(people["alice"])
    assert client.post(url).status_code == 403
    client.force_login(people["ops"])
    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    assert response.status_code == 200
    assert "applied" in response.content.decode()
    proposal.refresh_from_db()
    assert proposal.status == "applied" and proposal.decided_by == people["ops"]
    naive_case44.refresh_from_db()
    assert naive_case44.predicted_step_ms == pytest.approx(102.67, rel=1e-3)


def test_applying_a_decided_proposal_reports_why(client, people, naive_case44):
    proposal = MigrationProposal.objects.get(job=naive_case44, status="proposed")
    client.force_login(people["ops"])
    client.post(reverse("dashboard:proposal-reject", args=[naive_case44.pk, proposal.pk]))
    response = client.post(
        reverse("dashboard:proposal-apply", args=[naive_case44.pk, proposal.pk]), follow=True
    )
    assert "it is rejected, not proposed" in response.content.decode()


def test_import_page_is_staff_only(client, people):
    client.force_login(people["alice"])
    assert client.get(reverse("dashboard:import")).status_code == 403


def test_import_lists_errors_per_field(client, people):
    client.force_login(people["ops"])
    text = (EXAMPLES / "case-4-4.yaml").read_text().replace("bw_GBps: 11", "bw_GBps: -11", 1)
    response = client.post(reverse("dashboard:import"), {"text": text, "action": "preview"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "<code>nodes[0].nics[0].bw_GBps</code>" in body
    assert "must be positive, got -11" in body
    assert not Cluster.objects.exists()


def test_import_rejects_yaml_syntax_errors(client, people):
    client.force_login(people["ops"])
    response = client.post(reverse("dashboard:import"), {"text": "name: [unclosed", "action": "preview"})
    assert response.status_code == 400
    assert "not valid YAML or JSON" in response.content.decode()


def test_import_previews_then_imports_an_uploaded_file(client, people):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(people["ops"])
    upload = SimpleUploadedFile("pod.yaml", (EXAMPLES / "pod-256.yaml").read_bytes())
    preview = client.post(reverse("dashboard:import"), {"file": upload, "action": "preview"})
    assert preview.status_code == 200
    assert gpu_count(payload(preview)) == 256
    assert not Cluster.objects.exists()  # a preview writes nothing
    text = (EXAMPLES / "pod-256.yaml").read_text()
    done = client.post(reverse("dashboard:import"), {"text": text, "action": "import"})
    assert done.status_code == 302 and done["Location"] == "/clusters/pod-256/"
    assert Cluster.objects.filter(name="pod-256").exists()


def test_import_of_an_existing_name_needs_replace(client, people, case44_db):
    client.force_login(people["ops"])
    text = (EXAMPLES / "case-4-4.yaml").read_text()
    response = client.post(reverse("dashboard:import"), {"text": text, "action": "import"})
    assert response.status_code == 400 and "already exists" in response.content.decode()
    response = client.post(reverse("dashboard:import"), {"text": text, "action": "import", "replace": "on"})
    assert response.status_code == 302


@pytest.mark.parametrize("bundle", ["full", "basic"])
def test_plotly_is_served_from_the_installed_package(client, bundle):
    import gzip

    import plotly

    from apps.dashboard.views.vendor import BUNDLES, plotly_js_url

    url = plotly_js_url(bundle)
    assert url.endswith(f"{plotly.__version__}.min.js")
    response = client.get(url, HTTP_ACCEPT_ENCODING="gzip")
    assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
    assert "immutable" in response["Cache-Control"]
    assert gzip.decompress(response.content) == BUNDLES[bundle].read_bytes()
    assert client.get(url, HTTP_IF_NONE_MATCH=response["ETag"]).status_code == 304
    assert client.get(url.replace(plotly.__version__, "0.0.1")).status_code == 404


def test_the_basic_plotly_bundle_is_the_installed_plotly_js_version():
    """The vendored basic bundle must be upgraded with plotly: the graph pages and the simulation
    pages would otherwise draw with two plotly.js versions."""
    from apps.dashboard.views.vendor import bundle_version

    assert bundle_version("full") and bundle_version("basic") == bundle_version("full")


def test_the_graph_pages_load_the_basic_bundle_and_draw_only_its_trace_types(client, people, naive_case44):
    from apps.dashboard.views.vendor import plotly_js_url

    client.force_login(people["alice"])
    page = client.get("/clusters/case-4-4/").content.decode()
    assert plotly_js_url("basic") in page and plotly_js_url("full") not in page
    payload = json.loads(
        re.search(r'<script id="cluster-data" type="application/json">(.*?)</script>', page, re.S)[1]
    )
    assert {t.get("type", "scatter") for t in payload["figure"]["data"]} <= {"scatter", "bar", "pie"}
    job = client.get(reverse("dashboard:job", args=[naive_case44.pk])).content.decode()
    assert plotly_js_url("basic") in job


def test_graph_version_changes_when_a_job_ends(client, people, naive_case44):
    from apps.scheduling import services

    client.force_login(people["alice"])
    url = reverse("dashboard:cluster-version", args=["case-4-4"])
    first = client.get(url).json()["version"]
    assert client.get(url).json()["version"] == first
    page = client.get("/clusters/case-4-4/").content.decode()
    assert f'data-version="{first}"' in page
    services.job_complete(job=naive_case44)
    assert client.get(url).json()["version"] != first


def test_waiting_job_page_says_why_no_policy_fits_and_draws_no_empty_chart(
    client, people, case44_db, naive_case44
):
    waiting = run_job(case44_db, people["alice"], job_spec(16, name="waits"))
    client.force_login(people["alice"])
    body = client.get(reverse("dashboard:job", args=[waiting.pk])).content.decode()
    assert body.count("does not fit:") == 5
    assert "Why pending:" in body
    charts = json.loads(
        re.search(r'<script id="job-charts" type="application/json">(.*?)</script>', body, re.S)[1]
    )
    assert charts == {}


def test_queue_page_hides_who_cancelled_other_users_jobs(client, people, case44_db):
    from apps.scheduling import services

    job = services.job_submit(user=people["alice"], spec=job_spec(4, name="secret"), cluster=case44_db)
    services.job_cancel(job=job, user=people["ops"])
    url = "/queue/?status=cancelled"
    client.force_login(people["bob"])
    page = client.get(url).content.decode()
    assert f"job {job.pk} (other user)" in page and "cancelled by" not in page and "ops" not in page
    client.force_login(people["alice"])
    assert "cancelled by ops" in client.get(url).content.decode()


def test_import_converts_another_tools_file_and_lists_the_defaults_it_used(client, people):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(people["ops"])
    conf = b"SwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Nodes=gpu[03-04]\nSwitchName=top Switches=s[0-1]\n"
    upload = SimpleUploadedFile("topology.conf", conf)
    fields = {"format": "slurm-tree", "defaults": "name: lab\ngpus_per_node: 4\n"}
    preview = client.post(reverse("dashboard:import"), {**fields, "file": upload, "action": "preview"})
    assert preview.status_code == 200
    body = preview.content.decode()
    assert gpu_count(payload(preview)) == 16
    assert "gpus_per_node=4," in body and "(default)" in body
    done = client.post(reverse("dashboard:import"), {**fields, "text": conf.decode(), "action": "import"})
    assert done.status_code == 302 and done["Location"] == "/clusters/lab/"
    bad = client.post(
        reverse("dashboard:import"), {**fields, "text": "SwitchName=s0 Nodes=a[1-\n", "action": "preview"}
    )
    assert bad.status_code == 400 and "<code>pasted:1</code>" in bad.content.decode()


def test_cluster_page_of_the_pcie_lab_draws_its_intra_node_pairs(client, people):
    from apps.placement.topology import read_spec_file
    from apps.topology.services import cluster_import

    cluster_import(data=read_spec_file(str(EXAMPLES / "pcie-lab.yaml")))
    client.force_login(people["alice"])
    response = client.get(reverse("dashboard:cluster", args=["pcie-lab"]))
    assert response.status_code == 200
    names = {t["name"] for t in payload(response)["figure"]["data"]}
    assert {"NVLink pairs", "PCIe switch pairs", "intra-node links"} <= names


def test_cluster_page_lists_the_first_placed_jobs_and_points_to_the_queue_for_the_rest(
    client, people, case44_db, monkeypatch
):
    from apps.dashboard.views import cluster as cluster_views

    monkeypatch.setattr(cluster_views, "JOB_TABLE_ROWS", 2)
    jobs = [run_job(case44_db, people["alice"], job_spec(2, name=f"small-{i}")) for i in range(3)]
    assert all(j.status == "running" for j in jobs)
    client.force_login(people["alice"])
    response = client.get("/clusters/case-4-4/")
    body = response.content.decode()
    table = body[body.index('id="placed-title"') : body.index("<h2>Hotspots</h2>")]
    assert [f"/jobs/{j.pk}/" in table for j in jobs] == [True, True, False]
    assert "The first 2 of 3 placed jobs" in table
    more = re.search(r'id="jobs-more">.*?<a href="([^"]+)"', table).group(1).replace("&amp;", "&")
    queue = client.get(more)
    assert queue.status_code == 200 and f"/jobs/{jobs[2].pk}/".encode() in queue.content
    # The graph, its legend and the highlight picker still carry every job.
    assert len(payload(response)["client"]["jobs"]) == 3
    assert body.count('<option value="2">') == 1
