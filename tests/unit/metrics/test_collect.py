"""A collection pass against a real local HTTP server: storage of real scrapes, MIG kept apart,
and every way a node can fail ending as a clear node state with earlier values kept."""

import pytest
from django.core.management import call_command

from apps.metrics.choices import ScrapeState
from apps.metrics.models import GpuLatest, GpuSample, MetricsSource, NodeScrape
from apps.metrics.services import metrics_collect
from apps.topology.models import Node

from .conftest import A100_MIG

GOOD = 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 97\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} 0.41\n'


def point(cluster, base, **paths):
    for node, path in paths.items():
        Node.objects.filter(cluster=cluster, name=node.replace("_", "-")).update(dcgm_url=f"{base}{path}")


def latest(node: str, index: int = 0, instance: str = "") -> GpuLatest:
    return GpuLatest.objects.get(gpu__node__name=node, gpu__index=index, instance=instance)


def test_the_a100_scrape_stores_tensor_active_for_that_gpu_and_the_mig_instance_apart(case44, exporter):
    base, behaviours = exporter
    behaviours.by_path["/a"] = ("text", A100_MIG.read_text())
    point(case44, base, node_a="/a")
    result = metrics_collect(cluster=case44)
    assert (result.nodes_ok, result.nodes_failed) == (1, 1)  # node-b has no dcgm_url
    assert latest("node-a").tensor_active == pytest.approx(0.929, abs=5e-4)
    assert latest("node-a", instance="13").tensor_active == pytest.approx(0.930, abs=5e-4)
    assert latest("node-a").gpu_util is None  # absent, not zero
    assert GpuSample.objects.count() == 2
    state = NodeScrape.objects.get(node__name="node-b")
    assert (state.state, state.last_error) == (ScrapeState.ERROR, "no dcgm_url for this node")


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [
        (("text", "<html>oops</html> {{{\n"), "not exporter text"),
        (("status", 500), "HTTP 500"),
        (("sleep", 1.5), "timeout after 0.5 s"),
        (("truncated", GOOD), "IncompleteReadError"),
    ],
    ids=["garbage", "http-500", "timeout", "truncated"],
)
def test_a_failing_node_gets_a_clear_state_and_keeps_its_earlier_values(pod256, exporter, behaviour, error):
    base, behaviours = exporter
    behaviours.by_path["/good"] = ("text", GOOD)
    behaviours.by_path["/flaky"] = ("text", GOOD)
    point(pod256, base, node_001="/good", node_002="/flaky")
    MetricsSource.objects.create(cluster=pod256, timeout_s=0.5, interval_s=15)
    first = metrics_collect(cluster=pod256)
    assert first.nodes_ok == 2
    before = latest("node-002")

    behaviours.by_path["/flaky"] = behaviour
    second = metrics_collect(cluster=pod256)
    assert second.nodes_ok == 1  # the good node is still read in the same pass
    state = NodeScrape.objects.get(node__name="node-002")
    assert state.state == ScrapeState.STALE  # failed, but its last values are recent
    assert error in state.last_error
    assert state.last_success_at is not None and state.last_error_at > state.last_success_at
    kept = latest("node-002")
    assert (kept.at, kept.tensor_active) == (before.at, pytest.approx(0.41))
    assert NodeScrape.objects.get(node__name="node-001").state == ScrapeState.OK


def test_a_node_failing_past_the_stale_window_is_an_error(case44, exporter):
    from datetime import timedelta

    from django.utils import timezone

    base, behaviours = exporter
    behaviours.by_path["/a"] = ("text", GOOD)
    point(case44, base, node_a="/a")
    long_ago = timezone.now() - timedelta(hours=1)
    metrics_collect(cluster=case44, now=long_ago)
    behaviours.by_path["/a"] = ("status", 503)
    metrics_collect(cluster=case44)
    state = NodeScrape.objects.get(node__name="node-a")
    assert state.state == ScrapeState.ERROR
    assert state.last_success_at == long_ago


def test_the_nodes_of_a_pass_are_fetched_concurrently(pod256, exporter):
    base, behaviours = exporter
    for i in range(1, 9):
        behaviours.by_path[f"/n{i}"] = ("sleep", 0.4)
    point(pod256, base, **{f"node_00{i}": f"/n{i}" for i in range(1, 9)})
    result = metrics_collect(cluster=pod256)
    assert result.nodes_ok == 8
    assert behaviours.max_in_flight > 1  # one after another would never overlap


def test_collect_metrics_command_runs_one_pass(case44, exporter, capsys):
    base, behaviours = exporter
    behaviours.by_path["/a"] = ("text", A100_MIG.read_text())
    point(case44, base, node_a="/a")
    call_command("collect_metrics", "--cluster", "case-4-4")
    assert "1 nodes read, 1 failed, 2 GPU readings" in capsys.readouterr().out
    assert GpuLatest.objects.count() == 2
