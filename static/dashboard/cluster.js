// Cluster graph: draws the figure sent with the page, then switches overlays, shows stacked bars
// per leaf group when zoomed out, highlights a job, writes link and GPU hover text and draws
// paths, all client-side (the data is sent once). Only the points near the visible x range are
// handed to Plotly, so zooming into a 16k-GPU cluster draws a few thousand points, not all.
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
  const full = fig.data; // every trace with all its points; Plotly gets culled copies
  const client = payload.client;
  const links = client.links;
  const FULL_RANGE = fig.layout.xaxis.range.slice();
  const state = {
    overlay: "placement",
    source: "predicted",
    aggregate: client.n_nodes > client.aggregate_above_nodes,
    job: null,
    range: FULL_RANGE.slice(),
    path: null,
  };
  const config = { responsive: true, displaylogo: false, scrollZoom: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  // Marker size per x slot (one GPU column), so GPUs stay squares that do not overlap at any zoom.
  const SIZED = { "gpu-free": [0.8, 2, 18], "gpu-job": [0.8, 2, 18], "gpu-metric": [0.8, 2, 18], nic: [0.5, 1.5, 8] };
  // Traces cut to the visible x range (plus a margin) before each draw.
  // Switch links are kept by their lower end: zoomed in, the uplinks of the leaves in view.
  const CULLED = { "gpu-free": 1, "gpu-job": 1, "gpu-metric": 1, wire: 1, domain: 1, nic: 1, node: 1,
    "node-label": 1, "job-outline": 1, link: 1, uplink: "start", trunk: "start" };
  const DIM = 0.15;
  const MAX_LINK_TARGETS = 3000;
  const roleIndex = {};
  full.forEach(function (t, i) {
    const role = t.meta && t.meta.role;
    (roleIndex[role] = roleIndex[role] || []).push(i);
  });
  const first = function (role) { return (roleIndex[role] || [])[0]; };
  const busyGids = [];
  client.gpu_job.forEach(function (j, g) { if (j >= 0) busyGids.push(g); });
  const trunkNics = {};
  links.nic_trunk.forEach(function (t, k) { (trunkNics[t] = trunkNics[t] || []).push(k); });
  const nicCap = function (k) { return typeof links.nic_cap === "number" ? links.nic_cap : links.nic_cap[k]; };
  const capOf = {};
  for (let i = 0; i < links.n_uplinks; i++) capOf[links.a[i]] = (capOf[links.a[i]] || 0) + links.cap[i];
  const nicJob = {};
  const freeOnNode = client.node_gpus.slice();
  // Nodes not simply up, by node index: [state, reason, since (ISO), unhealthy GPU indexes].
  const nodeState = client.node_state || {};
  (client.node_no_agent || []).forEach(function (i) { nodeState[String(i)] = ["no_agent", "", null, []]; });
  const OUT_STATES = { down: 1, drained: 1, draining: 1 };
  function idleText(gid) {
    const st = nodeState[String(client.gpu_node[gid])];
    if (!st) return "free";
    if (st[3].indexOf(client.gpu_index[gid]) >= 0) return "unhealthy GPU: takes no placements";
    if (OUT_STATES[st[0]]) return "idle, node " + st[0] + ": takes no placements";
    return st[0] === "no_agent" ? "free (no agent reports from this node)" : "free";
  }
  client.gpu_job.forEach(function (j, g) {
    if (j < 0) {
      if (idleText(g).indexOf("free") !== 0) freeOnNode[client.gpu_node[g]]--;
      return;
    }
    freeOnNode[client.gpu_node[g]]--;
    const k = client.gpu_nic[g];
    if (k >= 0 && nicJob[k] === undefined) nicJob[k] = j;
  });
  let measured = null;

  // Place the points: the figure sends which GPUs, NICs, nodes and links each trace holds, and
  // the coordinates come once, in the client data.
  function segmentsOf(ids) {
    const xs = [];
    const ys = [];
    ids.forEach(function (i) { const s = links.seg[i]; xs.push(s[0], s[2], null); ys.push(s[1], s[3], null); });
    return [xs, ys];
  }
  function fillTraces() {
    const nUp = links.n_uplinks;
    const nLinks = links.cap.length;
    full.forEach(function (t) {
      const role = t.meta && t.meta.role;
      const fill = t.meta && t.meta.fill;
      const railOk = function (trunk) { return t.meta.rail === null || links.trunk_rail[trunk - nUp] === t.meta.rail; };
      let xy = null;
      if (role === "gpu-free" || role === "gpu-job" || role === "gpu-metric") {
        t.x = t.customdata.map(function (g) { return client.gpu_x[g]; });
        t.y = t.customdata.map(function (g) { return client.gpu_y[g]; });
      } else if (fill === "uplinks") {
        const ids = [];
        for (let i = 0; i < nUp; i++) ids.push(i);
        xy = segmentsOf(ids);
      } else if (fill === "trunks") {
        const ids = [];
        for (let i = nUp; i < nLinks; i++) if (railOk(i)) ids.push(i);
        xy = segmentsOf(ids);
      } else if (fill === "wires") {
        xy = [[], []];
        links.nic_trunk.forEach(function (trunk, k) {
          if (!railOk(trunk)) return;
          xy[0].push(client.nic_x[k], links.seg[trunk][0], null);
          xy[1].push(client.y_nic, client.y_bundle, null);
        });
      } else if (fill === "link-mid") {
        t.x = links.seg.map(function (s) { return Math.round(500 * (s[0] + s[2])) / 1000; });
        t.y = links.seg.map(function (s) { return Math.round(500 * (s[1] + s[3])) / 1000; });
        t.customdata = links.seg.map(function (_, i) { return i; });
      } else if (fill === "nics") {
        t.x = client.nic_x;
        t.y = client.nic_x.map(function () { return client.y_nic; });
        t.customdata = client.nic_x.map(function (_, k) { return k; });
      } else if (fill === "nodes" || fill === "node-labels") {
        t.x = client.node_x;
        t.y = client.node_x.map(function (_, i) { return fill === "nodes" ? client.y_node : client.node_y0[i] - 0.12; });
        t.customdata = client.node_x.map(function (_, i) { return i; });
      }
      if (xy) { t.x = xy[0]; t.y = xy[1]; }
    });
  }

  // Colours from the page's theme (CSS variables), with the light theme's values as defaults.
  function cssVar(names, fallback) {
    const style = getComputedStyle(document.documentElement);
    for (let i = 0; i < names.length; i++) {
      const v = style.getPropertyValue(names[i]).trim();
      if (v) return v;
    }
    return fallback;
  }
  function theme() {
    return { fg: cssVar(["--fg", "--ink"], "#1f2a33"), muted: cssVar(["--muted"], "#607d8b"),
      line: cssVar(["--border"], "#dde3e8"), card: cssVar(["--card"], "#ffffff") };
  }
  function applyTheme(layout) {
    const c = theme();
    layout.font = { color: c.fg };
    layout.yaxis.tickfont = { color: c.muted };
    layout.legend.font = { color: c.fg };
    layout.hoverlabel = { bgcolor: c.card, bordercolor: c.muted, font: { color: c.fg } };
    full[first("hl-links")].line.color = c.fg;
    full[first("hl-outline")].line.color = c.fg;
    (roleIndex["node-label"] || []).concat(roleIndex["agg-label"] || []).forEach(function (i) { full[i].textfont.color = c.fg; });
    // Switches keep their tier colours; an edge in the text colour keeps them apart from a dark card.
    (roleIndex["switch"] || []).forEach(function (i) {
      full[i].marker.line = { color: c.fg, width: 1 };
      if (full[i].textfont) full[i].textfont.color = c.fg;
    });
  }

  // ---- values: predicted, or measured where fresh -------------------------------------------
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
  function useMeasuredLinks() { return state.source !== "predicted" && measured && measured.links; }
  function nicLoad(k) {
    if (useMeasuredLinks()) {
      const v = measured.links.nic[k];
      if (v !== undefined) return [v, "measured"];
    }
    return [links.nic_load[String(k)] || 0, "predicted"];
  }
  // Load of link i (uplinks first, then trunks) in GB/s and where it comes from.
  function linkLoad(i) {
    if (useMeasuredLinks()) {
      if (i >= links.n_uplinks) {
        const nics = trunkNics[i] || [];
        let sum = 0;
        let seen = 0;
        nics.forEach(function (k) {
          const v = nicLoad(k);
          sum += v[0];
          if (v[1] === "measured") seen++;
        });
        if (seen) return [sum, seen === nics.length ? "measured" : "measured on " + seen + " of " + nics.length + " cables"];
      } else if (linkKind(i) === "leaf-spine") {
        const share = measured.links.leaf[links.switches[links.a[i]]];
        if (share !== undefined) return [share * links.cap[i], "measured at the NICs, split by the placement"];
      }
    }
    return [links.load[i], "predicted"];
  }

  // ---- hover text, built here from compact data rather than sent as 16k strings -------------
  const KINDS = ["tp", "pp", "dp", "ep"];
  const num = function (x, digits) { return String(Number(Number(x).toPrecision(digits))); };
  const pct = function (a, b) { return b > 0 ? Math.round((100 * a) / b) + "%" : "–"; };
  function gpuText(gid) {
    let s = "<b>" + client.node_names[client.gpu_node[gid]] + "</b> · GPU " + client.gpu_index[gid];
    const nic = client.gpu_nic[gid];
    if (nic >= 0) s += " · " + client.nic_names[client.nic_name[nic]] + " → " + client.leaf_names[client.nic_leaf[nic]];
    const j = client.gpu_job[gid];
    if (j < 0) return s + "<br>" + idleText(gid);
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
  function jobsText(rows, total) {
    if (!rows || !rows.length) return "<br>no job's traffic predicted here";
    let s = "<br>jobs crossing it (share of the predicted load):";
    rows.slice(0, 6).forEach(function (r) {
      s += "<br>  " + client.jobs[r[0]].label + ": " + num(r[1], 3) + " GB/s (" + pct(r[1], total) + ")";
    });
    if (rows.length > 6) s += "<br>  … and " + (rows.length - 6) + " more";
    return s;
  }
  function loadText(load, cap, predicted) {
    let s = "<br>load " + num(load[0], 3) + " GB/s, " + pct(load[0], cap) + " of capacity (" + load[1] + ")";
    if (state.source === "diff" && predicted !== undefined) {
      if (load[1] === "predicted") s += "<br>measured − predicted: no measurement";
      else {
        const d = cap > 0 ? Math.round((100 * (load[0] - predicted)) / cap) : 0;
        s += "<br>predicted " + num(predicted, 3) + " GB/s; measured − predicted: " + (d >= 0 ? "+" : "") + d + " pp of capacity";
      }
    }
    return s;
  }
  function linkKind(i) {
    if (i >= links.n_uplinks) return "NIC cables";
    return links.tier[links.a[i]] === "leaf" ? "leaf-spine" : links.tier[links.a[i]] + "-" + links.tier[links.b[i]];
  }
  // The jobs on link i as [[job, GB/s]]: a leaf's uplinks share the leaf's jobs by capacity.
  function linkJobs(i) {
    if (i < links.n_uplinks && links.tier[links.a[i]] === "leaf") {
      const rows = links.leaf_jobs[String(links.a[i])];
      const share = links.cap[i] / capOf[links.a[i]];
      return rows ? rows.map(function (r) { return [r[0], r[1] * share]; }) : null;
    }
    return links.jobs[String(i)];
  }
  function nicJobs(k) {
    const rows = links.nic_jobs[String(k)];
    if (rows) return rows;
    const load = links.nic_load[String(k)];
    return load ? [[nicJob[k], load]] : null;
  }
  function linkText(i) {
    const a = links.a[i] >= 0 ? links.switches[links.a[i]] : client.group_names[-1 - links.a[i]];
    const cap = links.cap[i];
    let s = "<b>" + a + " — " + links.switches[links.b[i]] + "</b> · " + linkKind(i);
    if (i >= links.n_uplinks) s += " (" + links.trunk_cables[i - links.n_uplinks] + " cables)";
    s += "<br>capacity " + num(cap, 4) + " GB/s" + loadText(linkLoad(i), cap, links.load[i]);
    return s + jobsText(linkJobs(i), links.load[i]);
  }
  function nicText(k) {
    const cap = nicCap(k);
    let s = "<b>" + client.node_names[client.nic_node[k]] + " " + client.nic_names[client.nic_name[k]] +
      "</b> → " + client.leaf_names[client.nic_leaf[k]] + " · NIC cable<br>capacity " + num(cap, 4) + " GB/s";
    s += loadText(nicLoad(k), cap, links.nic_load[String(k)] || 0);
    return s + jobsText(nicJobs(k), links.nic_load[String(k)] || 0);
  }
  function nodeText(i) {
    const leaf = client.node_leaf[i] >= 0 ? client.leaf_names[client.node_leaf[i]] : "standalone";
    const st = nodeState[String(i)];
    let state = "";
    if (st) {
      state = "<br>" + st[0].replace("_", " ") + (st[2] ? " since " + st[2].slice(0, 16).replace("T", " ") + " UTC" : "");
      if (st[1]) state += ": " + st[1].slice(0, 120);
      if (st[3].length) state += "<br>unhealthy GPU " + st[3].join(", ");
    }
    return "<b>" + client.node_names[i] + "</b> · " + leaf + "<br>" + client.node_gpus[i] + " GPUs, " +
      freeOnNode[i] + " free" + state + "<br><i>click for the node's page</i>";
  }
  const TEXT = { "gpu-free": gpuText, "gpu-job": gpuText, "gpu-metric": gpuText, link: linkText, nic: nicText,
    node: nodeText, "node-label": function (i) { return nodeLabel(i); } };

  // ---- culling: the points of a trace near the visible range ---------------------------------
  // Point traces keep points by x; line traces keep whole pieces (segments, boxes) between gaps.
  const pieceCache = {};
  function piecesOf(i) {
    if (pieceCache[i]) return pieceCache[i];
    const xs = full[i].x;
    const byStart = CULLED[full[i].meta.role] === "start";
    const out = { start: [], end: [], lo: [], hi: [] };
    let s = 0;
    for (let k = 0; k <= xs.length; k++) {
      if (k === xs.length || xs[k] === null) {
        if (k > s) {
          let lo = Infinity;
          let hi = -Infinity;
          for (let m = s; m < (byStart ? s + 1 : k); m++) { if (xs[m] < lo) lo = xs[m]; if (xs[m] > hi) hi = xs[m]; }
          out.start.push(s); out.end.push(Math.min(k + 1, xs.length)); out.lo.push(lo); out.hi.push(hi);
        }
        s = k + 1;
      }
    }
    pieceCache[i] = out;
    return out;
  }
  function pick(arr, idx) { const out = new Array(idx.length); for (let k = 0; k < idx.length; k++) out[k] = arr[idx[k]]; return out; }
  function cullTrace(i, lo, hi) {
    const t = full[i];
    const role = t.meta.role;
    const copy = Object.assign({}, t);
    if (t.mode && t.mode.indexOf("lines") >= 0) {
      const p = piecesOf(i);
      const xs = [];
      const ys = [];
      for (let k = 0; k < p.start.length; k++) {
        if (p.hi[k] < lo || p.lo[k] > hi) continue;
        for (let m = p.start[k]; m < p.end[k]; m++) { xs.push(t.x[m]); ys.push(t.y[m]); }
      }
      copy.x = xs;
      copy.y = ys;
      if (!xs.length) copy.visible = false;
      return copy;
    }
    let idx = [];
    for (let k = 0; k < t.x.length; k++) if (t.x[k] >= lo && t.x[k] <= hi) idx.push(k);
    // Thousands of overlapping link midpoints say nothing: hover links once zoomed in.
    if (role === "link" && idx.length > MAX_LINK_TARGETS) idx = [];
    // A job with no GPU in view leaves the legend, which then lists the jobs on screen.
    if (!idx.length) copy.visible = false;
    copy.x = pick(t.x, idx);
    copy.y = pick(t.y, idx);
    if (t.customdata) copy.customdata = pick(t.customdata, idx);
    if (TEXT[role]) copy.text = copy.customdata.map(TEXT[role]);
    else if (Array.isArray(t.text) && t.text.length === t.x.length) copy.text = pick(t.text, idx);
    if (t.marker) {
      copy.marker = Object.assign({}, t.marker);
      ["color", "symbol", "opacity"].forEach(function (key) {
        if (Array.isArray(t.marker[key])) copy.marker[key] = pick(t.marker[key], idx);
      });
    }
    return copy;
  }
  // Zoomed in, the spines and cores would leave the view: their rows are drawn squeezed into the
  // visible range (in their order), the cables up from the leaves following them.
  const UPPER_ROLES = { "switch": 1, uplink: 1, load: 1, link: 1, "hl-links": 1, "hl-path": 1 };
  function squeezer() {
    const w = FULL_RANGE[1] - FULL_RANGE[0];
    const v = state.range[1] - state.range[0];
    if (!(v < w * 0.98)) return null;
    const a = state.range[0] + v * 0.04;
    const b = state.range[1] - v * 0.04;
    return function (x) { return a + ((x - FULL_RANGE[0]) / w) * (b - a); };
  }
  function keepUpperInView(t, sq) {
    if (!t.x || !t.x.length) return t;
    const above = client.y_leaf + 1e-6;
    const copy = Object.assign({}, t);
    if (t.meta.role === "link") {
      copy.x = t.customdata.map(function (i) {
        const s = links.seg[i];
        const x0 = s[1] > above ? sq(s[0]) : s[0];
        const x1 = s[3] > above ? sq(s[2]) : s[2];
        return Math.round(500 * (x0 + x1)) / 1000;
      });
    } else {
      copy.x = t.x.map(function (x, k) { return x !== null && t.y[k] > above ? sq(x) : x; });
    }
    return copy;
  }
  // Zoomed out to the bars, a leaf group's uplinks (hundreds of cables at 16k GPUs) draw as one
  // bundle from the group to the middle of the switches they reach, carrying the group's total
  // capacity and load; the cables above the spines stay as they are.
  const groupUplinks = (function () {
    const out = client.group_names.map(function () { return []; });
    const leafIndex = {};
    client.leaf_names.forEach(function (name, i) { leafIndex[name] = i; });
    const groupOfLeaf = {};
    client.node_leaf.forEach(function (leaf, n) { if (groupOfLeaf[leaf] === undefined) groupOfLeaf[leaf] = client.node_group[n]; });
    for (let i = 0; i < links.n_uplinks; i++) {
      const lo = links.a[i];
      if (links.tier[lo] !== "leaf") continue;
      const g = groupOfLeaf[leafIndex[links.switches[lo]]];
      if (g !== undefined) out[g].push(i);
    }
    return out;
  })();
  const upperLinks = [];
  for (let i = 0; i < links.n_uplinks; i++) if (links.tier[links.a[i]] !== "leaf") upperLinks.push(i);
  function bundles() {
    const out = [];
    groupUplinks.forEach(function (ids, g) {
      if (!ids.length) return;
      let cap = 0;
      let load = 0;
      let top = 0;
      let left = Infinity;
      let right = -Infinity;
      const sources = {};
      ids.forEach(function (i) {
        const l = linkLoad(i);
        cap += links.cap[i];
        load += l[0];
        sources[l[1]] = 1;
        top += links.seg[i][2];
        left = Math.min(left, links.seg[i][2]);
        right = Math.max(right, links.seg[i][2]);
      });
      const kinds = Object.keys(sources);
      const source = kinds.length === 1 ? kinds[0] : "measured where fresh, else predicted";
      out.push({ g: g, n: ids.length, cap: cap, load: [load, source], share: cap > 0 ? load / cap : 0,
        bus: [left, links.seg[ids[0]][3], right, links.seg[ids[0]][3]],
        seg: [(client.group_x0[g] + client.group_x1[g]) / 2, client.y_leaf, top / ids.length, links.seg[ids[0]][3]] });
    });
    return out;
  }
  function bundleText(b) {
    return "<b>" + client.group_names[b.g] + "</b> · " + b.n + " leaf uplinks in one bundle<br>capacity " +
      num(b.cap, 4) + " GB/s" + loadText(b.load, b.cap);
  }
  function bundledTrace(t, bs) {
    const role = t.meta.role;
    const copy = Object.assign({}, t);
    const xs = [];
    const ys = [];
    const add = function (s) { xs.push(s[0], s[2], null); ys.push(s[1], s[3], null); };
    if (role === "link") {
      copy.x = bs.map(function (b) { return (b.seg[0] + b.seg[2]) / 2; });
      copy.y = bs.map(function (b) { return (b.seg[1] + b.seg[3]) / 2; });
      copy.text = bs.map(bundleText);
      copy.customdata = bs.map(function (b) { return -1 - b.g; });
      copy.marker = Object.assign({}, t.marker, { size: 9 });
      return copy;
    }
    let k = -1;
    if (role === "load") {
      k = (roleIndex.load || []).indexOf(full.indexOf(t));
      const bounds = client.load_buckets;
      const bucket = function (share) {
        let n = 0;
        while (n < bounds.length - 1 && bounds[n] !== null && share > bounds[n]) n++;
        return n;
      };
      bs.forEach(function (b) { if (bucket(b.share) === k) add(b.seg); });
      upperLinks.forEach(function (i) {
        if (bucket(links.cap[i] > 0 ? linkLoad(i)[0] / links.cap[i] : 0) === k) add(links.seg[i]);
      });
    } else {
      // Each bundle ends on a bar along the switches its cables reach (once per distinct bar).
      const bars = {};
      bs.forEach(function (b) {
        add(b.seg);
        const key = b.bus[0] + "," + b.bus[2];
        if (!bars[key] && b.bus[2] > b.bus[0]) { bars[key] = 1; add(b.bus); }
      });
      upperLinks.forEach(function (i) { add(links.seg[i]); });
    }
    copy.x = xs;
    copy.y = ys;
    if (role === "uplink") copy.line = Object.assign({}, t.line, { width: 2 });
    return copy;
  }
  const BUNDLED = { uplink: 1, link: 1, load: 1 };
  function displayTraces() {
    const width = state.range[1] - state.range[0];
    const lo = state.range[0] - width / 2;
    const hi = state.range[1] + width / 2;
    const sq = squeezer();
    // Bundles replace the per-cable drawing zoomed out (not under "measured − predicted", whose
    // layers are per cable).
    const bs = state.aggregate && state.source !== "diff" ? bundles() : null;
    graph.dataset.bundles = bs ? String(bs.length) : "0";
    return full.map(function (t, i) {
      const role = t.meta && t.meta.role;
      if (t.visible === false) return t;
      let shown = CULLED[role] ? cullTrace(i, lo, hi) : t;
      if (bs && BUNDLED[role]) shown = bundledTrace(t, bs);
      return sq && UPPER_ROLES[role] ? keepUpperInView(shown, sq) : shown;
    });
  }

  // ---- styling per overlay, zoom and highlight -----------------------------------------------
  function plotWidthPx() {
    const size = graph._fullLayout && graph._fullLayout._size;
    return size ? size.w : Math.max(300, graph.clientWidth - 340);
  }
  function markerSize(role) {
    const f = SIZED[role];
    const px = plotWidthPx() / Math.max(1e-6, state.range[1] - state.range[0]);
    return Math.round(Math.min(f[2], Math.max(f[1], f[0] * px)) * 10) / 10;
  }
  function nodesInRange(x0, x1) {
    let n = 0;
    const xs = client.node_x;
    for (let i = 0; i < xs.length; i++) if (xs[i] >= x0 && xs[i] <= x1) n++;
    return n;
  }
  // Pixels per node in view: a full node name needs about 70, its number about 28.
  function pxPerNode() { return plotWidthPx() / Math.max(1, nodesInRange(state.range[0], state.range[1])); }
  function labelsFit() { return pxPerNode() >= 28; }
  function nodeLabel(i) {
    const name = client.node_names[i];
    if (pxPerNode() >= 70) return name;
    const m = /(\d+)$/.exec(name);
    return m ? m[1] : name.slice(-4);
  }
  function visibleFor(t) {
    const role = t.meta && t.meta.role;
    const agg = state.aggregate;
    const isMetric = Object.prototype.hasOwnProperty.call(METRICS, state.overlay);
    const isLoad = state.overlay === "load";
    switch (role) {
      case "gpu-free": case "wire": case "domain": case "nic": case "node":
        return !agg;
      case "node-label":
        return !agg && labelsFit();
      case "gpu-job":
        return !agg && !isMetric;
      case "gpu-metric": case "job-outline":
        return !agg && isMetric;
      case "agg":
        return agg;
      case "agg-label":
        // About 44 px per "512 free" label.
        return agg && client.group_names.length * 44 <= plotWidthPx();
      case "trunk": case "uplink":
        return !isLoad;
      case "load":
        return isLoad;
      default:
        return true;
    }
  }
  function fade(on) { return state.job === null || on ? 1 : DIM; }

  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const RDBU = [[5, 48, 97], [67, 147, 195], [247, 247, 247], [214, 96, 77], [103, 0, 31]];
  function scaleColor(v) {
    const diff = state.source === "diff";
    const stops = diff ? RDBU : VIRIDIS;
    let f = diff ? (v + 0.5) : v;
    f = Math.max(0, Math.min(1, f)) * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(f));
    const r = f - k;
    const c = stops[k].map(function (a, n) { return Math.round(a + (stops[k + 1][n] - a) * r); });
    return "rgb(" + c.join(",") + ")";
  }
  function metricTitle(key) { return METRICS[key] + " (" + SOURCES[state.source] + ")"; }
  function scaleFor() {
    return state.source === "diff"
      ? { colorscale: "RdBu", cmin: -0.5, cmax: 0.5 }
      : { colorscale: "Viridis", cmin: 0, cmax: 1 };
  }
  const barColors = full[first("agg")].marker.color.slice();
  const barLine = full[first("agg")].marker.line;
  function styleBars(t, isMetric) {
    const bars = client.bars;
    const J = client.jobs.length + 1;
    let colors = barColors;
    const lineColors = [];
    const lineWidths = [];
    if (isMetric) {
      const values = metricValues(state.overlay);
      const sum = {};
      const count = {};
      busyGids.forEach(function (g, i) {
        const v = values[i];
        if (v === null || v === undefined) return;
        const key = client.node_group[client.gpu_node[g]] * J + client.gpu_job[g];
        sum[key] = (sum[key] || 0) + v;
        count[key] = (count[key] || 0) + 1;
      });
      colors = bars.job.map(function (j, s) {
        if (j < 0) return barColors[s];
        const key = bars.group[s] * J + j;
        return count[key] ? scaleColor(sum[key] / count[key]) : barColors[s];
      });
    }
    bars.job.forEach(function (j) {
      // Under a metric the fill is the metric: the job's colour moves to a thick outline.
      lineColors.push(isMetric && j >= 0 ? client.jobs[j].color : barLine.color);
      lineWidths.push(isMetric && j >= 0 ? 2.5 : barLine.width);
    });
    t.marker.color = colors;
    t.marker.line = { color: lineColors, width: lineWidths };
    t.marker.opacity = bars.job.map(function (j) { return fade(j === state.job); });
  }
  function styleTraces() {
    const isMetric = Object.prototype.hasOwnProperty.call(METRICS, state.overlay);
    full.forEach(function (t) {
      const role = t.meta && t.meta.role;
      t.visible = visibleFor(t);
      if (SIZED[role]) t.marker.size = markerSize(role);
      if (role === "gpu-job") {
        if (t.meta.job !== undefined) t.marker.opacity = fade(t.meta.job === state.job);
        else t.marker.opacity = t.customdata.map(function (g) { return fade(client.gpu_job[g] === state.job); });
      } else if (role === "gpu-free") {
        t.marker.opacity = state.job === null ? 1 : 0.3;
      } else if (role === "gpu-metric") {
        if (isMetric) {
          t.marker.color = metricValues(state.overlay);
          t.marker.colorbar.title.text = metricTitle(state.overlay);
          Object.assign(t.marker, scaleFor());
        }
        t.marker.opacity = state.job === null ? 1 : t.customdata.map(function (g) { return fade(client.gpu_job[g] === state.job); });
      } else if (role === "job-outline") {
        t.opacity = t.meta.job === undefined ? fade(false) : fade(t.meta.job === state.job);
      } else if (role === "wire" || role === "trunk" || role === "uplink" || role === "domain" || role === "load") {
        t.opacity = state.job === null ? 1 : 0.35;
      } else if (role === "agg") {
        styleBars(t, isMetric);
      }
    });
    if (state.overlay === "load") fillLoadBuckets();
  }
  // Under "measured − predicted" the same six load layers show the difference of the shares
  // (links without a measurement in the first, grey); otherwise the share of capacity.
  const DIFF_BUCKETS = [[null, "no measurement", "#cfd8dc"], [-0.2, "measured < predicted − 20 pp", "#2166ac"],
    [-0.05, "− 20 to − 5 pp", "#92c5de"], [0.05, "within ± 5 pp", "#9e9e9e"], [0.2, "+ 5 to + 20 pp", "#f4a582"],
    [Infinity, "measured > predicted + 20 pp", "#b2182b"]];
  const loadLooks = (roleIndex.load || []).map(function (i) { return [full[i].name, full[i].line.color]; });
  // Measured minus predicted share of capacity of link i; null when nothing measured it.
  function linkDiff(i) {
    const m = linkLoad(i);
    if (m[1] === "predicted" || !(links.cap[i] > 0)) return null;
    return (m[0] - links.load[i]) / links.cap[i];
  }
  function fillLoadBuckets() {
    const ids = roleIndex.load || [];
    const bounds = client.load_buckets;
    const diff = state.source === "diff" && ids.length === DIFF_BUCKETS.length;
    const xs = ids.map(function () { return []; });
    const ys = ids.map(function () { return []; });
    for (let i = 0; i < links.cap.length; i++) {
      let k = 0;
      if (diff) {
        const d = linkDiff(i);
        if (d !== null) { k = 1; while (k < DIFF_BUCKETS.length - 1 && d > DIFF_BUCKETS[k][0]) k++; }
      } else {
        const share = links.cap[i] > 0 ? linkLoad(i)[0] / links.cap[i] : 0;
        while (k < bounds.length - 1 && bounds[k] !== null && share > bounds[k]) k++;
      }
      const s = links.seg[i];
      xs[k].push(s[0], s[2], null);
      ys[k].push(s[1], s[3], null);
    }
    ids.forEach(function (i, k) {
      full[i].x = xs[k];
      full[i].y = ys[k];
      full[i].showlegend = xs[k].length > 0;
      full[i].name = diff ? DIFF_BUCKETS[k][1] : loadLooks[k][0];
      full[i].line.color = diff ? DIFF_BUCKETS[k][2] : loadLooks[k][1];
    });
    graph.dataset.loadColours = diff ? "diff" : "share";
  }

  let pending = Promise.resolve();
  function render() {
    const t0 = performance.now();
    styleTraces();
    const traces = displayTraces();
    const t1 = performance.now();
    timing.styleMs = t1 - t0;
    pending = Plotly.react(graph, traces, fig.layout, config).then(function () {
      timing.reactMs = performance.now() - t1;
      updateStatus();
    });
    window.topoweb.pending = pending;
    return pending;
  }

  function sourceText() {
    if (state.overlay === "load" && state.source !== "predicted") {
      if (!measured || !measured.links) return "no fresh NIC counters: link loads predicted";
      if (state.source === "diff") return "measured − predicted share of each link's capacity where NIC counters are fresh (grey: no measurement)";
      return "NIC cables and leaf uplinks measured from NIC counters where fresh; spine-core predicted";
    }
    if (state.source === "predicted") return "predicted by the cost model";
    if (!measured || measured.n === 0) return "no fresh measurements: predicted shown";
    const pred = state.source === "diff" ? "" : "; predicted where none";
    const prefix = state.source === "diff" ? SOURCES.diff + ", " : "";
    return prefix + "measured " + measured.age_s + " s ago on " + measured.n + " of " +
      busyGids.length + " busy GPUs" + pred;
  }
  function updateStatus() {
    const el = document.getElementById("graph-status");
    const mode = state.aggregate ? "GPUs per leaf group: jobs and free GPUs (zoom in for GPUs)" : "every GPU";
    const job = state.job === null ? "" : " · highlighted: " + client.jobs[state.job].label;
    if (el) el.textContent = "View: " + mode + job + " · values: " + sourceText();
    graph.dataset.aggregate = state.aggregate ? "1" : "0";
    graph.dataset.overlay = state.overlay;
    graph.dataset.source = state.source;
    graph.dataset.labels = visibleFor(full[first("node-label")]) ? "1" : "0";
  }

  // ---- highlight -----------------------------------------------------------------------------
  function highlightLines(job) {
    const xs = [];
    const ys = [];
    job.nics.forEach(function (k) {
      const s = links.seg[links.nic_trunk[k]];
      xs.push(client.nic_x[k], s[0], s[2], null);
      ys.push(client.y_nic, s[1], s[3], null);
    });
    job.uplinks.forEach(function (i) {
      const s = links.seg[i];
      xs.push(s[0], s[2], null);
      ys.push(s[1], s[3], null);
    });
    return [xs, ys];
  }
  // The job's outline: one box per node around its GPUs there (not a ring per GPU).
  function outline(gids) {
    const box = {};
    const pad = client.outline_pad;
    gids.forEach(function (g) {
      const n = client.gpu_node[g];
      const b = box[n] || (box[n] = [Infinity, -Infinity, Infinity, -Infinity]);
      const x = client.gpu_x[g];
      const y = client.gpu_y[g];
      if (x < b[0]) b[0] = x; if (x > b[1]) b[1] = x;
      if (y < b[2]) b[2] = y; if (y > b[3]) b[3] = y;
    });
    const xs = [];
    const ys = [];
    Object.keys(box).forEach(function (n) {
      const b = box[n];
      const x0 = b[0] - pad[0], x1 = b[1] + pad[0], y0 = b[2] - pad[1], y1 = b[3] + pad[1];
      xs.push(x0, x1, x1, x0, x0, null);
      ys.push(y0, y0, y1, y1, y0, null);
    });
    return [xs, ys];
  }
  function highlight(j) {
    state.job = (j === null || j === state.job) ? null : j;
    const job = state.job === null ? null : client.jobs[state.job];
    const seg = job ? highlightLines(job) : [[], []];
    const box = job ? outline(job.gids) : [[], []];
    const hl = full[first("hl-links")];
    hl.x = seg[0]; hl.y = seg[1];
    const ol = full[first("hl-outline")];
    ol.x = box[0]; ol.y = box[1];
    const panel = document.getElementById("job-panel");
    if (panel) {
      if (!job) {
        panel.textContent = "Click a GPU, a bar or a job in the legend to highlight its GPUs and the links its groups cross.";
      } else {
        panel.textContent = "";
        const title = document.createElement(job.url ? "a" : "strong");
        title.textContent = job.label;
        if (job.url) title.href = job.url;
        panel.appendChild(title);
        panel.appendChild(document.createTextNode(
          " · " + job.gids.length + " GPUs · " + job.nics.length + " NIC cables and " +
          job.uplinks.length + " switch uplinks carry its groups' traffic; everything else is dimmed"));
      }
    }
    const select = document.getElementById("job-select");
    if (select) select.value = state.job === null ? "" : String(state.job);
    return render().then(function () { graph.dataset.highlight = job ? String(job.id) : ""; });
  }

  // ---- events --------------------------------------------------------------------------------
  function onRelayout(ev) {
    let x0 = -Infinity;
    let x1 = Infinity;
    if (ev["xaxis.range[0]"] !== undefined) { x0 = ev["xaxis.range[0]"]; x1 = ev["xaxis.range[1]"]; }
    else if (ev["xaxis.range"]) { x0 = ev["xaxis.range"][0]; x1 = ev["xaxis.range"][1]; }
    else if (!ev["xaxis.autorange"]) return;
    state.range = isFinite(x0) ? [x0, x1] : FULL_RANGE.slice();
    fig.layout.xaxis.range = state.range.slice();
    fig.layout.xaxis.autorange = false;
    state.aggregate = nodesInRange(state.range[0], state.range[1]) > client.aggregate_above_nodes;
    render();
  }
  // One redraw with the new range and the layers it needs (Plotly.relayout would draw the old
  // layers at the new range first).
  function zoomTo(x0, x1) {
    state.range = [x0, x1];
    fig.layout.xaxis.range = [x0, x1];
    fig.layout.xaxis.autorange = false;
    state.aggregate = nodesInRange(x0, x1) > client.aggregate_above_nodes;
    return render();
  }
  function nodeUrl(node) {
    return "/clusters/" + encodeURIComponent(client.cluster) + "/nodes/" + encodeURIComponent(node) + "/";
  }
  function onClick(ev) {
    const pt = ev.points && ev.points[0];
    if (!pt) return;
    const role = pt.data.meta && pt.data.meta.role;
    if (role === "agg" || role === "agg-label") {
      const g = pt.customdata;
      zoomTo(client.group_x0[g] - 2, client.group_x1[g] + 2);
    } else if (role === "node" || role === "node-label" || role === "node-state") {
      window.location.href = nodeUrl(client.node_names[pt.customdata]);
    } else if (role === "gpu-free" || role === "gpu-job" || role === "gpu-metric") {
      const gid = pt.customdata;
      if (ev.event && ev.event.shiftKey) return pickEndpoint(client.node_names[client.gpu_node[gid]] + ":" + client.gpu_index[gid]);
      const j = client.gpu_job[gid];
      if (j >= 0) highlight(j);
    }
  }
  function onLegendClick(ev) {
    const t = ev.data[ev.curveNumber];
    const role = t.meta && t.meta.role;
    if ((role === "gpu-job" || role === "job-outline") && t.meta.job !== undefined) highlight(t.meta.job);
    return false;
  }
  function setOverlay(key) { state.overlay = key; return render(); }
  function setSource(key) { state.source = key; return render(); }
  function loadMeasured() {
    if (!graph.dataset.measuredUrl) return Promise.resolve();
    return fetch(graph.dataset.measuredUrl, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (v) {
        if (!v) return;
        const map = { util: {}, mfu: {}, comm: {} };
        v.gids.forEach(function (g, i) { map.util[g] = v.util[i]; map.mfu[g] = v.mfu[i]; map.comm[g] = v.comm[i]; });
        const nic = v.nic_GBps || {};
        const hasLinks = Object.keys(nic).length > 0;
        measured = { map: map, age_s: v.age_s, n: v.gids.length,
          links: hasLinks ? { nic: nic, leaf: v.leaf_uplink || {} } : null };
        graph.dataset.measuredGpus = String(v.gids.length);
        graph.dataset.measuredNics = String(Object.keys(nic).length);
        if (state.source !== "predicted" && graph.dataset.rendered === "1") return render();
        updateStatus();
      })
      .catch(function () { /* the next poll tries again */ });
  }

  // ---- path view -----------------------------------------------------------------------------
  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }
  function pickEndpoint(text) {
    const a = document.getElementById("path-a");
    const b = document.getElementById("path-b");
    if (!a || !b) return;
    if (!a.value || (a.value && b.value)) { a.value = text; b.value = ""; }
    else { b.value = text; showPath(a.value, b.value); }
  }
  function showPath(a, b) {
    const form = document.getElementById("path-form");
    const out = document.getElementById("path-result");
    const url = form.dataset.url + "?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b);
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.json().then(function (v) { return [r.ok, v]; }); })
      .then(function (res) {
        out.textContent = "";
        const v = res[1];
        if (!res[0]) {
          const p = document.createElement("p");
          p.className = "error";
          p.textContent = Object.keys(v).map(function (k) { return k + ": " + v[k].join(" "); }).join("; ");
          out.appendChild(p);
          return;
        }
        state.path = v;
        const p = document.createElement("p");
        p.textContent = v.a + " → " + v.b + ": " + v.level + " level, " + num(v.bw_GBps, 4) + " GB/s, " +
          (v.latency_us === null ? "no path" : num(v.latency_us, 4) + " µs") +
          (v.bottleneck === null ? "" : "; bottleneck: hop " + (v.bottleneck + 1));
        out.appendChild(p);
        const table = document.createElement("table");
        table.className = "grid compact";
        table.id = "path-hops";
        const head = table.createTHead().insertRow();
        ["#", "From", "To", "Level", "GB/s", "µs", "Load now", "Capacity used"].forEach(function (h) {
          const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
        });
        const body = table.createTBody();
        v.hops.forEach(function (hop, k) {
          const row = body.insertRow();
          if (k === v.bottleneck) row.className = "current";
          cell(row, String(k + 1));
          cell(row, hop.from);
          cell(row, hop.to);
          cell(row, hop.level);
          cell(row, num(hop.bw_GBps, 4) + (k === v.bottleneck ? " (bottleneck)" : ""), "num");
          cell(row, num(hop.latency_us, 4), "num");
          let load = null;
          let cap = null;
          if (hop.link && hop.link.nic !== undefined) { load = nicLoad(hop.link.nic); cap = nicCap(hop.link.nic); }
          else if (hop.link && hop.link.uplink !== undefined && hop.link.uplink !== null) {
            load = linkLoad(hop.link.uplink); cap = links.cap[hop.link.uplink];
          }
          cell(row, load ? num(load[0], 3) + " GB/s (" + load[1] + ")" : "–", "num");
          cell(row, load ? pct(load[0], cap) : "–", "num");
        });
        out.appendChild(table);
        if (v.pairs && v.pairs.length > 1) {
          const note = document.createElement("p");
          note.className = "note";
          note.textContent = "GPU pairs of the same index: " + v.pairs.map(function (q) {
            return q.a.split(" GPU ")[1] + "↔" + q.b.split(" GPU ")[1] + " " + q.level + " " + num(q.bw_GBps, 4) + " GB/s";
          }).join(" · ") + " (the slowest is shown hop by hop)";
          out.appendChild(note);
        }
        const t = full[first("hl-path")];
        t.x = [v.start[0]];
        t.y = [v.start[1]];
        v.hops.forEach(function (hop) {
          if (hop.via) { t.x.push(hop.via[0]); t.y.push(hop.via[1]); }
          t.x.push(hop.point[0]); t.y.push(hop.point[1]);
        });
        return render().then(function () { graph.dataset.path = v.a + "|" + v.b; });
      });
  }
  function showMatrix(leaf) {
    const box = document.getElementById("matrix-result");
    const url = document.getElementById("matrix-form").dataset.url + "?leaf=" + encodeURIComponent(leaf);
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (v) {
        box.textContent = "";
        if (!v.nodes) { box.textContent = JSON.stringify(v); return; }
        const table = document.createElement("table");
        table.className = "grid compact matrix";
        table.id = "leaf-matrix";
        const head = table.createTHead().insertRow();
        head.appendChild(document.createElement("th"));
        v.nodes.forEach(function (n) { const th = document.createElement("th"); th.textContent = n; head.appendChild(th); });
        const body = table.createTBody();
        v.nodes.forEach(function (n, i) {
          const row = body.insertRow();
          const th = document.createElement("th"); th.textContent = n; row.appendChild(th);
          v.nodes.forEach(function (_, k) {
            const td = cell(row, num(v.bw_GBps[i][k], 4) + " GB/s · " + (v.latency_us[i][k] === null ? "–" : num(v.latency_us[i][k], 3) + " µs"), "num level-" + v.level[i][k]);
            td.title = v.level[i][k];
          });
        });
        const note = document.createElement("p");
        note.className = "note";
        note.textContent = v.note + (v.truncated ? "; the first " + v.nodes.length + " nodes" : "");
        box.appendChild(note);
        box.appendChild(table);
      });
  }

  // ---- first draw ----------------------------------------------------------------------------
  fillTraces();
  applyTheme(fig.layout);
  styleTraces();
  timing.plotStart = performance.now();
  const drawn = Plotly.newPlot(graph, displayTraces(), fig.layout, config).then(function () {
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
  if (window.matchMedia) {
    const dark = window.matchMedia("(prefers-color-scheme: dark)");
    graph.dataset.theme = dark.matches ? "dark" : "light";
    dark.addEventListener("change", function () {
      applyTheme(fig.layout);
      // Tests and screenshots wait for this mark: the graph redrawn in the new theme's colours.
      render().then(function () { graph.dataset.theme = dark.matches ? "dark" : "light"; });
    });
  }

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
  const pathForm = document.getElementById("path-form");
  if (pathForm) {
    pathForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      showPath(document.getElementById("path-a").value, document.getElementById("path-b").value);
    });
    // Opened from a link with both ends (the job page's): show that path at once.
    const endA = document.getElementById("path-a").value;
    const endB = document.getElementById("path-b").value;
    if (endA && endB) showPath(endA, endB);
  }
  const matrixForm = document.getElementById("matrix-form");
  if (matrixForm) {
    matrixForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      showMatrix(document.getElementById("matrix-leaf").value);
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
  // ---- keyboard: the graph's leaf groups, nodes and jobs as a list of buttons ----------------
  // Built when the list is first opened (a 2,048-node cluster needs no 2,048 buttons up front).
  // A button zooms the graph to its node or group, highlights the node's job and says the node's
  // state, GPUs and jobs in the live status line; a link beside it opens the node's page.
  const plain = function (html) { return html.replace(/<br>/g, "; ").replace(/<[^>]+>/g, ""); };
  function nodeJobs(i) {
    const seen = {};
    client.gpu_job.forEach(function (j, g) { if (j >= 0 && client.gpu_node[g] === i) seen[j] = 1; });
    return Object.keys(seen).map(Number);
  }
  function describeNode(i) {
    const jobs = nodeJobs(i).map(function (j) { return client.jobs[j].label; });
    return plain(nodeText(i)).replace("; click for the node's page", "") +
      (jobs.length ? "; jobs: " + jobs.join(", ") : "; no job");
  }
  function announce(text) {
    const el = document.getElementById("graph-key-status");
    if (el) el.textContent = text;
  }
  function focusNode(i) {
    const jobs = nodeJobs(i);
    const zoom = zoomTo(client.node_x0[i] - 6, client.node_x1[i] + 6);
    announce(describeNode(i));
    graph.dataset.focusNode = client.node_names[i];
    return jobs.length && state.job !== jobs[0] ? zoom.then(function () { return highlight(jobs[0]); }) : zoom;
  }
  function keyButton(text, label, onPress) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "key-item";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", onPress);
    return b;
  }
  function buildKeyList() {
    const list = document.getElementById("graph-key-list");
    if (!list || list.dataset.built) return;
    list.dataset.built = "1";
    const groups = {};
    client.node_group.forEach(function (g, i) { (groups[g] = groups[g] || []).push(i); });
    Object.keys(groups).map(Number).sort(function (a, b) { return a - b; }).forEach(function (g) {
      const li = document.createElement("li");
      const nodes = groups[g];
      const free = nodes.reduce(function (n, i) { return n + freeOnNode[i]; }, 0);
      li.appendChild(keyButton(client.group_names[g] + " · " + nodes.length + " nodes, " + free + " free GPUs",
        "leaf group " + client.group_names[g] + ": " + nodes.length + " nodes, " + free + " free GPUs; zoom to it",
        function () { zoomTo(client.group_x0[g] - 2, client.group_x1[g] + 2); announce("Zoomed to " + client.group_names[g]); }));
      const ul = document.createElement("ul");
      nodes.forEach(function (i) {
        const item = document.createElement("li");
        const st = nodeState[String(i)];
        const mark = st ? " · " + st[0].replace("_", " ") + (st[3].length ? ", unhealthy GPU " + st[3].join(", ") : "") : "";
        const b = keyButton(client.node_names[i] + mark, describeNode(i), function () { focusNode(i); });
        b.dataset.node = client.node_names[i];
        item.appendChild(b);
        const a = document.createElement("a");
        a.href = nodeUrl(client.node_names[i]);
        a.textContent = "page";
        a.setAttribute("aria-label", "page of node " + client.node_names[i]);
        item.appendChild(document.createTextNode(" "));
        item.appendChild(a);
        ul.appendChild(item);
      });
      li.appendChild(ul);
      list.appendChild(li);
    });
    // The switches: each a link to its page, described by its uplinks' capacity and load.
    const sw = document.createElement("li");
    sw.appendChild(document.createTextNode("Switches"));
    const swList = document.createElement("ul");
    links.switches.forEach(function (name, k) {
      let cap = 0;
      let load = 0;
      for (let i = 0; i < links.n_uplinks; i++) {
        if (links.a[i] === k) { cap += links.cap[i]; load += linkLoad(i)[0]; }
      }
      const item = document.createElement("li");
      const a = document.createElement("a");
      a.href = "/clusters/" + encodeURIComponent(client.cluster) + "/switches/" + encodeURIComponent(name) + "/";
      a.textContent = name + " (" + links.tier[k] + ")";
      a.dataset.switch = name;
      a.setAttribute("aria-label", links.tier[k] + " switch " + name + (cap > 0
        ? ": uplinks " + num(cap, 4) + " GB/s, load " + num(load, 3) + " GB/s (" + pct(load, cap) + ")"
        : ": top tier") + "; opens its page");
      item.appendChild(a);
      swList.appendChild(item);
    });
    sw.appendChild(swList);
    list.appendChild(sw);
  }
  const keys = document.getElementById("graph-keys");
  if (keys) {
    keys.addEventListener("toggle", function () { if (keys.open) buildKeyList(); });
    if (keys.open) buildKeyList();
  }

  window.topoweb = {
    state: state, client: client, full: full, drawn: drawn, timing: timing, highlight: highlight,
    setOverlay: setOverlay, setSource: setSource, measuredLoaded: measuredLoaded, metricValues: metricValues,
    zoomTo: zoomTo, showPath: showPath, showMatrix: showMatrix, linkText: linkText, nicText: nicText,
    pending: pending, describeNode: describeNode, focusNode: focusNode,
  };
})();
