"""Simulation runs on the embedded default: start from the page, progress, results, the command."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from apps.simulations.choices import RunStatus
from apps.simulations.models import SimulationRun
from apps.simulations.services import available_traces, simulation_execute, simulation_start

TRACE = "tiresias_60_job.csv"

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    return client


def _form(**changes) -> dict:
    data = {
        "cluster": "pod-256",
        "trace": TRACE,
        "policies": ["topo", "naive"],
        "job_limit": 20,
        "seed": 1,
        "load": "",
    }
    data.update(changes)
    return data


def test_the_bundled_sample_traces_are_offered():
    assert {TRACE, "philly_multigpu_first80.csv", "pollux_workload-6_first40.csv"} <= set(available_traces())


def test_staff_start_a_run_from_the_page_and_see_its_metrics_and_charts(
    pod256, staff_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post("/simulations/", _form())
    assert response.status_code == 302
    run = SimulationRun.objects.get()
    assert response["Location"] == f"/simulations/{run.pk}/"
    assert run.status == RunStatus.DONE and run.progress == 1.0
    assert run.jobs_done == run.jobs_total == 40
    assert set(run.result["policies"]) == {"topo", "naive"}
    page = staff_client.get(f"/simulations/{run.pk}/").content.decode()
    assert "Metrics per policy" in page and 'id="simulation-figures"' in page and "chart-jct_cdf" in page
    listing = staff_client.get("/simulations/").content.decode()
    assert f'href="/simulations/{run.pk}/"' in listing and "Past runs compared" in listing
    progress = staff_client.get(f"/simulations/{run.pk}/progress/").json()
    assert progress == {"status": "done", "progress": 1.0, "jobs_done": 40, "jobs_total": 40, "error": ""}


def test_a_queued_run_shows_a_progress_bar(pod256, staff_client):
    run = simulation_start(cluster=pod256, trace=TRACE, policies=["topo"], job_limit=10, defer=True)
    page = staff_client.get(f"/simulations/{run.pk}/").content.decode()
    assert 'id="progress-bar"' in page and f"/simulations/{run.pk}/progress/" in page
    assert staff_client.get(f"/simulations/{run.pk}/progress/").json()["status"] == "queued"


def test_bad_inputs_are_400s_naming_the_field_and_record_nothing(pod256, staff_client):
    for changes, field in (
        ({"trace": "../../etc/passwd"}, "trace"),
        ({"job_limit": 0}, "job_limit"),
        ({"job_limit": 10**9}, "job_limit"),
        ({"policies": ["best"]}, "policies"),
        ({"load": "nan"}, "load"),
        ({"load": "-1"}, "load"),
        ({"cluster": "nope"}, "cluster"),
    ):
        response = staff_client.post("/simulations/", _form(**changes))
        assert response.status_code == 400, changes
        assert f"<code>{field}</code>" in response.content.decode(), changes
    assert not SimulationRun.objects.exists()


def test_only_staff_start_runs(pod256, client):
    client.force_login(get_user_model().objects.create_user("alice"))
    assert client.post("/simulations/", _form()).status_code == 403
    assert client.get("/simulations/").status_code == 200
    assert not SimulationRun.objects.exists()


def test_a_run_whose_cluster_is_gone_fails_with_the_reason(pod256):
    run = simulation_start(cluster=pod256, trace=TRACE, policies=["topo"], job_limit=10, defer=True)
    pod256.delete()
    done = simulation_execute(run_id=run.pk)
    assert done.status == RunStatus.FAILED and "no longer exists" in done.error
    assert simulation_execute(run_id=run.pk) is None


def test_two_runs_with_the_same_seed_store_the_same_result(pod256):
    a = simulation_start(
        cluster=pod256, trace=TRACE, policies=["topo", "first_fit"], job_limit=30, seed=4, defer=True
    )
    b = simulation_start(
        cluster=pod256, trace=TRACE, policies=["topo", "first_fit"], job_limit=30, seed=4, defer=True
    )
    assert simulation_execute(run_id=a.pk).result == simulation_execute(run_id=b.pk).result


def test_the_simulate_command_records_a_run_and_prints_the_comparison(pod256):
    out = StringIO()
    call_command(
        "simulate",
        "--cluster",
        "pod-256",
        "--trace",
        TRACE,
        "--policies",
        "topo,naive",
        "--limit",
        "15",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    run = SimulationRun.objects.get()
    assert result["run"] == run.pk and set(result["policies"]) == {"topo", "naive"}
    assert result["trace"]["jobs"] == 15 and "series" not in result
    with pytest.raises(CommandError, match="--cluster"):
        call_command("simulate", "--cluster", "nope", "--trace", TRACE)
    with pytest.raises(CommandError, match="--limit"):
        call_command("simulate", "--cluster", "pod-256", "--trace", TRACE, "--limit", "0")
    with pytest.raises(CommandError, match="--trace"):
        call_command("simulate", "--cluster", "pod-256", "--trace", "nope.csv")


def test_the_demo_simulation_is_run_once_and_finished(pod256):
    from apps.simulations.demo import load_demo_simulation

    run = load_demo_simulation()
    assert run.status == RunStatus.DONE
    assert set(run.result["policies"]) == {"topo", "tree_best_fit", "first_fit", "naive"}
    assert load_demo_simulation().pk == run.pk
    assert SimulationRun.objects.count() == 1


def test_the_header_says_the_load_reached_beside_the_load_asked(pod256, staff_client):
    """The demo asks 0.9; the trace's arrivals reach less on pod-256: the header says both, never
    the asked load alone as if it had been offered."""
    from apps.simulations.demo import load_demo_simulation

    run = load_demo_simulation()
    reached = run.result["trace"]["scaled_load"]
    assert reached is not None and reached < run.load
    page = staff_client.get(f"/simulations/{run.pk}/").content.decode()
    header = page[
        page.index('id="simulation-load"') : page.index("</span>", page.index('id="simulation-load"'))
    ]
    assert f"{reached:.2f} reached of {run.load:g} asked" in header
