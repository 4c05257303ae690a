"""The cluster page's start: the server-drawn overview painted before the plotting library loads,
the legend of the jobs in view, and "find job" zooming to a job and highlighting it."""

from __future__ import annotations

from playwright.sync_api import expect

from .conftest import screenshot_folder
from .test_cluster_graph import GRAPH_DRAWN, open_cluster


def test_the_overview_shows_before_plotly_loads_and_gives_way_to_the_graph(laptop, live_server, scenario):
    page = laptop()
    held: list = []
    # Hold the plotting library back: the page must be useful without it.
    page.route("**/plotly*.js", lambda route: held.append(route))
    # The page's load event waits for the held script: wait for the parsed document only.
    page.goto(f"{live_server.url}/clusters/pod-256/", wait_until="domcontentloaded")
    overview = page.locator("#overview-svg")
    expect(overview).to_be_visible()
    # Four leaf groups, a bundle each with its load; the two spines; the four placed jobs' bars.
    expect(page.locator("#overview-svg line.ov-bundle")).to_have_count(4)
    expect(page.locator("#overview-svg rect.ov-switch")).to_have_count(2)
    jobs = page.locator("#overview-svg rect.ov-bar:not([data-job^='-'])")
    assert jobs.count() >= 4
    expect(page.locator("#view-legend-list li")).to_have_count(4)
    page.screenshot(path=str(screenshot_folder() / "graph-overview.png"))
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(screenshot_folder() / "graph-overview-dark.png"))
    page.emulate_media(color_scheme="light")
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
    page.screenshot(path=str(screenshot_folder() / "graph-find-job.png"))
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


def test_zoomed_out_each_leaf_group_has_one_uplink_bundle_with_its_load(
    laptop, live_server, transactional_db
):
    from django.contrib.auth import get_user_model

    from apps.api.roles import role_grant
    from apps.scheduling import services
    from apps.scheduling.models import Job
    from apps.topology.services import cluster_import

    from .conftest import PASSWORD, _job

    ops = get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    role_grant(user=ops, role="admin")
    gen = {"shape": "rail-optimized", "spines": 8, "leaves": 64, "nodes_per_leaf": 32, "gpus_per_node": 8}
    gen.update(gpu_model="H100", peak_tflops=989, nvlink_bw_GBps=450, nic_bw_GBps=50, nics_per_node=8)
    cluster = cluster_import(
        data={"version": 1, "name": "rail-2048", "generate": {**gen, "uplink_bw_GBps": 400}}
    )
    # 512 GPUs: more than one scalable unit, so its traffic crosses the spines.
    services.job_submit(user=ops, spec=_job("big-512", 512, tp=8), cluster=cluster)
    services.schedule_cluster(cluster=cluster)
    for job in Job.objects.filter(status="placing"):
        services.job_start(job=job)
    page = laptop()
    open_cluster(page, live_server, "rail-2048")
    groups = page.evaluate("() => window.topoweb.client.group_names.length")
    page.wait_for_selector(f"#cluster-graph[data-aggregate='1'][data-bundles='{groups}']")
    drawn = page.evaluate(
        """() => { const gd = document.getElementById('cluster-graph');
          const up = gd.data.find(t => t.meta.role === 'uplink');
          const hover = gd.data.find(t => t.meta.role === 'link');
          const c = window.topoweb.client;
          const starts = up.y.filter((y, k) => k % 3 === 0);
          return {segments: starts.filter(y => y === c.y_leaf).length, text: hover.text,
                  cables: window.topoweb.client.links.n_uplinks}; }"""
    )
    assert drawn["segments"] == groups < drawn["cables"]
    assert len(drawn["text"]) == groups
    assert all("leaf uplinks in one bundle" in t and "GB/s" in t for t in drawn["text"])
    assert any("load 0 GB/s" not in t for t in drawn["text"])  # the big job's traffic shows
    page.screenshot(path=str(screenshot_folder() / "graph-bundles.png"))
    # Under the link-load overlay the bundles are coloured by their group's share.
    page.check("input[name=overlay][value=load]")
    page.wait_for_selector("#cluster-graph[data-overlay='load']")
    loaded = page.evaluate(
        "() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'load')"
        ".reduce((n, t) => n + t.x.filter(x => x === null).length, 0)"
    )
    assert loaded == groups
    # Zoomed in, the cables are drawn one by one again.
    page.evaluate(
        "() => window.topoweb.zoomTo(window.topoweb.client.group_x0[0] - 2, window.topoweb.client.group_x1[0] + 2)"
    )
    page.wait_for_selector("#cluster-graph[data-aggregate='0'][data-bundles='0']")
