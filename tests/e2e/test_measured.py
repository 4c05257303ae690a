"""Measured overlays in Chromium: the cluster page switches MFU, utilisation and comm share
between predicted, measured (with its age) and the difference, from the polled measurements."""

from django.utils import timezone
from playwright.sync_api import expect

from .test_dashboard import GRAPH_DRAWN


def measure_case_job(scenario) -> None:
    """A fresh measurement of the naive seed job on case-4-4, as a collection pass records it."""
    from apps.metrics.models import GpuLatest, JobSample
    from apps.scheduling.models import Allocation

    job = scenario["jobs"]["bert-large-16"]
    now = timezone.now()
    JobSample.objects.create(
        job=job,
        at=now,
        gpus_measured=16,
        gpu_util=0.97,
        tensor_active=0.21,
        mfu=0.21,
        mfu_source="estimate",
        comm_share=0.59,
        comm_source="estimate",
        predicted_comm_share=0.52,
        predicted_mfu=0.25,
    )
    for alloc in Allocation.objects.filter(job=job, live=True):
        GpuLatest.objects.create(gpu_id=alloc.gpu_id, at=now, gpu_util=0.97, tensor_active=0.21)


def metric_colors(page):
    return page.evaluate(
        "() => document.getElementById('cluster-graph').data.find(t => t.meta.role === 'gpu-metric').marker.color"
    )


def test_the_values_toggle_shows_measured_then_the_difference(page, live_server, scenario, login, shot):
    measure_case_job(scenario)
    login("ops")
    page.goto(f"{live_server.url}/clusters/case-4-4/")
    page.wait_for_selector(GRAPH_DRAWN)
    page.wait_for_selector("#cluster-graph[data-measured-gpus='16']")
    page.check("input[name=overlay][value=comm]")
    page.wait_for_selector("#cluster-graph[data-overlay='comm']")
    predicted = metric_colors(page)
    assert predicted == page.evaluate("() => window.topoweb.client.metrics['comm']")

    page.check("input[name=source][value=measured]")
    page.wait_for_selector("#cluster-graph[data-source='measured']")
    assert metric_colors(page) == [0.59] * 16
    expect(page.locator(".colorbar")).to_contain_text("(measured)")
    expect(page.locator("#graph-status")).to_contain_text("measured")
    expect(page.locator("#graph-status")).to_contain_text("16 of 16 busy GPUs")
    shot("cluster-overlay-comm-measured")

    page.check("input[name=source][value=diff]")
    page.wait_for_selector("#cluster-graph[data-source='diff']")
    diff = metric_colors(page)
    assert diff == [round(0.59 - p, 4) for p in predicted]
    expect(page.locator(".colorbar")).to_contain_text("measured − predicted")
    shot("cluster-overlay-comm-diff")
