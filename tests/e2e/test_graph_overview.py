"""The cluster page's start: the server-drawn overview painted before the plotting library loads,
the legend of the jobs in view, and "find job" zooming to a job and highlighting it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .test_cluster_graph import GRAPH_DRAWN, open_cluster


@pytest.fixture
def laptop(page, login):
    """Staff signed in on a 1366x768 page (once the scenario's users exist)."""

    def _open():
        page.set_viewport_size({"width": 1366, "height": 768})
        login("ops")
        return page

    return _open


def test_the_overview_shows_before_plotly_loads_and_gives_way_to_the_graph(laptop, live_server, scenario):
    page = laptop()
    held: list = []
    # Hold the plotting library back: the page must be useful without it.
    page.route("**/plotly*.js", lambda route: held.append(route))
    page.goto(f"{live_server.url}/clusters/pod-256/")
    overview = page.locator("#overview-svg")
    expect(overview).to_be_visible()
    # Four leaf groups, a bundle each with its load; the two spines; the four placed jobs' bars.
    expect(page.locator("#overview-svg line.ov-bundle")).to_have_count(4)
    expect(page.locator("#overview-svg rect.ov-switch")).to_have_count(2)
    jobs = page.locator("#overview-svg rect.ov-bar:not([data-job^='-'])")
    assert jobs.count() >= 4
    expect(page.locator("#view-legend-list li")).to_have_count(4)
    assert page.get_attribute("#cluster-graph", "data-rendered") is None
    page.wait_for_function("() => document.querySelector('script[src*=plotly]') !== null")
    for route in held:
        route.continue_()
    page.unroute("**/plotly*.js")
    page.wait_for_selector(GRAPH_DRAWN)
    expect(page.locator("#cluster-overview")).to_have_count(0)


def test_find_job_zooms_to_it_and_highlights_it(laptop, live_server, scenario):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    job = scenario["jobs"]["bob-dp8"]
    page.fill("#find-job-input", "bob-dp8")
    page.click("#find-job button[type=submit]")
    page.wait_for_selector(f"#cluster-graph[data-found='{job.pk}'][data-highlight='{job.pk}']")
    view = page.evaluate(
        """(id) => { const tw = window.topoweb, c = tw.client, j = c.jobs.findIndex(x => x.id === id);
          const xs = c.jobs[j].gids.map(g => c.gpu_x[g]);
          return {range: tw.state.range, lo: Math.min(...xs), hi: Math.max(...xs), full: c.node_x1[c.node_x1.length - 1],
                  picked: tw.state.job === j}; }""",
        job.pk,
    )
    assert view["picked"]
    assert view["range"][0] <= view["lo"] and view["hi"] <= view["range"][1]
    assert view["range"][1] - view["range"][0] < view["full"] / 2  # zoomed in on it
    # Its legend entry is marked; by id works too, and a job that is not there says so.
    expect(page.locator("#view-legend-list button[data-job][aria-pressed='true']")).to_contain_text("bob-dp8")
    other = scenario["jobs"]["llm-tp8-pp2"]
    page.fill("#find-job-input", str(other.pk))
    page.click("#find-job button[type=submit]")
    page.wait_for_selector(f"#cluster-graph[data-found='{other.pk}'][data-highlight='{other.pk}']")
    page.fill("#find-job-input", "no-such-job")
    page.click("#find-job button[type=submit]")
    expect(page.locator("#graph-status")).to_contain_text("No placed job on this cluster matches")


def test_the_legend_lists_the_jobs_in_view_with_their_colour(laptop, live_server, scenario):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    page.wait_for_selector("#cluster-graph[data-legend='4']")
    # Zoom to the first leaf's nodes: only the jobs with GPUs there stay in the legend.
    expected = page.evaluate(
        """() => { const c = window.topoweb.client, x0 = c.node_x0[0], x1 = c.node_x1[7];
          const here = new Set(); c.gpu_job.forEach((j, g) => { if (j >= 0 && c.gpu_x[g] >= x0 - 0.5 && c.gpu_x[g] <= x1 + 0.5) here.add(c.jobs[j].label); });
          return [...here].sort(); }"""
    )
    assert 0 < len(expected) < 4
    page.evaluate(
        "() => window.topoweb.zoomTo(window.topoweb.client.node_x0[0] - 0.5, window.topoweb.client.node_x1[7] + 0.5)"
    )
    page.wait_for_selector(f"#cluster-graph[data-legend='{len(expected)}']")
    labels = page.locator("#view-legend-list li").all_text_contents()
    assert sorted(label.split(" GPUs")[0].rsplit(" ", 1)[0].strip() for label in labels) == expected
    colors = page.evaluate(
        """() => [...document.querySelectorAll('#view-legend-list li')].map(li =>
          [li.querySelector('rect').getAttribute('fill'), window.topoweb.client.jobs[Number(li.dataset.job)].color])"""
    )
    assert all(a == b for a, b in colors)
    # A click on an entry highlights the job.
    first = page.locator("#view-legend-list button").first
    index = first.get_attribute("data-job")
    first.click()
    job_id = page.evaluate("(j) => window.topoweb.client.jobs[j].id", int(index))
    page.wait_for_selector(f"#cluster-graph[data-highlight='{job_id}']")


def test_spines_and_their_cables_stay_in_view_when_zoomed_in(laptop, live_server, scenario):
    page = laptop()
    open_cluster(page, live_server, "pod-256")
    page.evaluate(
        "() => window.topoweb.zoomTo(window.topoweb.client.node_x0[0] - 0.5, window.topoweb.client.node_x1[3] + 0.5)"
    )
    page.wait_for_selector("#cluster-graph[data-aggregate='0']")
    drawn = page.evaluate(
        """() => { const gd = document.getElementById('cluster-graph'), c = window.topoweb.client;
          const spines = gd.data.find(t => t.meta.role === 'switch' && t.name === 'spine switches');
          const up = gd.data.find(t => t.meta.role === 'uplink');
          const ends = up.x.filter((x, k) => x !== null && up.y[k] > c.y_leaf + 1e-6);
          return {range: gd._fullLayout.xaxis.range, spines: spines.x, ends: ends}; }"""
    )
    lo, hi = drawn["range"]
    assert len(drawn["spines"]) == 2 and all(lo <= x <= hi for x in drawn["spines"])
    assert drawn["ends"] and all(lo <= x <= hi for x in drawn["ends"])
