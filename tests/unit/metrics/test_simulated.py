"""The simulated exporter: driven by placed jobs and the cost model, served over a real socket,
collected like any dcgm-exporter; the demo's naive case 4.4 job shows the seed's pattern measured
and gets a hotspot and a proposal from measured data."""

from datetime import timedelta

import httpx
import numpy as np
import pytest
from django.utils import timezone

from apps.metrics.choices import HotspotKind, MeasureSource
from apps.metrics.exposition import parse_scrape
from apps.metrics.fake import SimulatedExporter
from apps.metrics.models import Hotspot, JobSample, NicLatest
from apps.metrics.services import metrics_collect
from apps.metrics.simulate import RunningJob, gpu_states, network_scaled, node_pages
from apps.placement.jobs import load_job
from apps.placement.solvers import place
from apps.placement.topology import load_topology, read_spec_file
from apps.scheduling.choices import ProposalStatus
from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.models import Job

from .conftest import REPO


def _case44():
    topo = load_topology(read_spec_file(REPO / "examples" / "case-4-4.yaml"))
    job = load_job(read_spec_file(REPO / "examples" / "case-4-4-job.yaml"))
    free = np.ones(topo.n_gpus, dtype=bool)
    return topo, job, {p: place(topo, free, {}, job, policy=p) for p in ("topo", "naive")}


def test_a_badly_placed_job_is_busy_with_low_tensor_activity():
    topo, job, placed = _case44()
    true = network_scaled(topo, 0.75)
    states = {p: gpu_states(topo, true, [RunningJob(job, pl.gids)], {}) for p, pl in placed.items()}
    assert all(s.util > 0.9 for p in states for s in states[p])
    ratio = states["naive"][0].tensor / states["topo"][0].tensor
    assert 0.35 < ratio < 0.55  # MFU near half of the well-placed job's
    assert sum(s.nic_Bps for s in states["naive"]) > 0 and sum(s.nic_Bps for s in states["topo"]) == 0


def test_pages_are_real_exporter_text_for_every_gpu():
    topo, job, placed = _case44()
    states = gpu_states(topo, topo, [RunningJob(job, placed["naive"].gids)], {})
    pages = node_pages(topo, states)
    scrape = parse_scrape(pages["node-a"], n_gpus=8)
    assert sorted(g for g, _ in scrape.gpus) == list(range(8))
    assert scrape.rejected_count == 0
    assert {"gpu_util", "tensor_active", "nvlink_tx_Bps", "power_W", "xid_last"} <= set(
        scrape.gpus[(0, "")].values
    )


@pytest.fixture
def simulated_case44(case44):
    load_demo_jobs(start_all=True)
    exporter = SimulatedExporter(["case-4-4"])
    server = exporter.serve("127.0.0.1", 0, refresh_s=3600)
    exporter.point_nodes(f"http://127.0.0.1:{server.server_address[1]}")
    yield case44, exporter
    exporter.stop()


def test_the_naive_case_job_is_measured_busy_at_half_the_mfu_with_half_of_each_step_communicating(
    simulated_case44,
):
    cluster, exporter = simulated_case44
    job = Job.objects.get(cluster=cluster)
    start = timezone.now()
    for i in range(3):
        exporter.refresh()
        result = metrics_collect(cluster=cluster, now=start + timedelta(seconds=15 * i))
        assert result.nodes_ok == 2
    sample = JobSample.objects.filter(job=job).latest("at")
    assert sample.gpus_measured == 16
    assert sample.gpu_util > 0.9
    assert sample.mfu_source == MeasureSource.ESTIMATE
    well_placed_mfu = 0.507  # topo's predicted MFU for the same job (2.67 ms of DP comm)
    assert 0.35 < sample.mfu / well_placed_mfu < 0.55
    assert sample.comm_source == MeasureSource.ESTIMATE and 0.45 < sample.comm_share < 0.65
    assert sample.predicted_comm_share == pytest.approx(0.522, abs=0.01)
    assert NicLatest.objects.filter(node__cluster=cluster, tx_Bps__gt=0).count() == 2  # DP rings cross

    hotspot = Hotspot.objects.get(cluster=cluster, kind=HotspotKind.COMM_SHARE, job=job)
    assert hotspot.is_open and hotspot.intervals == 3
    assert len(hotspot.evidence["comm_share"]) == 3
    proposal = hotspot.proposal
    assert proposal.status == ProposalStatus.PROPOSED and proposal.predicted_gain > 0.4
    assert proposal.reason.startswith("measured: comm share")


