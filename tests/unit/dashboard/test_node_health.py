"""Node health on the cluster page and the job page's processes: drain, resume, down, unhealthy."""

from __future__ import annotations

from apps.scheduling.choices import NodeState
from apps.scheduling.models import NodeHealth, RankRun
from apps.topology.models import Node


def test_cluster_page_shows_down_draining_and_unhealthy_at_a_glance(client, people, case44_db):
    a, b = Node.objects.filter(cluster=case44_db).order_by("position")
    NodeHealth.objects.create(node=a, state=NodeState.DOWN, reason="no heartbeat for 30 s")
    NodeHealth.objects.create(node=b, unhealthy_gpus=[{"gpu": 2, "reason": "XID 79"}])
    client.force_login(people["alice"])
    html = client.get("/clusters/case-4-4/").content.decode()
    assert "<strong>0</strong> up" not in html
    assert 'class="bad">1</strong> <abbr title="Heartbeats stopped' in html
    assert "node-b:2 (XID 79)" in html and "no heartbeat for 30 s" in html
    assert "drain-form" not in html  # operators only


def test_staff_drain_and_resume_from_the_cluster_page(client, people, case44_db):
    client.force_login(people["ops"])
    response = client.post("/clusters/case-4-4/node-health/drain/", {"node": "node-a", "reason": "firmware"})
    assert response.status_code == 302
    assert NodeHealth.objects.get(node__name="node-a").state == NodeState.DRAINED
    html = client.get("/clusters/case-4-4/").content.decode()
    assert "firmware" in html and "Resume" in html
    client.post("/clusters/case-4-4/node-health/resume/", {"node": "node-a"})
    assert NodeHealth.objects.get(node__name="node-a").state == NodeState.UP
    missing = client.post("/clusters/case-4-4/node-health/drain/", {"node": "node-a", "reason": ""})
    assert missing.status_code == 302
    assert NodeHealth.objects.get(node__name="node-a").state == NodeState.UP


def test_users_cannot_drain(client, people, case44_db):
    client.force_login(people["alice"])
    assert (
        client.post("/clusters/case-4-4/node-health/drain/", {"node": "node-a", "reason": "x"}).status_code
        == 403
    )


def test_job_page_shows_generations_output_tails_and_rank_map_usage(client, people, naive_case44):
    node = Node.objects.get(cluster=naive_case44.cluster, name="node-a")
    RankRun.objects.create(
        job=naive_case44,
        generation=naive_case44.generation,
        rank=3,
        node=node,
        state="exited",
        exit_code=1,
        log_tail="Traceback: CUDA error",
    )
    client.force_login(people["alice"])
    html = client.get(f"/jobs/{naive_case44.pk}/").content.decode()
    assert 'id="generations"' in html and "Traceback: CUDA error" in html
    assert "mpirun --app FILE" in html and "SLURM_PROCID" in html and "set_device(LOCAL_RANK)" in html
