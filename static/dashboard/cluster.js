// Cluster graph: draws the figure sent with the page, then switches overlays, aggregates per
// leaf when zoomed out and highlights a job, all client-side (the data is sent once).
(function () {
  "use strict";
  const timing = { scriptStart: performance.now() };

  const METRICS = { mfu: "MFU", util: "GPU utilisation", comm: "Comm share" };
  // Predicted values come with the figure; measured ones are polled (fresh only, with their age).
  const SOURCES = { predicted: "predicted", measured: "measured", diff: "measured − predicted" };
  const graph = document.getElementById("cluster-graph");
  const source = document.getElementById("cluster-data");
  if (!graph || !source) return;
  const payload = JSON.parse(source.textContent);
  const fig = payload.figure;
  const client = payload.client;
  const state = {
    overlay: "placement",
    source: "predicted",
    aggregate: client.n_nodes > client.aggregate_above_nodes,
    job: null,
    range: fig.layout.xaxis.range.slice(),
  };
  // Marker size per x slot (one GPU column), so GPUs stay squares that do not overlap at any zoom.
  const config = { responsive: true, displaylogo: false, scrollZoom: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  const SIZED = { "gpu-free": [0.8, 2, 18], "gpu-job": [0.8, 2, 18], "gpu-metric": [0.8, 2, 18],
    "hl-gpus": [1.2, 4, 24], nic: [0.5, 1.5, 8] };
  const roleIndex = {};
  fig.data.forEach(function (t, i) {
    const role = t.meta && t.meta.role;
    (roleIndex[role] = roleIndex[role] || []).push(i);
  });
  const first = function (role) { return (roleIndex[role] || [])[0]; };
  const busyGids = [];
  client.gpu_job.forEach(function (j, g) { if (j >= 0) busyGids.push(g); });
  let measured = null;

  function metricValues(key) {
    const pred = client.metrics[key];
    if (state.source === "predicted" || !measured) return pred;
    const m = measured.map[key];
    return busyGids.map(function (g, i) {
      const v = m[g];
      const p = pred[i];
      const has = v !== undefined && v !== null;
      if (state.source === "measured") return has ? v : p;
      return has && p !== null ? Math.round((v - p) * 1e4) / 1e4 : null;
    });
  }
  function aggregateValues(key, values) {
    if (state.source === "predicted" || !measured) return client.aggregate[key];
    const sum = {};
    const count = {};
    busyGids.forEach(function (g, i) {
      const v = values[i];
      if (v === null || v === undefined) return;
      const k = client.node_group[client.gpu_node[g]];
      sum[k] = (sum[k] || 0) + v;
      count[k] = (count[k] || 0) + 1;
    });
    return client.aggregate[key].map(function (_, k) {
      return count[k] ? Math.round((sum[k] / count[k]) * 1e4) / 1e4 : null;
    });
  }
  function metricTitle(key) { return METRICS[key] + " (" + SOURCES[state.source] + ")"; }
  function scaleFor() {
    return state.source === "diff"
      ? { "marker.colorscale": "RdBu", "marker.cmin": -0.5, "marker.cmax": 0.5 }
      : { "marker.colorscale": "Viridis", "marker.cmin": 0, "marker.cmax": 1 };
  }

  // GPU hover text, built here from compact per-GPU data rather than sent as 16k strings.
  const KINDS = ["tp", "pp", "dp", "ep"];
  const num = function (x, digits) { return String(Number(Number(x).toPrecision(digits))); };
  function gpuText(gid) {
    let s = "<b>" + client.node_names[client.gpu_node[gid]] + "</b> · GPU " + client.gpu_index[gid];
    const nic = client.gpu_nic[gid];
    if (nic >= 0) s += " · " + client.nic_names[client.nic_name[nic]] + " → " + client.leaf_names[client.nic_leaf[nic]];
    const j = client.gpu_job[gid];
    if (j < 0) return s + "<br>free";
    const job = client.jobs[j];
    if (!job.details) return s + "<br>" + job.label;
    const rank = client.gpu_rank[gid];
    s += "<br>" + job.label + " · rank " + rank;
    KINDS.forEach(function (kind) {
      const pos = job.rank_group[kind] ? job.rank_group[kind][rank] : -1;
      if (pos === undefined || pos < 0) return;
      const g = job.groups[kind][pos];
      s += "<br>" + kind.toUpperCase() + " group " + g[0] + " (" + g[1] + " ranks): " + g[2] +
        ", bottleneck " + (g[3] > 0 ? num(g[3], 4) + " GB/s" : "no path") +
        (g[4] === null ? "" : ", " + num(g[4], 3) + " ms/step");
    });
    return s;
  }
  ["gpu-free", "gpu-job", "gpu-metric"].forEach(function (role) {
    (roleIndex[role] || []).forEach(function (i) {
      const t = fig.data[i];
      t.text = t.customdata.map(gpuText);
    });
  });

  function visibleFor(trace) {
    const role = trace.meta && trace.meta.role;
    const agg = state.aggregate;
    const isMetric = Object.prototype.hasOwnProperty.call(METRICS, state.overlay);
    switch (role) {
      case "gpu-free": case "wire": case "domain": case "nic": case "node":
        return !agg;
      case "gpu-job":
        return !agg && !isMetric;
      case "gpu-metric":
        return !agg && isMetric;
      case "agg": case "agg-wire":
        return agg;
      default:
        return true;
    }
  }

  function plotWidthPx() {
    const size = graph._fullLayout && graph._fullLayout._size;
    return size ? size.w : Math.max(300, graph.clientWidth - 340);
  }

  function markerSize(role) {
    const f = SIZED[role];
    const px = plotWidthPx() / Math.max(1e-6, state.range[1] - state.range[0]);
    return Math.round(Math.min(f[2], Math.max(f[1], f[0] * px)) * 10) / 10;
  }

  // Apply overlay and aggregation to the trace objects (before the first draw and on changes).
  function styleTraces() {
    const isLoad = state.overlay === "load";
    const isMetric = Object.prototype.hasOwnProperty.call(METRICS, state.overlay);
    const updates = [];
    fig.data.forEach(function (t, i) {
      const role = t.meta && t.meta.role;
      const u = { visible: visibleFor(t) };
      if (SIZED[role]) u["marker.size"] = markerSize(role);
      if (role === "load") {
        u["line.color"] = isLoad ? t.meta.load_color : "#9aa4ad";
        u["line.width"] = isLoad ? t.meta.load_width : 1;
        u.showlegend = isLoad;
      } else if (role === "gpu-metric" && isMetric) {
        u["marker.color"] = metricValues(state.overlay);
        u["marker.colorbar.title.text"] = metricTitle(state.overlay);
        Object.assign(u, scaleFor());
      } else if (role === "agg") {
        const key = isMetric ? state.overlay : "placement";
        u["marker.color"] = isMetric ? aggregateValues(key, metricValues(key)) : client.aggregate[key];
        u["marker.colorscale"] = isMetric ? "Viridis" : [[0, "#c4c8cc"], [1, "#1f77b4"]];
        u["marker.cmin"] = 0;
        u["marker.cmax"] = 1;
        if (isMetric) Object.assign(u, scaleFor());
        u["marker.showscale"] = true;
        u["marker.colorbar.title.text"] = isMetric ? metricTitle(state.overlay) : "busy share";
      }
      updates.push([i, u]);
    });
    return updates;
  }

  function setPath(obj, path, value) {
    const keys = path.split(".");
    let o = obj;
    for (let k = 0; k < keys.length - 1; k++) {
      o[keys[k]] = o[keys[k]] || {};
      o = o[keys[k]];
    }
    o[keys[keys.length - 1]] = value;
  }

  // Apply every change to the trace objects, then let Plotly.react redraw once (each restyle
  // call would redraw the WebGL layers again).
  function restyleAll() {
    styleTraces().forEach(function (pair) {
      const t = graph.data[pair[0]];
      Object.keys(pair[1]).forEach(function (a) { setPath(t, a, pair[1][a]); });
    });
    return Plotly.react(graph, graph.data, graph.layout, config).then(updateStatus);
  }

  function updateStatus() {
    const el = document.getElementById("graph-status");
    if (!el) return;
    const mode = state.aggregate ? "per-leaf aggregate (zoom in for GPUs)" : "every GPU";
    const job = state.job === null ? "" : " · highlighted: " + client.jobs[state.job].label;
    el.textContent = "View: " + mode + job + " · values: " + sourceText();
    graph.dataset.aggregate = state.aggregate ? "1" : "0";
    graph.dataset.overlay = state.overlay;
    graph.dataset.source = state.source;
  }

  function segmentsFor(job) {
    const xs = [];
    const ys = [];
    job.nics.forEach(function (k) {
      xs.push(client.nic_x[k], client.nic_leaf_x[k], null);
      ys.push(client.y_nic, client.y_leaf, null);
    });
    job.uplinks.forEach(function (i) {
      const s = client.uplinks[i];
      xs.push(s[0], s[2], null);
      ys.push(s[1], s[3], null);
    });
    return [xs, ys];
  }

  function highlight(j) {
    state.job = (j === null || j === state.job) ? null : j;
    const job = state.job === null ? null : client.jobs[state.job];
    const gx = job ? job.gids.map(function (g) { return client.gpu_x[g]; }) : [];
    const gy = job ? job.gids.map(function (g) { return client.gpu_y[g]; }) : [];
    const seg = job ? segmentsFor(job) : [[], []];
    const panel = document.getElementById("job-panel");
    if (panel) {
      if (!job) {
        panel.textContent = "Click a GPU or a job in the legend to highlight its GPUs and the links its groups cross.";
      } else {
        panel.textContent = "";
        const title = document.createElement(job.url ? "a" : "strong");
        title.textContent = job.label;
        if (job.url) title.href = job.url;
        panel.appendChild(title);
        panel.appendChild(document.createTextNode(
          " · " + job.gids.length + " GPUs · " + job.nics.length + " NIC cables and " +
          job.uplinks.length + " switch uplinks carry its groups' traffic"));
      }
    }
    const select = document.getElementById("job-select");
    if (select) select.value = state.job === null ? "" : String(state.job);
    return Plotly.restyle(graph, { x: [seg[0], gx], y: [seg[1], gy] }, [first("hl-links"), first("hl-gpus")])
      .then(function () {
        graph.dataset.highlight = job ? String(job.id) : "";
        updateStatus();
      });
  }

  function nodesInRange(x0, x1) {
    let n = 0;
    const xs = client.node_x;
    for (let i = 0; i < xs.length; i++) if (xs[i] >= x0 && xs[i] <= x1) n++;
    return n;
  }

  function onRelayout(ev) {
    let x0 = -Infinity;
    let x1 = Infinity;
    if (ev["xaxis.range[0]"] !== undefined) { x0 = ev["xaxis.range[0]"]; x1 = ev["xaxis.range[1]"]; }
    else if (ev["xaxis.range"]) { x0 = ev["xaxis.range"][0]; x1 = ev["xaxis.range"][1]; }
    else if (!ev["xaxis.autorange"]) return;
    state.range = isFinite(x0) ? [x0, x1] : fig.layout.xaxis.range.slice();
    state.aggregate = nodesInRange(x0, x1) > client.aggregate_above_nodes;
    restyleAll();
  }

  function onClick(ev) {
    const pt = ev.points && ev.points[0];
    if (!pt) return;
    const role = pt.data.meta && pt.data.meta.role;
    if (role === "agg") {
      const g = pt.customdata;
      Plotly.relayout(graph, { "xaxis.range": [client.group_x0[g] - 2, client.group_x1[g] + 2] });
    } else if (role === "gpu-free" || role === "gpu-job" || role === "gpu-metric") {
      const j = client.gpu_job[pt.customdata];
      if (j >= 0) highlight(j);
    }
  }

  function onLegendClick(ev) {
    const t = ev.data[ev.curveNumber];
    if (t.meta && t.meta.role === "gpu-job" && t.meta.job !== undefined) highlight(t.meta.job);
    return false;
  }

  function setOverlay(key) {
    state.overlay = key;
    return restyleAll();
  }

  function sourceText() {
    if (state.overlay === "load" && state.source !== "predicted") return "link load is predicted (no uplink counters)";
    if (state.source === "predicted") return "predicted by the cost model";
    if (!measured || measured.n === 0) return "no fresh measurements: predicted shown";
    const pred = state.source === "diff" ? "" : "; predicted where none";
    const prefix = state.source === "diff" ? SOURCES.diff + ", " : "";
    return prefix + "measured " + measured.age_s + " s ago on " + measured.n + " of " +
      busyGids.length + " busy GPUs" + pred;
  }
  function setSource(key) {
    state.source = key;
    return restyleAll();
  }
  function loadMeasured() {
    if (!graph.dataset.measuredUrl) return Promise.resolve();
    return fetch(graph.dataset.measuredUrl, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (v) {
        if (!v) return;
        const map = { util: {}, mfu: {}, comm: {} };
        v.gids.forEach(function (g, i) { map.util[g] = v.util[i]; map.mfu[g] = v.mfu[i]; map.comm[g] = v.comm[i]; });
        measured = { map: map, age_s: v.age_s, n: v.gids.length };
        graph.dataset.measuredGpus = String(v.gids.length);
        if (state.source !== "predicted" && graph.dataset.rendered === "1") return restyleAll();
        updateStatus();
      })
      .catch(function () { /* the next poll tries again */ });
  }

  styleTraces().forEach(function (pair) {
    const t = fig.data[pair[0]];
    Object.keys(pair[1]).forEach(function (a) { setPath(t, a, pair[1][a]); });
  });
  timing.plotStart = performance.now();
  const drawn = Plotly.newPlot(graph, fig.data, fig.layout, config).then(function () {
    // The next frame is the first one that shows the graph.
    return new Promise(function (resolve) { requestAnimationFrame(function () { resolve(); }); });
  }).then(function () {
    window.topoweb.renderMs = timing.drawn = performance.now();
    graph.dataset.rendered = "1";
    graph.on("plotly_relayout", onRelayout);
    graph.on("plotly_click", onClick);
    graph.on("plotly_legendclick", onLegendClick);
    updateStatus();
  });

  document.querySelectorAll("input[name=overlay]").forEach(function (input) {
    input.addEventListener("change", function () { if (input.checked) setOverlay(input.value); });
  });
  document.querySelectorAll("input[name=source]").forEach(function (input) {
    input.addEventListener("change", function () { if (input.checked) setSource(input.value); });
  });
  const measuredLoaded = drawn.then(loadMeasured);
  window.setInterval(function () { if (!document.hidden) loadMeasured(); }, 5000);
  const select = document.getElementById("job-select");
  if (select) {
    select.addEventListener("change", function () {
      highlight(select.value === "" ? null : Number(select.value));
    });
  }
  // Poll the graph's digest; when jobs change, offer a reload instead of redrawing under the user.
  const POLL_MS = 15000;
  if (graph.dataset.versionUrl) {
    window.setInterval(function () {
      if (document.hidden) return;
      fetch(graph.dataset.versionUrl, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (v) {
          if (v && v.version !== graph.dataset.version) document.getElementById("graph-stale").hidden = false;
        })
        .catch(function () { /* the next poll tries again */ });
    }, POLL_MS);
  }
  window.topoweb = {
    state: state, client: client, drawn: drawn, timing: timing, highlight: highlight, setOverlay: setOverlay,
    setSource: setSource, measuredLoaded: measuredLoaded, metricValues: metricValues,
  };
})();
