"""The operator's pages in Chromium at 1366x768: node states on the graph, the now page refreshing
itself, hot links, the node list, usage, and the graph's nodes reached from the keyboard.

With TOPOWEB_SCREENSHOTS=1 the screenshots (light and dark) go to docs/screenshots/ops-*.png,
otherwise to test-artifacts/e2e/.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import expect

from .conftest import screenshot_folder
from .test_cluster_graph import GRAPH_DRAWN, open_cluster


def both_themes(page, name: str, selector: str | None = None) -> None:
    """Screenshot the viewport as ops-NAME.png and, with the dark system theme, ops-NAME-dark.png."""
    if selector:
        page.locator(selector).scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_folder() / f"ops-{name}.png"))
    page.emulate_media(color_scheme="dark")
    if page.locator("#cluster-graph[data-rendered='1']").count():
        page.wait_for_selector("#cluster-graph[data-theme='dark']")  # redrawn in the theme's colours
    page.screenshot(path=str(screenshot_folder() / f"ops-{name}-dark.png"))
    page.emulate_media(color_scheme="light")


def _break_nodes(cluster):
    """The last node of pod-256 down, the one before drained, one GPU of the third-last unhealthy."""
    from apps.scheduling.models import NodeHealth
    from apps.topology.models import Node

    nodes = list(Node.objects.filter(cluster=cluster).order_by("-position")[:3])
    now = timezone.now()
    NodeHealth.objects.create(
        node=nodes[0], state="down", reason="no heartbeat for 180 s", last_seen=now, state_since=now
    )
    NodeHealth.objects.create(
        node=nodes[1],
        state="drained",
        reason="IB cable swap",
        last_seen=now,
        state_since=now - timedelta(hours=2),
    )
    NodeHealth.objects.create(node=nodes[2], last_seen=now, unhealthy_gpus=[{"gpu": 1, "reason": "XID 79"}])
    return [n.name for n in nodes]


def test_node_states_show_on_the_graph_and_leave_the_free_count(laptop, live_server, scenario):
    down, drained, sick = _break_nodes(scenario["pod"])
    page = laptop()
    expect(page).to_have_url(f"{live_server.url}/now/")  # operators land on the now page
    open_cluster(page, live_server, "pod-256")
    legend = page.locator("#cluster-graph .legendtext")
    for text in ("down (1 node)", "drained (1 node)", "unhealthy GPU (1 node)", "no agent (29 nodes)"):
        expect(legend.filter(has_text=text)).to_have_count(1)
    expect(legend.filter(has_text="not schedulable (down, drained or draining node) (16)")).to_have_count(1)
    free = page.evaluate(
        "() => document.getElementById('cluster-graph').data.find(t => t.meta.role === 'gpu-free').customdata.length"
    )
    # 256 GPUs, 120 booked by the four placed jobs, 16 on the down and drained nodes, 1 unhealthy.
    booked = page.evaluate("() => window.topoweb.client.gpu_job.filter(j => j >= 0).length")
    assert free == 256 - booked - 16 - 1
    expect(page.locator(".page-head .facts")).to_contain_text(f"({free} free)")
    text = page.evaluate(
        "(name) => window.topoweb.describeNode(window.topoweb.client.node_names.indexOf(name))", down
    )
    assert "down since" in text and "no heartbeat for 180 s" in text
    both_themes(page, "graph-node-states", "#cluster-graph")
    page.goto(f"{live_server.url}/clusters/pod-256/nodes/?state=drained")
    expect(page.locator("#node-rows tbody tr")).to_have_count(1)
    expect(page.locator("#node-rows")).to_contain_text("IB cable swap")
    expect(page.locator("#node-rows")).to_contain_text("2.0 h ago")
    page.goto(f"{live_server.url}/clusters/pod-256/nodes/")
    both_themes(page, "nodes")


def test_now_page_lists_the_broken_and_refreshes_itself(laptop, live_server, scenario):
    from apps.scheduling.models import Job, NodeHealth, RankRun
    from apps.topology.models import Node

    names = _break_nodes(scenario["pod"])
    job = scenario["jobs"]["bob-dp8"]
    Job.objects.filter(pk=job.pk).update(
        status="failed", finished_at=timezone.now(), pending_reason="rank 3 exited with code 1"
    )
    RankRun.objects.create(
        job=job,
        generation=job.generation,
        rank=3,
        node=Node.objects.get(cluster=scenario["pod"], name=names[2]),
        state="exited",
        exit_code=1,
        exited_at=timezone.now(),
        log_tail="epoch 2\nRuntimeError: CUDA error: an illegal memory access",
    )
    page = laptop()
    page.goto(f"{live_server.url}/now/?refresh=2")
    expect(page.locator("#now-nodes tbody tr")).to_have_count(2)
    expect(page.locator("#now-gpus")).to_contain_text("XID 79")
    expect(page.locator("#now-failed")).to_contain_text("rank 3 on")
    expect(page.locator("#now-failed pre.tail")).to_contain_text("illegal memory access")
    expect(page.locator("#now-queues")).to_contain_text("pod-256")
    page.locator("#now-failed a", has_text="bob-dp8").click()
    expect(page).to_have_url(f"{live_server.url}/jobs/{job.pk}/")
    page.go_back()
    # A node goes down while the page is open: it shows without a reload.
    node = Node.objects.get(cluster=scenario["case"], name="node-a")
    NodeHealth.objects.create(
        node=node, state="down", reason="power", last_seen=timezone.now(), state_since=timezone.now()
    )
    expect(page.locator("#now-nodes tbody tr")).to_have_count(3)
    expect(page.locator("#now-nodes")).to_contain_text("power")
    both_themes(page, "now")


def test_hot_links_list_the_busiest_links_with_their_jobs(laptop, live_server, scenario):
    page = laptop()
    page.goto(f"{live_server.url}/clusters/pod-256/links/?n=15")
    rows = page.locator("#hot-links tbody tr")
    expect(rows).to_have_count(15)
    first = rows.first
    expect(first).to_contain_text("job ")
    shares = page.evaluate(
        "() => [...document.querySelectorAll('#hot-links tbody tr td:nth-child(5)')].map(td => parseFloat(td.textContent.split('·')[1]))"
    )
    assert shares == sorted(shares, reverse=True) and shares[0] > 0
    leaf = first.locator("td:nth-child(2) a").last.text_content()
    first.locator("td:nth-child(2) a").last.click()
    expect(page).to_have_url(f"{live_server.url}/clusters/pod-256/switches/{leaf}/")
    expect(page.locator("#oversubscription")).to_contain_text("4:1 oversubscribed")
    # Its uplinks first (to the two spines), then its busiest NIC cables with their jobs.
    expect(page.locator("#switch-loads tbody tr").first).to_contain_text("spine")
    expect(page.locator("#switch-loads tbody tr", has_text="NIC cable").first).to_contain_text("job ")
    both_themes(page, "switch")
    page.goto(f"{live_server.url}/clusters/pod-256/links/?n=15")
    both_themes(page, "links")


def test_graph_nodes_are_reached_and_described_from_the_keyboard(laptop, live_server, scenario):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    job = scenario["jobs"]["llm-tp8-pp2"]
    page.focus("#graph-keys summary")
    page.keyboard.press("Enter")
    expect(page.locator("#graph-key-list button.key-item").first).to_be_visible()
    page.keyboard.press("Tab")  # the first leaf group
    page.keyboard.press("Tab")  # its first node
    focused = page.evaluate("() => document.activeElement.dataset.node")
    assert focused
    label = page.evaluate("() => document.activeElement.getAttribute('aria-label')")
    assert focused in label and "GPUs" in label
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#cluster-graph[data-focus-node='{focused}']")
    expect(page.locator("#graph-key-status")).to_contain_text(focused)
    page.wait_for_selector(GRAPH_DRAWN)
    if job.name in label:
        page.wait_for_selector(f"#cluster-graph[data-highlight='{job.pk}']")
    assert page.evaluate("() => window.topoweb.state.range[1] - window.topoweb.state.range[0]") < 40
    # The switches are in the list too, each described by its uplinks.
    leaf = page.locator("#graph-key-list a[data-switch='leaf-1']")
    assert "uplinks 800 GB/s" in leaf.get_attribute("aria-label")
    page.focus(f"#graph-key-list button[data-node='{focused}']")
    page.keyboard.press("Tab")  # the node's page link
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live_server.url}/clusters/pod-256/nodes/{focused}/")


def test_usage_page_and_history_columns(laptop, live_server, scenario):
    from apps.scheduling.models import Job

    now = timezone.now()
    for name in ("bob-dp8", "spread-naive"):
        Job.objects.filter(pk=scenario["jobs"][name].pk).update(
            status="completed", started_at=now - timedelta(hours=2), finished_at=now - timedelta(minutes=5)
        )
    page = laptop()
    page.goto(f"{live_server.url}/usage/?range=24h")
    expect(page.locator("#usage-rows tbody tr")).to_have_count(2)
    expect(page.locator("#usage-rows")).to_contain_text("bob")
    with page.expect_download() as download:
        page.click("#usage-csv")
    assert download.value.suggested_filename.startswith("topoweb-usage-")
    both_themes(page, "usage")
    page.goto(f"{live_server.url}/queue/?range=24h")
    expect(page.locator("#queue-rows thead")).to_contain_text("GPU-hours")


def test_link_load_shows_measured_minus_predicted_and_metric_overlays_keep_the_legend(
    laptop, live_server, scenario
):
    from apps.metrics.models import NicLatest
    from apps.topology.models import Node

    # Every NIC of case-4-4's node-a sends 20 GB/s, measured now.
    node = Node.objects.get(cluster=scenario["case"], name="node-a")
    for nic in node.nics.all():
        NicLatest.objects.create(
            node=node, device=nic.name, port="1", at=timezone.now(), tx_Bps=20e9, rx_Bps=20e9
        )
    page = laptop()
    open_cluster(page, live_server, "case-4-4")
    graph = page.locator("#cluster-graph")
    box = page.evaluate(
        "() => { const s = document.getElementById('cluster-graph')._fullLayout._size; return [s.l, s.w]; }"
    )
    legend = page.evaluate(
        "() => [...document.querySelectorAll('#cluster-graph .legendtext')].map(e => e.textContent)"
    )
    page.check("input[name=overlay][value=mfu]")
    page.wait_for_selector("#cluster-graph[data-overlay='mfu']")
    page.wait_for_timeout(200)
    mfu_legend = page.evaluate(
        "() => [...document.querySelectorAll('#cluster-graph .legendtext')].map(e => e.textContent)"
    )
    job_entries = [t for t in legend if t.startswith("job ")]
    assert job_entries and all(t in mfu_legend for t in job_entries)
    same = page.evaluate(
        "() => { const s = document.getElementById('cluster-graph')._fullLayout._size; return [s.l, s.w]; }"
    )
    assert abs(same[0] - box[0]) <= 1, (box, same)
    page.check("input[name=overlay][value=load]")
    page.wait_for_selector("#cluster-graph[data-overlay='load']")
    page.evaluate("() => window.topoweb.measuredLoaded")
    page.check("input[name=source][value=diff]")
    page.wait_for_selector("#cluster-graph[data-load-colours='diff']")
    names = page.evaluate(
        "() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'load' && t.showlegend).map(t => t.name)"
    )
    # The load layers now name differences (percentage points of capacity), not shares.
    assert names and all(n == "no measurement" or " pp" in n for n in names), names
    expect(page.locator("#graph-status")).to_contain_text("measured − predicted share")
    expect(graph).to_be_visible()
    both_themes(page, "graph-load-diff", "#cluster-graph")
