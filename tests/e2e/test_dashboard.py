"""The dashboard in Chromium: graph, overlays, highlight, aggregation, queue, job page,
migrations, topology import and login."""

from __future__ import annotations

import re

from playwright.sync_api import expect

GRAPH_DRAWN = "#cluster-graph[data-rendered='1']"
# Count of GPU markers across the free and per-job traces of the drawn plotly div.
GPU_COUNT_JS = """() => document.getElementById('cluster-graph').data
  .filter(t => t.meta && ['gpu-free', 'gpu-job'].includes(t.meta.role))
  .reduce((n, t) => n + t.x.length, 0)"""
VISIBLE_ROLES_JS = """() => [...new Set(document.getElementById('cluster-graph').data
  .filter(t => t.visible !== false).map(t => t.meta.role))].sort()"""


def open_cluster(page, live_server, name):
    page.goto(f"{live_server.url}/clusters/{name}/")
    page.wait_for_selector(GRAPH_DRAWN)


def test_login_then_logout_with_a_post(page, live_server, scenario, login, shot):
    page.goto(f"{live_server.url}/queue/")
    assert "/accounts/login/" in page.url
    shot("login")
    login("alice")
    expect(page.locator(".topbar .user")).to_contain_text("alice")
    page.click("text=Log out")
    page.wait_for_url(re.compile(r".*/accounts/login/.*"))
    expect(page.locator("h1")).to_have_text("Log in to TopoWeb")


def test_cluster_graph_draws_every_gpu_with_a_legend_of_jobs(page, live_server, scenario, login, shot):
    login("ops")
    open_cluster(page, live_server, "pod-256")
    assert page.evaluate(GPU_COUNT_JS) == 256
    names = page.evaluate(
        "() => document.getElementById('cluster-graph').data"
        ".filter(t => t.meta.role === 'gpu-job').map(t => t.name)"
    )
    assert len(names) == 4 and any("llm-tp8-pp2 (alice)" in n for n in names)
    assert (
        page.evaluate(
            "() => document.getElementById('cluster-graph').data.find(t => t.meta.role === 'gpu-free').name"
        )
        == "free (136)"  # 256 - 64 - 32 - 16 - 8
    )
    expect(page.locator(".legend")).to_contain_text("llm-tp8-pp2")
    # Hover text is built in the browser: node, GPU, job, rank and its groups with level and bottleneck.
    hover = page.evaluate(
        "() => { const t = document.getElementById('cluster-graph').data"
        ".find(t => t.meta.role === 'gpu-job' && t.name.includes('llm-tp8-pp2')); return t.text[0]; }"
    )
    assert re.search(r"node-\d+</b> · GPU \d · mlx5_\d → leaf-\d", hover)
    # Rank 0's TP group as the placement priced it (where it sits is the solver's choice: this job
    # declares as much DP traffic as TP, and TP split 4 + 4 over two nodes may be the cheaper).
    tp0 = next(
        g
        for g in scenario["jobs"]["llm-tp8-pp2"].predicted["groups"]
        if g["group"] == "tp" and 0 in g["ranks"]
    )
    line = f"TP group 0 (8 ranks): {tp0['level']}, bottleneck {tp0['bottleneck_GBps']:g} GB/s"
    assert "rank 0" in hover and line in hover, (line, hover)
    shot("cluster-placement")


def test_each_overlay_switches_the_graph_client_side(page, live_server, scenario, login, shot):
    login("ops")
    open_cluster(page, live_server, "pod-256")
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    for overlay in ("mfu", "util", "comm", "load", "placement"):
        page.check(f"input[name=overlay][value={overlay}]")
        page.wait_for_selector(f"#cluster-graph[data-overlay='{overlay}']")
        roles = page.evaluate(VISIBLE_ROLES_JS)
        metric = overlay in ("mfu", "util", "comm")
        assert ("gpu-metric" in roles) is metric
        assert ("gpu-job" in roles) is not metric
        if metric:
            colors = page.evaluate(
                "() => document.getElementById('cluster-graph').data"
                ".find(t => t.meta.role === 'gpu-metric').marker.color"
            )
            assert colors == page.evaluate(f"() => window.topoweb.client.metrics['{overlay}']")
            expect(page.locator(".colorbar")).to_contain_text("(predicted)")
        # Every switch link and NIC bundle lands in one load bucket, drawn with the bucket's width.
        assert ("load" in roles) is (overlay == "load")
        assert ("trunk" in roles) is (overlay != "load")
        if overlay == "load":
            drawn = page.evaluate(
                "() => document.getElementById('cluster-graph').data.filter(t => t.meta.role === 'load')"
                ".reduce((n, t) => n + t.x.length / 3, 0)"
            )
            assert drawn == page.evaluate("() => window.topoweb.client.links.cap.length")
        shot(f"cluster-overlay-{overlay}")
    # Overlays switch without asking the server (the page's change and measurement polls aside).
    assert [u for u in requests if "/version/" not in u and "/measured/" not in u] == []


