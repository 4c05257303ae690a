"""The cluster graph in Chromium: node names, highlight dimming, link hover in GB/s with the jobs
crossing a link, the path view and leaf matrix, and the zoomed-out bars of a large
rail-optimized cluster.

Each test also takes the screenshot of what it checks, at 1366x768. With TOPOWEB_SCREENSHOTS=1
they are written to docs/screenshots/graph-*.png (the images the docs show), otherwise to
test-artifacts/e2e/.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import PASSWORD, _job, screenshot_folder

GRAPH_DRAWN = "#cluster-graph[data-rendered='1']"
# Pixel position of plot coordinates (x, y) on the page.
TO_PAGE_JS = """([x, y]) => { const gd = document.getElementById('cluster-graph'), fl = gd._fullLayout;
  const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
  return [r.left + fl.xaxis.l2p(x), r.top + fl.yaxis.l2p(y)]; }"""


@pytest.fixture
def graph_shot(page):
    """Screenshot the viewport (after scrolling `selector` into view) as graph-NAME.png."""

    def _shot(name: str, selector: str = "#cluster-graph") -> None:
        page.locator(selector).scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot_folder() / f"graph-{name}.png"))

    return _shot


def open_cluster(page, live_server, name):
    page.goto(f"{live_server.url}/clusters/{name}/")
    page.wait_for_selector(GRAPH_DRAWN)


def hover_at(page, x, y):
    """Move the mouse to plot coordinates (x, y) and return the hover box's text."""
    page.mouse.move(1, 1)
    page.wait_for_selector(".hovertext", state="detached")
    px, py = page.evaluate(TO_PAGE_JS, [x, y])
    if not 0 < py < 740:  # scroll the point into the laptop's viewport
        page.evaluate("(dy) => window.scrollBy(0, dy)", py - 384)
        px, py = page.evaluate(TO_PAGE_JS, [x, y])
    page.mouse.move(px - 3, py)
    page.mouse.move(px, py)
    page.wait_for_selector(".hovertext")
    return page.locator(".hovertext").first.text_content()


def test_node_names_show_on_hover_and_once_zoomed_in(laptop, live_server, scenario, graph_shot):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    # 32 nodes on a laptop: too narrow for full names, so each node shows its number.
    names = page.evaluate("() => window.topoweb.client.node_names")
    number = re.search(r"(\d+)$", names[0]).group(1)
    expect(page.locator("#cluster-graph .textpoint", has_text=re.compile(f"^{number}$"))).to_have_count(1)
    c = page.evaluate("() => [window.topoweb.client.node_x0[4], window.topoweb.client.node_x1[7]]")
    page.evaluate("([a, b]) => window.topoweb.zoomTo(a - 0.5, b + 0.5)", c)
    page.wait_for_selector("#cluster-graph[data-labels='1']")
    names = page.evaluate("() => window.topoweb.client.node_names.slice(4, 8)")
    for name in names:
        expect(page.locator("#cluster-graph .textpoint", has_text=name)).to_have_count(1)
    # The node's own hover: its name, leaf, free GPUs and the way to its page.
    x, y = page.evaluate("() => [window.topoweb.client.node_x[5], window.topoweb.client.y_node]")
    text = hover_at(page, x, y)
    assert names[1] in text and "free" in text and "node's page" in text
    graph_shot("node-names")


def test_highlight_dims_every_other_job_and_outlines_the_nodes(laptop, live_server, scenario, graph_shot):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    job = scenario["jobs"]["llm-tp8-pp2"]
    index = page.evaluate("(id) => window.topoweb.client.jobs.findIndex(j => j.id === id)", job.pk)
    page.select_option("#job-select", str(index))
    page.wait_for_selector(f"#cluster-graph[data-highlight='{job.pk}']")
    styles = page.evaluate(
        """() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'gpu-job')
          .map(t => [t.name, t.marker.opacity])"""
    )
    assert [o for n, o in styles if "llm-tp8-pp2" in n] == [1]
    assert all(o < 0.5 for n, o in styles if "llm-tp8-pp2" not in n)
    # 64 GPUs on 8 nodes: 8 boxes, not 64 rings.
    boxes = page.evaluate(
        "() => document.getElementById('cluster-graph').data.find(t => t.meta.role === 'hl-outline').x"
        ".filter(v => v === null).length"
    )
    assert boxes == 8
    expect(page.locator("#job-panel")).to_contain_text("everything else is dimmed")
    graph_shot("highlight")


