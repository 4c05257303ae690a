"""Calibrate the cost model's allreduce against Pollux's measured sync times.

Data: /work/shared/data/traces/pollux_throughput_placements_by_app.csv, 5,542 rows
`app,placement,local_bsz,step_time,sync_time` measured by Pollux (OSDI'21) on nodes of 4 GPUs with
one NIC each; `placement` lists GPUs per node ("1122" = 4 nodes with 1, 1, 2, 2 GPUs); times in s.

Model (the cost model's closed forms, `apps.placement.costmodel`):
- one node with n GPUs: ring allreduce over the node's fabric, `ring_allreduce_ms(n, S, B_intra, a_intra)`;
- several nodes: `hierarchical_allreduce_ms(k_max, nodes, S, B_intra, a_intra, B_inter, a_inter,
  rails=1)` (one NIC per node), exactly what `evaluate` charges such a placement;
- the measured sync time is the part not hidden behind the backward pass, so
  `sync = floor + max(0, comm - overlap * compute)`, with `compute` the single-GPU step time at the
  same local batch size and `floor` the single-GPU sync time (both from the fit half).
Fitted: per app the gradient volume S (bytes) and `overlap`; for the network B_inter (GB/s),
a_inter (us), B_intra (GB/s), a_intra (us), shared by all apps. S and B enter only as S/B, so the
scale is pinned by one known volume: ImageNet's ResNet-50, 25.56M fp32 parameters = 102.2 MB.

Split: rows alternate by their index in the file; even rows fit, odd rows are predicted. Printed per
app and overall: Spearman rank correlation and median relative error of predicted vs measured sync
time on the held-out rows, Spearman over placements ("by place": per-placement means of those rows),
the fitted values, and for reference the scores of a lookup that
interpolates the fit half's own rows of the same placement (the measurements' repeatability, a
ceiling no placement-level model can pass). `evaluate()` is checked against the closed forms on a
16-node x 4-GPU topology built from the fitted network. `--model flat` (or `both`, the default) also
fits a single flat ring over all GPUs, to compare the hierarchical form against the simplest one.

    .venv/bin/python bench/calibrate_pollux.py [--data PATH] [--model hierarchical|flat|both]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.costmodel import evaluate, hierarchical_allreduce_ms, ring_allreduce_ms  # noqa: E402
from apps.placement.jobs import load_job  # noqa: E402
from apps.placement.topology import load_topology  # noqa: E402

DATA = Path("/work/shared/data/traces/pollux_throughput_placements_by_app.csv")
ANCHOR_APP, ANCHOR_BYTES = "imagenet", 25_557_032 * 4
TARGET_SPEARMAN = 0.9
MODELS = {
    "hierarchical": "what evaluate() charges: ring inside a node, hierarchical across nodes",
    "flat": "for comparison: one flat ring over all GPUs at the NIC's rate across nodes",
}


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank."""
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=r)
    return sums[inverse] / counts[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two equal-length arrays."""
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def placement_spearman(app: App, pred: np.ndarray) -> float:
    """Spearman over placements of held-out rows: mean predicted vs mean measured sync per placement."""
    keys = np.asarray(app.placement)[app.test]
    _, inv = np.unique(keys, return_inverse=True)
    counts = np.bincount(inv)
    return spearman(
        np.bincount(inv, weights=pred) / counts, np.bincount(inv, weights=app.sync_ms[app.test]) / counts
    )


def median_rel_error(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.median(np.abs(pred - meas) / meas))


def nelder_mead(f, x0, step=0.5, iters=400):
    """Minimise f from x0 by the Nelder-Mead simplex; returns (x, f(x))."""
    n = len(x0)
    pts = [np.asarray(x0, float)] + [np.asarray(x0, float) + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = np.mean(pts[:-1], axis=0)
        xr = centre + (centre - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centre + 2 * (centre - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centre + 0.5 * (pts[-1] - centre)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [f(p) for p in pts]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


class App:
    """One app's rows as arrays: placement shape, compute time and measured sync (ms)."""

    def __init__(self, name: str, rows: list[dict], index: np.ndarray):
        self.name = name
        self.placement = [r["placement"] for r in rows]
        counts = [np.array([int(c) for c in r["placement"]]) for r in rows]
        self.gpus = np.array([c.sum() for c in counts])
        self.nodes = np.array([len(c) for c in counts])
        self.k_max = np.array([c.max() for c in counts])
        self.bsz = np.array([int(r["local_bsz"]) for r in rows])
        self.step_ms = np.array([float(r["step_time"]) * 1e3 for r in rows])
        self.sync_ms = np.array([float(r["sync_time"]) * 1e3 for r in rows])
        self.fit = index % 2 == 0
        self.test = ~self.fit
        single = self.fit & (self.gpus == 1)
        if not single.any():
            raise SystemExit(f"{name}: no single-GPU rows in the fit half to measure compute time")
        order = np.argsort(self.bsz[single])
        self.compute_ms = np.interp(self.bsz, self.bsz[single][order], self.step_ms[single][order])
        self.floor_ms = float(np.median(self.sync_ms[single]))
        self.model = "hierarchical"

    def comm_ms(self, nbytes, b_inter, a_inter, b_intra, a_intra) -> np.ndarray:
        """Allreduce time (ms) of every row's placement under the cost model's closed forms."""
        one = ring_allreduce_ms(self.gpus, nbytes, b_intra, a_intra)
        if self.model == "flat":
            many = ring_allreduce_ms(self.gpus, nbytes, b_inter, a_inter)
        else:
            many = hierarchical_allreduce_ms(
                self.k_max, self.nodes, nbytes, b_intra, a_intra, b_inter, a_inter, rails=1
            )
        return np.where(self.nodes > 1, many, one)

    def comm_parts(self, net) -> tuple[np.ndarray, np.ndarray]:
        """The closed forms are affine in bytes: (latency ms, ms per GB) of every row."""
        latency = self.comm_ms(0.0, *net)
        return latency, self.comm_ms(1e9, *net) - latency

    def predict_ms(self, nbytes, overlap, net, parts=None) -> np.ndarray:
        latency, per_gb = self.comm_parts(net) if parts is None else parts
        exposed = latency + nbytes / 1e9 * per_gb - overlap * self.compute_ms
        return self.floor_ms + np.maximum(exposed, 0.0)


def load_apps(path: Path) -> dict[str, App]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    index = np.arange(len(rows))
    by_app: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_app[r["app"]].append(i)
    return {a: App(a, [rows[i] for i in ids], index[ids]) for a, ids in sorted(by_app.items())}


def fit(apps: dict[str, App]):
    """Least squares in log space on the fit half: network shared, volume and overlap per app.

    Parameters are fitted with B_inter = 1 GB/s (S is then in units of B_inter); the anchor app's
    known volume turns them into bytes and GB/s afterwards."""

    def app_loss(app, p, net, parts):
        pred = app.predict_ms(math.exp(p[0]) * 1e9, min(max(p[1], 0.0), 1.0), net, parts)
        m = app.fit & (app.gpus > 1)
        return float(np.mean((np.log(pred[m]) - np.log(app.sync_ms[m])) ** 2))

    def inner(g):
        net = (1.0, math.exp(g[0]), math.exp(g[1]), math.exp(g[2]))
        per_app, total = {}, 0.0
        for name, app in apps.items():
            guess = math.log(max(np.median(app.sync_ms[app.fit & (app.nodes > 1)]), 1e-3) / 1e3)
            parts = app.comm_parts(net)
            best = min(
                (
                    nelder_mead(
                        lambda p, a=app, parts=parts: app_loss(a, p, net, parts),
                        [guess + d, ov],
                        step=0.4,
                        iters=120,
                    )
                    for d, ov in ((0.0, 0.1), (0.7, 0.4))
                ),
                key=lambda r: r[1],
            )
            per_app[name] = best[0]
            total += best[1] * app.fit.sum()
        return total / sum(a.fit.sum() for a in apps.values()), per_app

    g, _ = nelder_mead(
        lambda g: inner(g)[0], [math.log(5.0), math.log(20.0), math.log(5.0)], step=1.0, iters=60
    )
    _, per_app = inner(g)
    scale = ANCHOR_BYTES / (math.exp(per_app[ANCHOR_APP][0]) * 1e9)  # GB/s of the real B_inter
    net = {
        "inter_bw_GBps": scale,
        "inter_latency_us": math.exp(g[0]),
        "intra_bw_GBps": math.exp(g[1]) * scale,
        "intra_latency_us": math.exp(g[2]),
    }
    params = {
        name: {"bytes": math.exp(p[0]) * 1e9 * scale, "overlap": min(max(p[1], 0.0), 1.0)}
        for name, p in per_app.items()
    }
    return net, params


def lookup_ceiling(app: App) -> np.ndarray:
    """Predict each held-out row from the fit half's rows of the same placement (interpolated in bsz)."""
    pred = np.full(app.sync_ms.shape, np.nan)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(app.placement):
        groups[p].append(i)
    for ids in groups.values():
        ids = np.asarray(ids)
        fit, test = ids[app.fit[ids]], ids[app.test[ids]]
        if fit.size and test.size:
            order = np.argsort(app.bsz[fit])
            pred[test] = np.interp(app.bsz[test], app.bsz[fit][order], app.sync_ms[fit][order])
    return pred


def check_evaluate(net: dict, params: dict, apps: dict[str, App]) -> tuple[int, float]:
    """evaluate() on a 16-node x 4-GPU cluster with the fitted network vs the closed forms (ms)."""
    topo = load_topology(
        {
            "version": 1,
            "name": "pollux-testbed",
            "generate": {
                "shape": "leaf-spine",
                "spines": 1,
                "leaves": 1,
                "nodes_per_leaf": 16,
                "gpus_per_node": 4,
                "gpu_model": "T4",
                "peak_tflops": 65,
                "nvlink_bw_GBps": net["intra_bw_GBps"],
                "nvlink_latency_us": net["intra_latency_us"],
                "nic_bw_GBps": net["inter_bw_GBps"],
                "nic_latency_us": net["inter_latency_us"] / 2,  # a path crosses two NICs
                "nics_per_node": 1,
                "uplink_bw_GBps": 100,
            },
        }
    )
    checked, worst = 0, 0.0
    for name, app in apps.items():
        s = params[name]["bytes"]
        closed = app.comm_ms(
            s, net["inter_bw_GBps"], net["inter_latency_us"], net["intra_bw_GBps"], net["intra_latency_us"]
        )
        seen = {}
        for i, p in enumerate(app.placement):
            seen.setdefault(p, i)
        for p, i in seen.items():
            gids = [node * 4 + g for node, k in enumerate(int(c) for c in p) for g in range(k)]
            job = load_job(
                {
                    "version": 1,
                    "name": f"{name}-{p}",
                    "gpus": len(gids),
                    "parallelism": {"dp": len(gids)},
                    "step": {"compute_ms": 0},
                    "comm": [{"group": "dp", "collective": "allreduce", "bytes": s}],
                }
            )
            got = evaluate(topo, job, gids).comm_ms
            worst = max(worst, abs(got - closed[i]) / max(closed[i], 1e-12))
            checked += 1
    return checked, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--model", choices=(*MODELS, "both"), default="both")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"calibrate_pollux: skipped, data file {args.data} is absent")
        return 0
    apps = load_apps(args.data)
    print(
        f"Pollux calibration: {sum(len(a.sync_ms) for a in apps.values())} rows, fit on even rows, scored on odd rows"
    )
    for model in MODELS if args.model == "both" else (args.model,):
        for app in apps.values():
            app.model = model
        net, params = fit(apps)
        report(model, apps, net, params)
        if model == "hierarchical":
            checked, worst = check_evaluate(net, params, apps)
            print(
                f"evaluate() vs closed forms on {checked} placements: worst relative difference {worst:.1e}"
            )
    return 0


def report(model: str, apps: dict[str, App], net: dict, params: dict) -> None:
    """Print the fitted network and per-app scores on the held-out rows."""
    print(f"\n== {model}: {MODELS[model]}")
    print(
        "network: inter {inter_bw_GBps:.2f} GB/s, {inter_latency_us:.0f} us; "
        "intra {intra_bw_GBps:.2f} GB/s, {intra_latency_us:.0f} us".format(**net)
    )
    print(f"(scale pinned by {ANCHOR_APP} = {ANCHOR_BYTES / 1e6:.1f} MB of fp32 gradients)")
    header = (
        f"{'app':12s} {'rows':>5s} {'spearman':>9s} {'med.rel.err':>11s} {'by place':>8s} {'S (MB)':>8s} "
        f"{'overlap':>8s}   lookup ceiling: spearman, med.rel.err"
    )
    print(header)
    all_pred, all_meas, all_ceil = [], [], []
    net_args = (net["inter_bw_GBps"], net["inter_latency_us"], net["intra_bw_GBps"], net["intra_latency_us"])
    for name, app in apps.items():
        p = params[name]
        pred = app.predict_ms(p["bytes"], p["overlap"], net_args)[app.test]
        meas = app.sync_ms[app.test]
        ceil = lookup_ceiling(app)[app.test]
        ok = ~np.isnan(ceil)
        all_pred.append(pred)
        all_meas.append(meas)
        all_ceil.append(np.where(ok, ceil, pred))
        print(
            f"{name:12s} {len(meas):5d} {spearman(pred, meas):9.3f} {median_rel_error(pred, meas):11.3f} "
            f"{placement_spearman(app, pred):8.3f} {p['bytes'] / 1e6:8.1f} {p['overlap']:8.2f}   {spearman(ceil[ok], meas[ok]):.3f}, "
            f"{median_rel_error(ceil[ok], meas[ok]):.3f}"
        )
    pred, meas, ceil = (np.concatenate(x) for x in (all_pred, all_meas, all_ceil))
    rho = spearman(pred, meas)
    print(
        f"{'overall':12s} {len(meas):5d} {rho:9.3f} {median_rel_error(pred, meas):11.3f} {'':8s} {'':8s} {'':8s}   "
        f"{spearman(ceil, meas):.3f}, {median_rel_error(ceil, meas):.3f}"
    )
    per_app = [
        spearman(a.predict_ms(params[n]["bytes"], params[n]["overlap"], net_args)[a.test], a.sync_ms[a.test])
        for n, a in apps.items()
    ]
    print(
        f"target Spearman >= {TARGET_SPEARMAN}: overall {'met' if rho >= TARGET_SPEARMAN else 'not met'}, "
        f"{sum(r >= TARGET_SPEARMAN for r in per_app)}/{len(per_app)} apps"
    )


if __name__ == "__main__":
    raise SystemExit(main())