def _three_passes(cluster, exporter):
    start = timezone.now() - timedelta(seconds=30)
    for i in range(3):
        exporter.refresh()
        metrics_collect(cluster=cluster, now=start + timedelta(seconds=15 * i))


def test_the_cluster_page_shows_measured_values_hotspot_and_proposal(simulated_case44, client):
    from django.contrib.auth import get_user_model

    cluster, exporter = simulated_case44
    _three_passes(cluster, exporter)
    job = Job.objects.get(cluster=cluster)
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    body = client.get("/clusters/case-4-4/").content.decode()
    assert 'id="hotspots"' in body and f"job {job.pk} bert-large-16" in body
    assert "faster predicted" in body and "no fresh measurements" not in body
    measured = client.get("/clusters/case-4-4/measured/").json()
    assert len(measured["gids"]) == 16 and measured["age_s"] is not None
    assert all(u > 0.9 for u in measured["util"])
    assert all(0.45 < c < 0.65 for c in measured["comm"])


def test_the_job_page_charts_measured_beside_predicted(simulated_case44, client):
    import json
    import re

    from django.contrib.auth import get_user_model

    cluster, exporter = simulated_case44
    _three_passes(cluster, exporter)
    job = Job.objects.get(cluster=cluster)
    client.force_login(get_user_model().objects.get(username="alice"))
    body = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "est. from tensor-active" in body and 'id="measured-age"' in body and 'id="job-hotspots"' in body
    charts = json.loads(re.search(r'id="job-charts"[^>]*>(.*?)</script>', body, re.S).group(1))
    names = [t["name"] for t in charts["mfu"]["data"]]
    assert names == ["predicted", "measured", "GPU utilisation (measured)"]
    assert len(charts["comm"]["data"][1]["y"]) == 3


def test_two_intervals_over_the_threshold_are_not_yet_a_hotspot(simulated_case44):
    cluster, exporter = simulated_case44
    start = timezone.now()
    for i in range(2):
        metrics_collect(cluster=cluster, now=start + timedelta(seconds=15 * i))
    assert JobSample.objects.count() == 2
    assert not Hotspot.objects.exists()


def test_the_exporter_answers_404_for_unknown_nodes(simulated_case44):
    _, exporter = simulated_case44
    port = exporter.server.server_address[1]
    assert httpx.get(f"http://127.0.0.1:{port}/clusters/case-4-4/nodes/node-z/metrics").status_code == 404
    assert httpx.get(f"http://127.0.0.1:{port}/clusters/case-4-4/nodes/node-a/metrics").status_code == 200


def test_a_hotspot_closes_when_its_job_fails(simulated_case44, client):
    from django.contrib.auth import get_user_model

    from apps.scheduling.choices import JobStatus

    cluster, exporter = simulated_case44
    _three_passes(cluster, exporter)
    job = Job.objects.get(cluster=cluster)
    hotspot = Hotspot.objects.get(cluster=cluster, kind=HotspotKind.COMM_SHARE, job=job)
    assert hotspot.is_open
    Job.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, finished_at=timezone.now())
    exporter.refresh()
    metrics_collect(cluster=cluster, now=timezone.now())
    hotspot.refresh_from_db()
    assert not hotspot.is_open and hotspot.closed_at is not None
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    assert f"job {job.pk} bert-large-16" not in client.get("/clusters/case-4-4/").content.decode()


def test_the_simulated_exporter_says_nothing_of_a_scraper_that_hung_up(capsys):
    # At load 15 the collector's timeout closed connections before their pages were written, and
    # every broken pipe printed a traceback into `make run`'s log.
    from http.server import BaseHTTPRequestHandler

    from apps.metrics.fake import _Server

    server = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset")):
            try:
                raise exc
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a fault of the page")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a fault of the page" in capsys.readouterr().err
    finally:
        server.server_close()
