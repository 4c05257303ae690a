"""The now page: what is broken right now, each line linking to its page; operators land on it."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.metrics.models import NodeScrape
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import Job, NodeHealth, RankRun
from apps.topology.models import Node


def test_now_page_lists_what_is_broken_with_links(client, people, naive_case44):
    cluster = naive_case44.cluster
    a, b = Node.objects.filter(cluster=cluster).order_by("position")
    now = timezone.now()
    NodeHealth.objects.create(
        node=a, state=NodeState.DOWN, reason="no heartbeat for 180 s", last_seen=now, state_since=now
    )
    NodeHealth.objects.create(
        node=b, last_seen=now - timedelta(seconds=170), unhealthy_gpus=[{"gpu": 3, "reason": "XID 79"}]
    )
    Job.objects.filter(pk=naive_case44.pk).update(
        status=JobStatus.FAILED, finished_at=now, pending_reason="rank 5 exited with code 1"
    )
    RankRun.objects.create(
        job=naive_case44,
        generation=naive_case44.generation,
        rank=5,
        node=b,
        state="exited",
        exit_code=1,
        exited_at=now,
        log_tail="step 10\nstep 11\nRuntimeError: NCCL timeout",
    )
    Node.objects.filter(pk=a.pk).update(dcgm_url="http://node-a:9400/metrics")
    NodeScrape.objects.create(node=a, state="error", last_error="connection refused", last_error_at=now)
    client.force_login(people["alice"])
    html = client.get("/now/").content.decode()
    assert 'href="/clusters/case-4-4/nodes/node-a/">node-a</a>' in html and "no heartbeat for 180 s" in html
    assert "node-b:3</a>" in html and "XID 79" in html
    assert f'href="/jobs/{naive_case44.pk}/"' in html and "rank 5 on" in html and "exit 1" in html
    assert "RuntimeError: NCCL timeout" in html
    assert 'id="now-agents"' in html and "down in" in html.lower()
    assert "connection refused" in html
    assert "Queue pressure" in html and "things need a look" in html
    fragment = client.get("/now/?fragment=1").content.decode()
    assert "<html" not in fragment and "RuntimeError: NCCL timeout" in fragment


def test_other_users_failed_jobs_show_without_their_output(client, people, naive_case44):
    Job.objects.filter(pk=naive_case44.pk).update(status=JobStatus.FAILED, finished_at=timezone.now())
    RankRun.objects.create(
        job=naive_case44,
        generation=naive_case44.generation,
        rank=0,
        node=Node.objects.filter(cluster=naive_case44.cluster).first(),
        state="exited",
        exit_code=2,
        exited_at=timezone.now(),
        log_tail="secret path /home/alice",
    )
    client.force_login(people["bob"])
    html = client.get("/now/").content.decode()
    assert f"job {naive_case44.pk} (other user)" in html and "secret path" not in html


def test_nothing_broken_says_so(client, people, case44_db):
    client.force_login(people["alice"])
    html = client.get("/now/").content.decode()
    assert "Nothing is broken" in html and "No job failed in the last" in html


def test_operators_land_on_the_now_page_and_users_on_the_graph(client, people, case44_db):
    response = client.post("/accounts/login/", {"username": "ops", "password": "pw"}, follow=True)
    assert response.redirect_chain[-1][0] == "/now/"
    client.logout()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"}, follow=True)
    assert response.redirect_chain[-1][0] == "/"


def test_refresh_is_the_pages_default_or_the_asked_seconds_within_2_to_300(client, people, case44_db):
    client.force_login(people["ops"])
    every = {
        url: client.get(url).content.decode()
        for url in ("/now/", "/now/?refresh=1", "/now/?refresh=soon", "/queue/", "/queue/?refresh=900")
    }
    assert "refresh every 15 s" in every["/now/"] and "refresh every 15 s" in every["/now/?refresh=soon"]
    assert "refresh every 2 s" in every["/now/?refresh=1"]
    assert '<span id="refresh-seconds">10</span>' in every["/queue/"]
    assert '<span id="refresh-seconds">300</span>' in every["/queue/?refresh=900"]


def test_ranks_stopping_show_on_the_now_page_and_their_node_page_with_since_when(
    client, people, naive_case44
):
    from apps.scheduling import services

    node = Node.objects.get(cluster=naive_case44.cluster, name="node-a")
    for rank in (0, 1, 2):
        RankRun.objects.create(job=naive_case44, generation=naive_case44.generation, rank=rank, node=node)
    services.job_cancel(job=naive_case44)
    RankRun.objects.update(stop_requested_at=timezone.now() - timedelta(minutes=5))
    client.force_login(people["alice"])
    html = client.get("/now/").content.decode()
    section = html[html.index('id="now-stopping"') :]
    section = section[: section.index("</section>")]
    assert f'href="/jobs/{naive_case44.pk}/"' in section and "cancelled" in section
    assert 'href="/clusters/case-4-4/nodes/node-a/">node-a</a>' in section
    assert '<td class="num">3</td><td>5 min ago</td>' in section
    page = client.get("/clusters/case-4-4/nodes/node-a/").content.decode()
    assert 'id="node-stopping"' in page and "Ranks stopping here" in page
    # The cluster's free count and its graph agree: the 3 GPUs still held are not free in either.
    graph = client.get("/clusters/case-4-4/").content.decode()
    assert "16 GPUs (13 free)" in graph
    assert "free (13)" in graph and "stopping (a rank that has not exited yet holds it) (3)" in graph
    # Once the ranks' exits are confirmed, neither lists them.
    RankRun.objects.filter(job=naive_case44).update(state="exited", exit_code=-15, exited_at=timezone.now())
    assert "No rank is stopping" in client.get("/now/").content.decode()
    assert 'id="node-stopping"' not in client.get("/clusters/case-4-4/nodes/node-a/").content.decode()


def test_a_failed_job_names_its_failing_rank_first_and_its_box_says_why_it_failed(
    client, people, naive_case44
):
    """Rank 3 exited 3; TopoWeb then stopped the others (exit -15, cause stopped), whose reports
    came in the same sync: the Now page and the job page name rank 3 first, and the job page's
    box is "Why it failed", not "Why pending"."""
    a, b = Node.objects.filter(cluster=naive_case44.cluster).order_by("position")
    now = timezone.now()
    Job.objects.filter(pk=naive_case44.pk).update(
        status=JobStatus.FAILED, finished_at=now, pending_reason="rank 3 on node node-a exited with code 3"
    )
    for rank, code, cause in (
        (0, -15, "stopped"),
        (1, -15, "stopped"),
        (3, 3, "exited"),
        (9, -15, "stopped"),
    ):
        RankRun.objects.create(
            job=naive_case44,
            generation=naive_case44.generation,
            rank=rank,
            node=a if rank < 8 else b,
            state="exited",
            exit_code=code,
            exit_cause=cause,
            exited_at=now,
            log_tail=f"rank {rank} output",
        )
    client.force_login(people["alice"])
    now_html = client.get("/now/").content.decode()
    assert "rank 3 on" in now_html and "exit 3" in now_html and "exit -15" not in now_html
    job_html = client.get(f"/jobs/{naive_case44.pk}/").content.decode()
    assert "<strong>Why it failed:</strong>" in job_html and "Why pending" not in job_html
    listed = [job_html.index(f"rank {r} on") for r in (3, 0, 1, 9)]
    assert listed == sorted(listed)  # the failing rank first, then the ones TopoWeb stopped


def test_a_node_without_an_exporter_is_no_metrics_alarm(client, people, case44_db):
    a, b = Node.objects.filter(cluster=case44_db).order_by("position")
    now = timezone.now()
    for node in (a, b):
        NodeScrape.objects.create(
            node=node, state="error", last_error="no dcgm_url for this node", last_error_at=now
        )
    client.force_login(people["alice"])
    assert "no dcgm_url for this node" not in client.get("/now/").content.decode()
    Node.objects.filter(pk=a.pk).update(dcgm_url="http://node-a:9400/metrics")
    NodeScrape.objects.filter(node=a).update(last_error="connection refused")
    html = client.get("/now/").content.decode()
    assert "connection refused" in html and "no dcgm_url" not in html