def test_clicking_a_gpu_highlights_its_job_and_the_links_it_crosses(page, live_server, scenario, login, shot):
    login("ops")
    open_cluster(page, live_server, "pod-256")
    job = scenario["jobs"]["spread-naive"]
    # Pixel position of the job's first GPU in the plot.
    x, y = page.evaluate(
        """(id) => { const gd = document.getElementById('cluster-graph'), c = window.topoweb.client;
          const j = c.jobs.find(j => j.id === id), g = j.gids[0], fl = gd._fullLayout;
          const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
          return [r.left + fl.xaxis.l2p(c.gpu_x[g]), r.top + fl.yaxis.l2p(c.gpu_y[g])]; }""",
        job.pk,
    )
    page.mouse.move(x, y)
    page.wait_for_selector(".hovertext")
    expect(page.locator(".hovertext").first).to_contain_text("spread-naive")
    page.mouse.click(x, y)
    page.wait_for_selector(f"#cluster-graph[data-highlight='{job.pk}']")
    hl = page.evaluate(
        """() => { const d = document.getElementById('cluster-graph').data, c = window.topoweb.client;
          const j = c.jobs.find(j => j.id === Number(document.getElementById('cluster-graph').dataset.highlight));
          const nodes = new Set(j.gids.map(g => c.gpu_node[g])).size;
          return [d.find(t => t.meta.role === 'hl-outline').x.length, 6 * nodes,
                  d.find(t => t.meta.role === 'hl-links').x.length]; }"""
    )
    # The job is outlined node by node (one box per node, not a ring per GPU) ...
    assert hl[0] == hl[1] > 0
    assert hl[2] > 0  # its groups cross NIC cables
    # ... and everything else is dimmed: the other jobs, the free GPUs and the cables.
    opacity = page.evaluate(
        """() => document.getElementById('cluster-graph').data
          .filter(t => ['gpu-job', 'gpu-free', 'trunk'].includes(t.meta.role))
          .map(t => [t.name, t.meta.role, t.marker ? t.marker.opacity : t.opacity])"""
    )
    mine = [o for name, role, o in opacity if role == "gpu-job" and "spread-naive" in name]
    others = [o for name, role, o in opacity if not (role == "gpu-job" and "spread-naive" in name)]
    assert mine == [1]
    assert others and all(o < 0.5 for o in others)
    expect(page.locator("#job-panel")).to_contain_text("spread-naive")
    shot("cluster-highlight")
    # Picking "no job" clears the highlight.
    page.select_option("#job-select", "")
    page.wait_for_selector("#cluster-graph[data-highlight='']")


def test_another_users_jobs_are_anonymous(page, live_server, scenario, login):
    login("bob")
    open_cluster(page, live_server, "pod-256")
    labels = page.evaluate("() => window.topoweb.client.jobs.map(j => j.label)")
    alice = [lab for lab in labels if "other user" in lab]
    assert len(alice) == 2 and not any("alice" in lab for lab in labels)
    text = page.evaluate(
        "() => document.getElementById('cluster-graph').data"
        ".filter(t => t.meta.role === 'gpu-job' && t.name.includes('other user')).flatMap(t => t.text)"
    )
    assert text and all("rank" not in s for s in text)


