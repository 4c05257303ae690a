"""A finished job's page in Chromium: its last placement, as booked, survives a topology replace."""

from __future__ import annotations

import copy

from playwright.sync_api import expect

from tests.e2e.conftest import EXAMPLES


def test_a_finished_job_shows_its_last_placement_after_its_nodes_were_replaced(
    page, live_server, scenario, login, shot
):
    from apps.placement.topology import read_spec_file
    from apps.scheduling import selectors, services
    from apps.topology.services import cluster_import

    job = services.job_complete(job=scenario["jobs"]["bob-dp8"])
    [booked] = {r["node"] for r in selectors.job_ranks(job=job)}
    # Waiting jobs first: cancelling a running one would let them be placed.
    for status in (["queued", "preempted"], ["placing", "running"]):
        for other in scenario["pod"].jobs.filter(status__in=status):
            services.job_cancel(job=other)
    # Half the pod: the replace deletes every GPU row the job ran on.
    spec = copy.deepcopy(read_spec_file(str(EXAMPLES / "pod-256.yaml")))
    spec["generate"]["leaves"] = 2
    cluster_import(data=spec, replace=True)
    login("bob")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    table = page.locator("#last-placement")
    expect(table).to_contain_text("Node")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table.locator("tbody tr td").first).to_have_text(booked)
    expect(table.locator("tbody tr")).to_contain_text("0-7")
    expect(page.locator("a:has-text('Slurm hostfile')")).to_be_visible()
    shot("job-history")
