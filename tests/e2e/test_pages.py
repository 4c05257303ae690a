"""The operator's pages in Chromium: node page, search, queue sorting and history, keyboard
navigation, the cluster graph on a 1366x768 laptop, the dark theme and the status explanations.

The tests that pass `laptop_shot` save pages-*.png at 1366x768: into docs/screenshots/ with
TOPOWEB_SCREENSHOTS=1 (the images the docs show), otherwise into test-artifacts/e2e/."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from .conftest import screenshot_folder

LAPTOP = {"width": 1366, "height": 768}
GRAPH_DRAWN = "#cluster-graph[data-rendered='1']"
# Page y (CSS px from the top of the document) of the lowest and highest GPU marker drawn.
GPU_ROWS_JS = """() => {
  const gd = document.getElementById('cluster-graph');
  const ys = gd.data.filter(t => t.meta && ['gpu-free', 'gpu-job'].includes(t.meta.role))
    .flatMap(t => Array.from(t.y));
  const ya = gd._fullLayout.yaxis, top = gd.getBoundingClientRect().top + window.scrollY;
  const px = y => top + gd._fullLayout._size.t + ya.l2p(y);
  return {lowest: px(Math.min(...ys)), highest: px(Math.max(...ys)), count: ys.length};
}"""
FOCUS_JS = """() => { const el = document.activeElement; const s = getComputedStyle(el);
  return {tag: el.tagName, id: el.id, text: (el.textContent || '').trim().slice(0, 40),
          outline: s.outlineStyle, width: parseFloat(s.outlineWidth)}; }"""


@pytest.fixture
def laptop(page):
    """`page` at a 1366x768 laptop viewport."""
    page.set_viewport_size(LAPTOP)
    return page


@pytest.fixture
def laptop_shot(laptop):
    """Save the viewport (1366x768, what a laptop shows without scrolling) as
    docs/screenshots/pages-NAME.png."""

    def _shot(name: str) -> Path:
        path = screenshot_folder() / f"pages-{name}.png"
        laptop.screenshot(path=str(path))
        return path

    return _shot


def test_node_page_shows_gpus_nics_leaf_jobs_and_health(laptop, live_server, scenario, login, laptop_shot):
    from apps.scheduling.models import Allocation

    job = scenario["jobs"]["llm-tp8-pp2"]
    node = Allocation.objects.filter(job=job, live=True, rank=0).values_list("node_name", flat=True).get()
    login("ops")
    laptop.goto(f"{live_server.url}/jobs/{job.pk}/")
    # Node names on the job page lead to the node page.
    laptop.locator("#rank-grid").get_by_role("link", name=node, exact=True).click()
    laptop.wait_for_url(f"**/clusters/pod-256/nodes/{node}/")
    expect(laptop.locator("h1")).to_have_text(f"Node {node}")
    gpus = laptop.locator("#node-gpus tbody tr")
    expect(gpus).to_have_count(8)
    expect(gpus.first).to_contain_text("llm-tp8-pp2")
    expect(laptop.locator("#node-nics tbody tr")).to_have_count(8)
    expect(laptop.locator("#node-nics")).to_contain_text("50 GB/s")
    expect(laptop.locator("#node-jobs")).to_contain_text("0-7")
    laptop_shot("node")
    # An operator drains the node from its page and comes back to it.
    laptop.fill("#drain-form input[name=reason]", "replace a NIC cable")
    laptop.click("#drain-form button")
    laptop.wait_for_url(f"**/clusters/pod-256/nodes/{node}/")
    expect(laptop.locator("#node-state")).to_have_text(re.compile("draining|drained"))
    expect(laptop.locator("#node-reason")).to_have_text("replace a NIC cable")
    laptop.click("#resume-form button")
    # Back in service; no agent ever reported from it, so it is not called up.
    expect(laptop.locator("#node-state")).to_have_text("no agent")
    # Its leaf links to the switch page, which lists the node.
    laptop.locator(".page-head").get_by_role("link", name=re.compile(r"^leaf-")).first.click()
    expect(laptop.locator("#switch-nodes")).to_contain_text(node)
    assert laptop.goto(f"{live_server.url}/clusters/pod-256/nodes/no-such-node/").status == 404


def test_search_suggests_by_keyboard_and_exact_names_jump(laptop, live_server, scenario, login, laptop_shot):
    login("ops")
    laptop.goto(f"{live_server.url}/queue/")
    box = laptop.locator("#search-q")
    box.fill("llm")
    options = laptop.locator("#search-suggestions [role=option]")
    expect(options.first).to_contain_text("llm-tp8-pp2")
    expect(box).to_have_attribute("aria-expanded", "true")
    laptop_shot("search")
    box.press("ArrowDown")
    expect(options.first).to_have_attribute("aria-selected", "true")
    box.press("Enter")
    laptop.wait_for_url(f"**/jobs/{scenario['jobs']['llm-tp8-pp2'].pk}/")
    # Without choosing a suggestion: an exact node name jumps straight to the node page.
    laptop.fill("#search-q", "node-003")
    expect(options.first).to_contain_text("node node-003 (pod-256)")
    laptop.press("#search-q", "Escape")
    expect(laptop.locator("#search-suggestions")).to_be_hidden()
    expect(box).to_have_value("node-003")
    laptop.press("#search-q", "Enter")
    laptop.wait_for_url("**/clusters/pod-256/nodes/node-003/", wait_until="domcontentloaded")
    expect(laptop.locator("h1")).to_have_text("Node node-003")
    # A partial name lists every kind that matches.
    laptop.goto(f"{live_server.url}/search/?q=leaf")
    results = laptop.locator("#search-results li")
    expect(results.first).to_have_attribute("data-kind", "switch")
    assert results.count() >= 5  # pod-256's four leaves and case-4-4's


def test_queue_sorts_by_column_and_shows_finished_history(laptop, live_server, scenario, login, laptop_shot):
    from django.utils import timezone

    from apps.scheduling import services
    from apps.scheduling.models import Job

    done = scenario["jobs"]["bob-dp8"]
    services.job_complete(job=done)
    Job.objects.filter(pk=done.pk).update(finished_at=timezone.now() - timedelta(hours=3))
    login("ops")
    laptop.goto(f"{live_server.url}/queue/")
    gpus_header = laptop.locator("th[data-sort=gpus]")
    expect(gpus_header).not_to_have_attribute("aria-sort", re.compile(".*"))
    gpus_header.get_by_role("link").focus()
    laptop.keyboard.press("Enter")
    laptop.wait_for_url("**/queue/?sort=gpus")
    expect(laptop.locator("th[data-sort=gpus]")).to_have_attribute("aria-sort", "ascending")
    counts = [int(t) for t in laptop.locator("#queue-rows tbody td:nth-child(6)").all_inner_texts()]
    assert counts == sorted(counts) and len(counts) >= 4
    laptop.locator("th[data-sort=gpus] a").click()
    expect(laptop.locator("th[data-sort=gpus]")).to_have_attribute("aria-sort", "descending")
    counts = [int(t) for t in laptop.locator("#queue-rows tbody td:nth-child(6)").all_inner_texts()]
    assert counts == sorted(counts, reverse=True)
    # History: the finished job shows in the last 24 hours, not in the last hour.
    laptop.click("a[data-range='24h']")
    expect(laptop.locator(f"#queue-rows tr[data-job='{done.pk}']")).to_contain_text("completed")
    expect(laptop.locator("#queue-rows tbody tr")).to_have_count(1)
    laptop_shot("queue-history")
    laptop.click("a[data-range='1h']")
    expect(laptop.locator("#queue-table")).to_contain_text("No jobs match")


def test_every_control_is_reachable_by_keyboard_with_a_visible_focus(laptop, live_server, scenario, login):
    login("ops")
    laptop.goto(f"{live_server.url}/queue/")
    laptop.keyboard.press("Tab")
    first = laptop.evaluate(FOCUS_JS)
    assert first["text"] == "Skip to content" and first["outline"] != "none" and first["width"] >= 2
    expect(laptop.locator(".skip-link")).to_be_in_viewport()
    # Tab on through the header: every control gets focus, each with a visible ring.
    reached = []
    for _ in range(12):
        laptop.keyboard.press("Tab")
        focus = laptop.evaluate(FOCUS_JS)
        assert focus["outline"] != "none" and focus["width"] >= 2, focus
        reached.append(focus["id"] or focus["text"])
    for control in ("Queue", "Simulations", "search-q", "cluster-picker", "Log out"):
        assert control in reached, (control, reached)
    # The skip link moves the focus past the header, to the page's content.
    laptop.goto(f"{live_server.url}/queue/")
    laptop.keyboard.press("Tab")
    laptop.keyboard.press("Enter")
    assert laptop.evaluate("() => document.activeElement.id") == "main"
    laptop.keyboard.press("Tab")
    assert laptop.evaluate("() => document.activeElement.closest('main') !== null")
    # The cluster picker does not leave the page while arrowing through it; Enter goes.
    laptop.focus("#cluster-picker")
    laptop.keyboard.press("ArrowDown")
    assert "/clusters/" not in laptop.url
    laptop.keyboard.press("Enter")
    laptop.wait_for_url(re.compile(r".*/clusters/[^/]+/$"))


def test_graph_gpus_are_above_the_fold_on_a_laptop(laptop, live_server, scenario, login, laptop_shot):
    login("ops")
    laptop.goto(f"{live_server.url}/clusters/pod-256/")
    laptop.wait_for_selector(GRAPH_DRAWN)
    rows = laptop.evaluate(GPU_ROWS_JS)
    assert rows["count"] == 256
    header = laptop.locator(".topbar").bounding_box()
    assert header["height"] <= 48
    # Every GPU row, markers whole (a few px each side of the centre), within the first screen.
    assert header["height"] < rows["highest"] <= rows["lowest"] + 6 <= LAPTOP["height"], rows
    laptop_shot("cluster-laptop")


def test_dark_theme_follows_the_system_setting(laptop, live_server, scenario, login, laptop_shot):
    login("ops")
    laptop.goto(f"{live_server.url}/queue/")
    light = laptop.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert light == "rgb(245, 247, 249)"
    laptop.emulate_media(color_scheme="dark")
    dark = laptop.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert dark == "rgb(18, 24, 29)"
    fg = laptop.evaluate("() => getComputedStyle(document.body).color")
    assert fg == "rgb(227, 233, 238)"
    # The variables the graphs read are defined on :root.
    accent = laptop.evaluate(
        "() => getComputedStyle(document.documentElement).getPropertyValue('--accent').trim()"
    )
    assert accent == "#82b6f5"
    laptop.goto(f"{live_server.url}/clusters/pod-256/")
    laptop.wait_for_selector(GRAPH_DRAWN)
    laptop_shot("cluster-dark")
    # The job page's charts take the theme's text colour on a transparent background.
    laptop.goto(f"{live_server.url}/jobs/{scenario['jobs']['llm-tp8-pp2'].pk}/")
    laptop.wait_for_selector("#chart-mfu[data-rendered='1']")
    layout = laptop.evaluate(
        "() => { const l = document.getElementById('chart-mfu')._fullLayout;"
        " return [l.paper_bgcolor, l.font.color]; }"
    )
    assert layout == ["rgba(0, 0, 0, 0)", "#e3e9ee"], layout
    laptop_shot("job-dark")
    laptop.emulate_media(color_scheme="light")


def test_statuses_are_explained_where_they_are_shown(laptop, live_server, scenario, login, laptop_shot):
    from apps.scheduling.choices import JOB_STATUS_HELP

    login("alice")
    laptop.goto(f"{live_server.url}/queue/")
    waiting = laptop.locator("#queue-rows tr", has_text="waits-for-240").locator(".badge")
    expect(waiting).to_have_attribute("title", JOB_STATUS_HELP["queued"])
    glossary = laptop.locator("#glossary-job")
    for status, text in JOB_STATUS_HELP.items():
        expect(glossary.locator(f"#status-job-{status}")).to_contain_text(text)
    # The badge leads to its entry in the glossary, which is highlighted.
    waiting.click()
    assert laptop.url.endswith("#status-job-queued")
    expect(laptop.locator("#status-job-queued:target")).to_have_count(1)
    laptop_shot("statuses")
    job = scenario["jobs"]["llm-tp8-pp2"]
    laptop.goto(f"{live_server.url}/jobs/{job.pk}/")
    expect(laptop.locator(".page-head .badge")).to_have_attribute("title", JOB_STATUS_HELP[job.status])


def test_api_docs_link_back_and_show_example_bodies(laptop, live_server, scenario, login, laptop_shot):
    login("alice")
    laptop.goto(f"{live_server.url}/api/docs/")
    path = laptop.locator(".opblock-summary-path[data-path='/api/v1/jobs/']")
    submit = laptop.locator(".opblock.opblock-post", has=path)
    submit.locator(".opblock-summary").click()
    # The request body's example is the first one given: the seed's BERT-Large job.
    expect(submit.locator(".opblock-section-request-body")).to_contain_text("bert-large-16")
    expect(submit.locator(".opblock-section-request-body")).to_contain_text("Megatron")
    laptop_shot("api-docs")
    laptop.click("#back-to-site")
    laptop.wait_for_url(re.compile(r".*/(clusters/[^/]+/)?$"))