def test_a_large_cluster_aggregates_per_leaf_until_zoomed_in(page, live_server, scenario, login, shot):
    from apps.topology.services import cluster_import

    cluster_import(
        data={
            "version": 1,
            "name": "wide-200",
            "generate": {
                "shape": "leaf-spine",
                "spines": 4,
                "leaves": 10,
                "nodes_per_leaf": 20,
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
    login("ops")
    open_cluster(page, live_server, "wide-200")
    assert page.evaluate(GPU_COUNT_JS) == 1600
    assert page.get_attribute("#cluster-graph", "data-aggregate") == "1"
    roles = page.evaluate(VISIBLE_ROLES_JS)
    assert "agg" in roles and "gpu-free" not in roles
    shot("cluster-aggregate")
    page.evaluate("() => Plotly.relayout('cluster-graph', {'xaxis.range': [0, 200]})")
    page.wait_for_selector("#cluster-graph[data-aggregate='0']")
    roles = page.evaluate(VISIBLE_ROLES_JS)
    assert "gpu-free" in roles and "agg" not in roles
    shot("cluster-zoomed")


def test_queue_filters_and_refreshes_itself(page, live_server, scenario, login, shot):
    login("alice")
    page.goto(f"{live_server.url}/queue/?refresh=2")
    rows = page.locator("#queue-rows tbody tr")
    expect(rows).to_have_count(6)
    waiting = page.locator("tr", has_text="waits-for-240")
    expect(waiting).to_contain_text("queued")
    expect(waiting.locator("td.reason")).to_contain_text("needs 240 GPUs")
    expect(page.locator("tr", has_text="bob-dp32")).to_have_count(0)  # other users' jobs are anonymous
    shot("queue")
    page.check("input[name=status][value=queued]")
    page.click("button:has-text('Filter')")
    expect(rows).to_have_count(1)
    before = page.get_attribute("#queue-table", "data-refreshed")
    page.wait_for_function(
        "(b) => document.getElementById('queue-table').dataset.refreshed !== b", arg=before
    )
    expect(rows).to_have_count(1)


def test_job_page_shows_ranks_groups_predictions_and_every_policy(page, live_server, scenario, login, shot):
    job = scenario["jobs"]["bert-large-16"]
    login("alice")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-mfu[data-rendered='1']")
    page.wait_for_selector("#chart-whatif[data-rendered='1']")
    expect(page.locator("#rank-grid tbody tr")).to_have_count(2)
    expect(page.locator("#group-table")).to_contain_text("leaf")
    expect(page.locator("#step-table")).to_contain_text("209 ms")
    expect(page.locator("#step-table")).to_contain_text("no measurements")
    expect(page.locator("#whatif-table tbody tr")).to_have_count(5)
    expect(page.locator("#whatif-table tr[data-policy=topo]")).to_contain_text("dp: nvlink")
    predicted = page.evaluate("() => document.getElementById('chart-mfu').data.map(t => t.name)")
    assert predicted == ["predicted"]
    for label in ("Open MPI appfile", "Slurm script", "Slurm hostfile", "torchrun"):
        expect(page.locator(f"a:has-text('{label}')")).to_have_attribute("href", re.compile("/rankmap/"))
    expect(page.locator("button:has-text('Apply')")).to_have_count(0)  # not staff
    shot("job")


def test_staff_applies_a_migration_from_the_job_page(page, live_server, scenario, login, shot):
    job = scenario["jobs"]["bert-large-16"]
    login("ops")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    row = page.locator("#proposal-table tbody tr").first
    expect(row).to_contain_text("proposed")
    shot("job-proposal")
    row.locator("button:has-text('Apply')").click()
    page.wait_for_load_state()
    expect(page.locator(".messages")).to_contain_text("applied")
    expect(page.locator("#proposal-table tbody tr").first).to_contain_text("applied")
    expect(page.locator("#step-table")).to_contain_text("103 ms")
    # After the move each node holds one DP group: ranks 0-7 on one node.
    first = page.locator("#rank-grid tbody tr").first.locator("td")
    assert [first.nth(i).inner_text() for i in range(8)] in (
        [str(r) for r in range(8)],
        [str(r) for r in range(8, 16)],
    )
    shot("job-migrated")


def test_topology_import_shows_field_errors_then_previews_and_imports(
    page, live_server, scenario, login, shot
):
    from .import_specs import BROKEN, FIXED

    login("ops")
    page.goto(f"{live_server.url}/import/")
    page.fill("#id_text", BROKEN)
    page.click("button[value=preview]")
    errors = page.locator("#spec-errors")
    expect(errors).to_contain_text("nodes[0].nics[0].leaf")
    expect(errors).to_contain_text("unknown leaf switch 'leaf-9'")
    shot("import-errors")
    page.fill("#id_text", FIXED)
    page.click("button[value=preview]")
    page.wait_for_selector(GRAPH_DRAWN)
    assert page.evaluate(GPU_COUNT_JS) == 8
    shot("import-preview")
    page.click("button[value=import]")
    page.wait_for_url(f"{live_server.url}/clusters/lab-2/")
    page.wait_for_selector(GRAPH_DRAWN)
    expect(page.locator(".messages")).to_contain_text("Imported cluster lab-2")