def test_link_hover_gives_capacity_load_and_the_jobs_crossing_it(laptop, live_server, scenario, graph_shot):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    # The busiest bundle of NIC cables and the busiest leaf uplink, by predicted load.
    busiest = page.evaluate(
        """() => { const l = window.topoweb.client.links, pick = (lo, hi) => {
            let best = lo; for (let i = lo; i < hi; i++) if (l.load[i] > l.load[best]) best = i; return best; };
          return [pick(l.n_uplinks, l.cap.length), pick(0, l.n_uplinks)].map(i => [i, l.seg[i], l.load[i]]); }"""
    )
    (trunk, trunk_seg, trunk_load), (up, up_seg, up_load) = busiest
    assert trunk_load > 0, "no NIC cable carries predicted load"
    text = hover_at(page, (trunk_seg[0] + trunk_seg[2]) / 2, (trunk_seg[1] + trunk_seg[3]) / 2)
    assert re.search(r"leaf-\d nodes — leaf-\d · NIC cables \(\d+ cables\)", text)
    assert re.search(r"capacity [\d.]+ GB/s", text)
    assert re.search(r"load [\d.]+ GB/s, \d+% of capacity \(predicted\)", text)
    assert "jobs crossing it" in text and re.search(r"job \d+ · [\w-]+ \(\w+\): [\d.]+ GB/s \(\d+%\)", text)
    # A leaf-spine uplink: its capacity and load, busy or idle (these jobs each fit under one leaf).
    text = hover_at(page, (up_seg[0] + up_seg[2]) / 2, (up_seg[1] + up_seg[3]) / 2)
    assert "leaf-spine" in text and "capacity 400 GB/s" in text
    assert re.search(r"load [\d.]+ GB/s, \d+% of capacity \(predicted\)", text)
    assert ("jobs crossing it" in text) is (up_load > 0)
    page.mouse.move(
        *page.evaluate(TO_PAGE_JS, [(trunk_seg[0] + trunk_seg[2]) / 2, (trunk_seg[1] + trunk_seg[3]) / 2])
    )
    page.wait_for_selector(".hovertext")
    graph_shot("link-hover")
    # The load overlay colours every link by its share of capacity.
    page.check("input[name=overlay][value=load]")
    page.wait_for_selector("#cluster-graph[data-overlay='load']")
    used = page.evaluate(
        """() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'load' && t.x.length)
          .map(t => t.name)"""
    )
    assert "link load: idle" in used and len(used) >= 2
    graph_shot("link-load")


