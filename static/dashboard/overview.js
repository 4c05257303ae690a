// Cluster page start-up: the server-drawn overview is painted with the page; this script then
// loads the plotting library and the graph script after that first paint, removes the overview
// once the graph is drawn, keeps the legend to the jobs in view, and finds a job on the graph.
(function () {
  "use strict";
  const me = document.currentScript;
  const graph = document.getElementById("cluster-graph");
  if (!graph || !me) return;
  const overview = document.getElementById("cluster-overview");
  const timing = { overviewMs: performance.now() };
  window.topowebStart = timing;

  function load(src) {
    return new Promise(function (resolve, reject) {
      const s = document.createElement("script");
      s.src = src;
      s.async = false;
      s.onload = resolve;
      s.onerror = reject;
      document.head.appendChild(s);
    });
  }
  // The library is fetched once the frame showing the overview has begun (the page is parsed):
  // that frame is the first useful paint, at the latest.
  requestAnimationFrame(function () {
    timing.overviewPaintedMs = performance.now();
    timing.loadStart = performance.now();
    load(me.dataset.plotly).then(function () { return load(me.dataset.graph); });
  });

  // ---- the legend of the jobs in view -----------------------------------------------------------
  const list = document.getElementById("view-legend-list");
  const count = document.getElementById("view-legend-count");
  const more = document.getElementById("view-legend-more");
  const LEGEND_ROWS = 24;
  const SVG = "http://www.w3.org/2000/svg";
  const HATCH_IDS = { "/": "fwd", "\\": "back", x: "cross", "-": "hline", "|": "vline", "+": "plus", ".": "dot" };
  function mark(job) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "legend-mark");
    svg.setAttribute("width", "14");
    svg.setAttribute("height", "14");
    svg.setAttribute("aria-hidden", "true");
    const fills = [job.color];
    if (HATCH_IDS[job.hatch]) fills.push("url(#ov-hatch-" + HATCH_IDS[job.hatch] + ")");
    fills.forEach(function (fill) {
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("width", "14");
      r.setAttribute("height", "14");
      r.setAttribute("fill", fill);
      svg.appendChild(r);
    });
    return svg;
  }
  // Jobs with a GPU in the x range, with their GPUs there, most first.
  function jobsInView(tw) {
    const c = tw.client;
    const lo = tw.state.range[0];
    const hi = tw.state.range[1];
    const here = {};
    for (let g = 0; g < c.gpu_job.length; g++) {
      const j = c.gpu_job[g];
      if (j < 0) continue;
      const x = c.gpu_x[g];
      if (x >= lo && x <= hi) here[j] = (here[j] || 0) + 1;
    }
    return Object.keys(here).map(Number).sort(function (a, b) { return here[b] - here[a] || a - b; })
      .map(function (j) { return [j, here[j]]; });
  }
  let shownKey = "";
  function updateLegend() {
    const tw = window.topoweb;
    if (!tw || !list) return;
    const rows = jobsInView(tw);
    const key = tw.state.range.join(",") + "|" + tw.state.job;
    if (key === shownKey) return;
    shownKey = key;
    list.textContent = "";
    rows.slice(0, LEGEND_ROWS).forEach(function (r) {
      const job = tw.client.jobs[r[0]];
      const li = document.createElement("li");
      li.dataset.job = String(r[0]);
      const b = document.createElement("button");
      b.type = "button";
      b.className = "legend-job";
      b.dataset.job = String(r[0]);
      if (tw.state.job === r[0]) b.setAttribute("aria-pressed", "true");
      b.appendChild(mark(job));
      b.appendChild(document.createTextNode(" " + job.label + " "));
      const n = document.createElement("span");
      n.className = "muted";
      n.textContent = r[1] === job.gids.length ? r[1] + " GPUs" : r[1] + " of " + job.gids.length + " GPUs in view";
      b.appendChild(n);
      li.appendChild(b);
      list.appendChild(li);
    });
    if (count) count.textContent = String(rows.length);
    if (more) {
      more.hidden = rows.length <= LEGEND_ROWS;
      more.textContent = "and " + (rows.length - LEGEND_ROWS) + " more jobs in view; zoom in or find a job by id or name";
    }
    graph.dataset.legend = String(rows.length);
  }
  if (list) {
    list.addEventListener("click", function (ev) {
      const b = ev.target.closest("button.legend-job");
      if (b && window.topoweb) window.topoweb.highlight(Number(b.dataset.job));
    });
  }

  // ---- find a job: zoom to its GPUs and highlight it ---------------------------------------------
  const findForm = document.getElementById("find-job");
  const findInput = document.getElementById("find-job-input");
  function findJob(text) {
    const c = window.topoweb.client;
    const q = text.trim().toLowerCase();
    if (!q) return -1;
    const byId = /^(job\s*)?\d+$/.test(q) ? Number(q.replace(/\D/g, "")) : null;
    let best = -1;
    c.jobs.forEach(function (job, j) {
      if (best >= 0) return;
      if (byId !== null && job.id === byId) best = j;
      else if (job.label.toLowerCase() === q) best = j;
    });
    if (best < 0 && byId === null) {
      c.jobs.forEach(function (job, j) { if (best < 0 && job.label.toLowerCase().indexOf(q) >= 0) best = j; });
    }
    return best;
  }
  function showJob(j) {
    const tw = window.topoweb;
    const c = tw.client;
    let x0 = Infinity;
    let x1 = -Infinity;
    // The job's leaf groups whole, so that their leaves and cables are in view too.
    c.jobs[j].gids.forEach(function (g) {
      const grp = c.node_group[c.gpu_node[g]];
      if (c.group_x0[grp] < x0) x0 = c.group_x0[grp];
      if (c.group_x1[grp] > x1) x1 = c.group_x1[grp];
    });
    const pad = Math.max(2, (x1 - x0) * 0.03);
    return tw.zoomTo(x0 - pad, x1 + pad).then(function () {
      return tw.state.job === j ? null : tw.highlight(j);
    });
  }
  if (findForm && findInput) {
    findForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      const status = document.getElementById("graph-status");
      const run = function () {
        const j = findJob(findInput.value);
        if (j < 0) {
          findInput.setCustomValidity("no placed job matches");
          findInput.reportValidity();
          if (status) status.textContent = "No placed job on this cluster matches “" + findInput.value + "”.";
          return null;
        }
        findInput.setCustomValidity("");
        return showJob(j).then(function () { graph.dataset.found = String(window.topoweb.client.jobs[j].id); });
      };
      if (window.topoweb && window.topoweb.drawn) window.topoweb.drawn.then(run);
      else graph.addEventListener("topoweb:drawn", run, { once: true });
    });
    findInput.addEventListener("input", function () { findInput.setCustomValidity(""); });
  }

  // ---- once the graph is drawn ---------------------------------------------------------------------
  function onDrawn() {
    timing.drawnMs = performance.now();
    if (overview) overview.remove();
    graph.on("plotly_afterplot", updateLegend);
    updateLegend();
    graph.dispatchEvent(new CustomEvent("topoweb:drawn"));
  }
  new MutationObserver(function (changes, observer) {
    if (graph.dataset.rendered === "1") {
      observer.disconnect();
      onDrawn();
    }
  }).observe(graph, { attributes: true, attributeFilter: ["data-rendered"] });
})();
