"""The simulations page in Chromium: a run's progress bar moves to done, then its charts draw; a
staff user starts a run from the form."""

from __future__ import annotations

import pytest


@pytest.fixture
def pod(scenario):
    return scenario["pod"]


def test_a_runs_progress_bar_turns_into_charts_when_it_finishes(page, live_server, pod, login, shot):
    from apps.simulations.services import simulation_execute, simulation_start

    run = simulation_start(
        cluster=pod, trace="tiresias_60_job.csv", policies=["topo", "naive"], job_limit=40, defer=True
    )
    login("ops")
    page.goto(f"{live_server.url}/simulations/{run.pk}/")
    assert page.locator("#progress-bar").is_visible()
    shot("simulation-progress")
    simulation_execute(run_id=run.pk)
    # The page polls the progress endpoint and reloads itself when the run is done.
    page.wait_for_selector("#chart-jct_cdf .main-svg")
    assert page.locator("#progress-bar").count() == 0
    for name in ("jct_cdf", "utilisation", "fragmentation"):
        assert page.locator(f"#chart-{name} .scatterlayer .trace").count() == 2
    assert page.locator("#simulation-metrics tbody tr").count() == 2
    shot("simulation-done")


def test_staff_start_a_run_from_the_form(page, live_server, pod, login, shot):
    login("ops")
    page.goto(f"{live_server.url}/simulations/")
    page.select_option("#id_cluster", "pod-256")
    page.select_option("#id_trace", "tiresias_60_job.csv")
    page.fill("#id_job_limit", "20")
    page.click("#simulation-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/simulations/*/")
    page.wait_for_selector("#chart-jct_cdf .main-svg")
    page.goto(f"{live_server.url}/simulations/")
    assert page.locator("#comparison tbody tr").count() == 4
    shot("simulations-list")