def test_path_view_shows_each_hop_its_bottleneck_and_latency(laptop, live_server, scenario, graph_shot):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    names = page.evaluate("() => window.topoweb.client.node_names")
    page.fill("#path-a", f"{names[0]}:3")
    page.fill("#path-b", f"{names[-1]}:3")  # under another leaf: NIC, leaf, spine, leaf, NIC
    page.click("#path-form button")
    rows = page.locator("#path-hops tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.nth(0)).to_contain_text("leaf-1")
    expect(rows.nth(1)).to_contain_text("spine")
    expect(page.locator("#path-result")).to_contain_text("spine level, 50 GB/s")
    expect(page.locator("#path-hops tr.current")).to_contain_text("(bottleneck)")
    drawn = page.evaluate(
        "() => document.getElementById('cluster-graph').data.find(t => t.meta.role === 'hl-path').y"
    )
    # Drawn through both NICs: GPU, NIC, leaf, spine, leaf, NIC, GPU.
    nic_y = page.evaluate("() => window.topoweb.client.y_nic")
    assert len(drawn) == 7 and [drawn[1], drawn[5]] == [nic_y, nic_y]
    graph_shot("path", "#path-result")
    # A wrong endpoint names the field.
    page.fill("#path-b", "no-such-node")
    page.click("#path-form button")
    expect(page.locator("#path-result .error")).to_contain_text("b: no node named 'no-such-node'")
    # The node-pair matrix of one leaf.
    page.select_option("#matrix-leaf", "leaf-2")
    page.click("#matrix-form button")
    expect(page.locator("#leaf-matrix tbody tr")).to_have_count(8)
    expect(page.locator("#leaf-matrix")).to_contain_text("50 GB/s")
    graph_shot("leaf-matrix", "#leaf-matrix")


def test_the_job_page_links_to_the_path_between_two_of_its_gpus(laptop, live_server, scenario):
    from apps.scheduling.models import Job

    job = Job.objects.filter(cluster__name="pod-256", status="running").order_by("-gpus").first()
    page = laptop()
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    link = page.locator("#job-path a")
    expect(link).to_contain_text("Path between rank 0")
    link.click()
    page.wait_for_url("**/clusters/pod-256/?path_a=*")
    # The cluster page shows that path at once, hop by hop.
    expect(page.locator("#path-result")).to_contain_text("GB/s")
    assert page.locator("#path-a").input_value() and page.locator("#path-b").input_value()


def test_zoomed_out_bars_show_which_job_is_where_and_the_free_blocks(
    laptop, live_server, transactional_db, graph_shot
):
    from django.contrib.auth import get_user_model

    from apps.api.roles import role_grant
    from apps.scheduling import services
    from apps.scheduling.models import Job
    from apps.topology.services import cluster_import

    ops = get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    role_grant(user=ops, role="admin")
    cluster = cluster_import(
        data={
            "version": 1,
            "name": "rail-2048",
            "generate": {
                "shape": "rail-optimized",
                "spines": 8,
                "leaves": 64,
                "nodes_per_leaf": 32,
                "gpus_per_node": 8,
                "gpu_model": "H100",
                "peak_tflops": 989,
                "nvlink_bw_GBps": 450,
                "nic_bw_GBps": 50,
                "nics_per_node": 8,
                "uplink_bw_GBps": 400,
            },
        }
    )
    for name, gpus in (("big-512", 512), ("mid-256", 256), ("small-64", 64), ("tiny-8", 8)):
        services.job_submit(user=ops, spec=_job(name, gpus, tp=8), cluster=cluster)
    services.schedule_cluster(cluster=cluster)
    for job in Job.objects.filter(status="placing"):
        services.job_start(job=job)
    page = laptop()
    open_cluster(page, live_server, "rail-2048")
    assert page.get_attribute("#cluster-graph", "data-aggregate") == "1"
    bars = page.evaluate(
        """() => { const t = document.getElementById('cluster-graph').data.find(t => t.meta.role === 'agg');
          return {visible: t.visible !== false, colors: t.marker.color, text: t.hovertext}; }"""
    )
    assert bars["visible"]
    jobs = page.evaluate("() => window.topoweb.client.jobs.map(j => j.color)")
    assert len(set(jobs)) == 4 and set(jobs) <= set(bars["colors"])
    assert any("largest free block" in s for s in bars["text"])
    expect(page.locator("#cluster-graph .textpoint", has_text="free").first).to_be_visible()
    # Every rail is drawn as its own bundle, each in the legend.
    rails = page.evaluate(
        "() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'trunk').map(t => t.name)"
    )
    assert rails == [f"rail {r}" for r in range(8)]
    graph_shot("bars")
    # Clicking a bar zooms into that leaf group's GPUs.
    page.evaluate(
        "() => window.topoweb.zoomTo(window.topoweb.client.group_x0[0] - 2, window.topoweb.client.group_x1[0] + 2)"
    )
    page.wait_for_selector("#cluster-graph[data-aggregate='0']")
    graph_shot("zoomed-rails")


def test_measured_nic_counters_replace_the_predicted_link_load(laptop, live_server, scenario):
    from django.utils import timezone

    from apps.metrics.models import NicLatest
    from apps.topology.models import Node

    now = timezone.now()
    # Every NIC of leaf-1's nodes sends 20 GB/s.
    for node in Node.objects.filter(cluster=scenario["pod"], leaf__name="leaf-1"):
        for nic in node.nics.all():
            NicLatest.objects.create(node=node, device=nic.name, port="1", at=now, tx_Bps=20e9)
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    page.wait_for_selector("#cluster-graph:not([data-measured-nics='0'])[data-measured-nics]")
    page.check("input[name=source][value=measured]")
    page.wait_for_selector("#cluster-graph[data-source='measured']")
    seg, cables = page.evaluate(
        """() => { const l = window.topoweb.client.links;
          const t = l.a.findIndex((a, i) => i >= l.n_uplinks && l.switches[l.b[i]] === 'leaf-1');
          return [l.seg[t], l.trunk_cables[t - l.n_uplinks]]; }"""
    )
    text = hover_at(page, (seg[0] + seg[2]) / 2, (seg[1] + seg[3]) / 2)
    assert f"load {20 * cables} GB/s" in text and "(measured)" in text
    page.check("input[name=overlay][value=load]")
    expect(page.locator("#graph-status")).to_contain_text("measured from NIC counters")
