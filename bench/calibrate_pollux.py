"""Calibrate the cost model's allreduce against Pollux's measured sync times.

Data: /work/shared/data/traces/pollux_throughput_placements_by_app.csv, 5,542 rows
`app,placement,local_bsz,step_time,sync_time` measured by Pollux (OSDI'21) on nodes of 4 GPUs with
one NIC each; `placement` lists GPUs per node ("1122" = 4 nodes with 1, 1, 2, 2 GPUs); times in s.
`step_time - sync_time` is the same for every placement at a given local batch (the compute), so
`sync_time` is the communication left exposed after overlapping with the backward pass.

Model, per app (apps ran at different times, so each gets its own network):
- allreduce time `comm` (ms) of the placement, one of MODELS: one node with n GPUs runs
  `ring_allreduce_ms` over the node's fabric; across nodes "hierarchical" is
  `hierarchical_allreduce_ms(k_max, nodes, S, ..., rails=1)` (one NIC per node), exactly what
  `evaluate` charges; "flat" one ring over all GPUs at the NIC's rate; "nccl" what NCCL's tuner
  picks (it keeps separate tables for 1, 2 and more nodes): the flat ring on 2 nodes, where each
  NIC carries 2(K-1)/K of the gradient each way, and the pipelined double binary tree on 3 or more,
  where it carries the gradient once (`App.tree_allreduce_ms`). Every form is affine in the
  latencies and in S/B, so `comm = c0 + features . x`, c0 a constant per-step overhead (ms) and
  x = (a_intra us, a_inter us, S/B_intra ms, S/B_inter ms), all non-negative;
- overlap as in Pollux: `step = (compute^g + comm^g)^(1/g)` with g >= 1 (g = 1 no overlap, large g
  perfect overlap), so `sync = floor + h * compute + step - compute`, where `compute` is the
  single-GPU compute at the same local batch and `floor` the single-GPU sync (fit half), and h the
  fraction by which the overlapped allreduce kernels slow the backward pass (interference).
Fitted on the fit half: for each (g, h) on a grid, the comm each row implies is solved for c0 and
x by non-negative least squares in relative terms; the (g, h) with the least squared log error of
sync wins. S and B enter only as S/B: the scale is pinned by ImageNet's ResNet-50 (25.56M fp32
parameters = 102.2 MB), other apps' volumes are given at ImageNet's inter-node bandwidth.

Split: rows alternate by their index in the file; even rows fit, odd rows are scored. Every
(app, placement, local_bsz) occurs once, but node orders of one placement ("1212", "1122") are
separate runs of the same physical placement: "agg" scores the medians of held-out rows per (app,
sorted placement, local_bsz), "place" the means per placement over batch sizes. "ceiling" predicts
each held-out row from the fit half's rows of the same placement at other batch sizes (the same
run: its repeatability); "repeats" from the other node orders at the same batch size (another run:
the run-to-run spread no placement-level model can pass). `evaluate()` is checked against the
closed forms it charges (across nodes the faster of the hierarchical and the pipelined form,
`costmodel.spanning_ms`) on a 16-node x 4-GPU topology per app.

    .venv/bin/python bench/calibrate_pollux.py [--data PATH] [--model hierarchical|flat|nccl|all]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.costmodel import (  # noqa: E402
    evaluate,
    hierarchical_allreduce_ms,
    pipelined_ms,
    ring_allreduce_ms,
    volume_ms,
)
from apps.placement.jobs import load_job  # noqa: E402
from apps.placement.topology import load_topology  # noqa: E402

DATA = Path("/work/shared/data/traces/pollux_throughput_placements_by_app.csv")
ANCHOR_APP, ANCHOR_BYTES = "imagenet", 25_557_032 * 4
TARGET_SPEARMAN = 0.9
GAMMAS = np.round(np.arange(1.0, 8.01, 0.25), 2)
INTERFERENCES = np.round(np.arange(0.0, 0.301, 0.02), 2)
MIN_EXPOSED_MS = 0.5  # below this a row's sync is all floor and says nothing about comm
MODELS = {
    "hierarchical": "ring inside a node, hierarchical across nodes (evaluate() charges it or the pipelined form)",
    "flat": "one flat ring over all GPUs at the NIC's rate across nodes",
    "nccl": "NCCL's choice: flat ring on 2 nodes, double binary tree on 3 or more",
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


def median_rel_error(pred: np.ndarray, meas: np.ndarray) -> float:
    """Median of |pred - meas| / meas."""
    return float(np.median(np.abs(pred - meas) / meas))


def group_medians(keys, *columns: np.ndarray) -> list[np.ndarray]:
    """Median of each column over the rows sharing a key, one value per distinct key (sorted)."""
    _, inv = np.unique(np.asarray(keys), return_inverse=True)
    order = np.argsort(inv, kind="stable")
    bounds = np.flatnonzero(np.diff(inv[order])) + 1
    return [np.array([np.median(c) for c in np.split(col[order], bounds)]) for col in columns]


def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """x >= 0 minimising |a x - b|^2 (Lawson-Hanson active set)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(3 * n + 10):
        grad = a.T @ (b - a @ x)
        free = ~passive & (grad > tol * max(1.0, np.abs(grad).max()))
        if not free.any():
            break
        passive[np.argmax(np.where(free, grad, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            # Step back to the boundary and drop the variables that hit zero.
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def exposed_ms(compute_ms, comm_ms, gamma: float):
    """Comm time (ms) not hidden behind compute under Pollux's overlap: (c^g + m^g)^(1/g) - c."""
    c, m = np.asarray(compute_ms, float), np.asarray(comm_ms, float)
    return (c**gamma + m**gamma) ** (1.0 / gamma) - c


def implied_comm_ms(exposed, compute_ms, gamma: float):
    """The comm time (ms) whose exposed part over `compute_ms` is `exposed` (inverse of exposed_ms)."""
    c = np.asarray(compute_ms, float)
    return ((np.asarray(exposed, float) + c) ** gamma - c**gamma) ** (1.0 / gamma)


class App:
    """One app's rows as arrays: placement shape, compute time and measured sync (ms)."""

    def __init__(self, name: str, rows: list[dict], index: np.ndarray):
        self.name = name
        self.placement = np.array([r["placement"] for r in rows])
        self.shape_key = np.array(["".join(sorted(p)) for p in self.placement])
        counts = [np.array([int(c) for c in p]) for p in self.placement]
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
        own = (self.step_ms - self.sync_ms)[single][order]
        self.compute_ms = np.interp(self.bsz, self.bsz[single][order], own)
        self.floor_ms = float(np.median(self.sync_ms[single]))

    def comm_ms(self, model, nbytes, b_inter, a_inter, b_intra, a_intra) -> np.ndarray:
        """Allreduce time (ms) of every row's placement under `model` (see MODELS)."""
        one = ring_allreduce_ms(self.gpus, nbytes, b_intra, a_intra)
        if model == "flat":
            many = ring_allreduce_ms(self.gpus, nbytes, b_inter, a_inter)
        elif model == "nccl":
            ring = ring_allreduce_ms(self.gpus, nbytes, b_inter, a_inter)
            many = np.where(self.nodes == 2, ring, self.tree_allreduce_ms(nbytes, b_inter, a_inter, a_intra))
        else:
            many = hierarchical_allreduce_ms(
                self.k_max, self.nodes, nbytes, b_intra, a_intra, b_inter, a_inter, rails=1
            )
        return np.where(self.nodes > 1, many, one)

    def tree_allreduce_ms(self, nbytes, b_inter, a_inter, a_intra) -> np.ndarray:
        """Pipelined double binary tree (ms): every byte crosses a node's NIC once each way at
        the NIC's rate (the slowest stage), latency 2 ceil(log2 ranks) NIC hops plus the intra-node
        chain's 2 (k_max - 1) hops up and down."""
        depth = np.ceil(np.log2(np.maximum(self.gpus, 1)))
        hops = 2 * depth * np.asarray(a_inter) / 1e3 + 2 * (self.k_max - 1) * np.asarray(a_intra) / 1e3
        return np.asarray(volume_ms(nbytes, b_inter)) + hops

    def features(self, model: str) -> np.ndarray:
        """Columns of `comm = F @ (c0_ms, a_intra_us, a_inter_us, S/B_intra ms, S/B_inter ms)`."""
        inf = np.inf  # an infinitely fast link contributes nothing, isolating one term
        return np.stack(
            [
                np.ones(self.gpus.shape),
                self.comm_ms(model, 0.0, inf, 0.0, inf, 1.0),
                self.comm_ms(model, 0.0, inf, 1.0, inf, 0.0),
                self.comm_ms(model, 1e6, inf, 0.0, 1.0, 0.0),  # 1 MB at 1 GB/s is 1 ms
                self.comm_ms(model, 1e6, 1.0, 0.0, inf, 0.0),
            ],
            axis=1,
        )


@dataclass(frozen=True)
class AppFit:
    """One app's fitted model: overlap exponent g, interference h and the comm terms x =
    (c0 ms, a_intra us, a_inter us, S/B_intra ms, S/B_inter ms)."""

    model: str
    gamma: float
    interference: float
    x: np.ndarray
    loss: float

    def predict_ms(self, app: App) -> np.ndarray:
        """Predicted sync time (ms) of every row of `app`."""
        comm = app.features(self.model) @ self.x
        multi = app.gpus > 1
        extra = self.interference * app.compute_ms + exposed_ms(app.compute_ms, comm, self.gamma)
        return app.floor_ms + np.where(multi, extra, 0.0)


def fit_app(app: App, model: str) -> AppFit:
    """Least squared log error of sync on the app's multi-GPU fit rows, over the (g, h) grid."""
    m = app.fit & (app.gpus > 1)
    feats, compute, sync = app.features(model)[m], app.compute_ms[m], app.sync_ms[m]
    best = None
    for g in GAMMAS:
        for h in INTERFERENCES:
            left = np.maximum(sync - app.floor_ms - h * compute, MIN_EXPOSED_MS)
            target = implied_comm_ms(left, compute, g)
            w = 1.0 / target  # relative residuals: every placement counts alike
            x = nnls(feats * w[:, None], target * w)
            pred = app.floor_ms + h * compute + exposed_ms(compute, feats @ x, g)
            loss = float(np.mean(np.log(np.maximum(pred, 1e-9) / sync) ** 2))
            if best is None or loss < best.loss:
                best = AppFit(model, float(g), float(h), x, loss)
    return best


def load_apps(path: Path) -> dict[str, App]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    index = np.arange(len(rows))
    by_app: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_app[r["app"]].append(i)
    return {a: App(a, [rows[i] for i in ids], index[ids]) for a, ids in sorted(by_app.items())}


def lookup_ceiling(app: App) -> np.ndarray:
    """Each held-out row from the fit half's rows of the same placement (interpolated in
    local_bsz): the same run's other batch sizes; NaN where the fit half has none."""
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


def repeat_lookup(app: App) -> np.ndarray:
    """Each held-out row from the fit-half rows of the other node orders of its placement at the
    same local_bsz ("2112" for "1122"), a separate run of the same physical placement (median);
    NaN where there is none."""
    pred = np.full(app.sync_ms.shape, np.nan)
    keys = np.char.add(np.char.add(app.shape_key, "/"), app.bsz.astype(str))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    for ids in groups.values():
        for i in ids:
            others = [j for j in ids if app.fit[j] and app.placement[j] != app.placement[i]]
            if app.test[i] and others:
                pred[i] = np.median(app.sync_ms[others])
    return pred


def network(fits: dict[str, AppFit]) -> tuple[float, dict[str, dict]]:
    """Inter-node bandwidth (GB/s) pinned by the anchor app, and each app's network and volume."""
    anchor_inter_ms = fits[ANCHOR_APP].x[4]
    if anchor_inter_ms <= 0:
        raise SystemExit(f"{ANCHOR_APP}: fitted no inter-node bandwidth term, cannot pin the scale")
    b_inter = ANCHOR_BYTES / 1e6 / anchor_inter_ms  # MB / ms = GB/s
    out = {}
    for name, f in fits.items():
        c0, a_intra, a_inter, intra_ms, inter_ms = f.x
        nbytes = inter_ms * b_inter * 1e6
        out[name] = {
            "bytes": nbytes,
            "inter_bw_GBps": b_inter,
            "intra_bw_GBps": nbytes / 1e6 / intra_ms if intra_ms > 0 else np.inf,
            "inter_latency_us": a_inter,
            "intra_latency_us": a_intra,
            "c0_ms": c0,
        }
    return b_inter, out


def check_evaluate(
    nets: dict[str, dict], apps: dict[str, App], cap_GBps: float = 1e4, min_latency_us: float = 1e-3
) -> tuple[int, float]:
    """evaluate() on a 16-node x 4-GPU cluster with each app's fitted network vs the closed forms.

    Terms fitted to zero (an infinitely fast link, no latency) get `cap_GBps` and `min_latency_us`
    on both sides, as topology specs need finite positive values."""
    checked, worst = 0, 0.0
    for name, app in apps.items():
        net = dict(nets[name])
        for key in ("inter_bw_GBps", "intra_bw_GBps"):
            net[key] = min(net[key], cap_GBps)
        for key in ("inter_latency_us", "intra_latency_us"):
            net[key] = max(net[key], min_latency_us)
        if net["bytes"] <= 0:
            continue
        gen = {
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
        }
        topo = load_topology({"version": 1, "name": f"pollux-{name}", "generate": gen})
        hier = app.comm_ms(
            "hierarchical",
            net["bytes"],
            net["inter_bw_GBps"],
            net["inter_latency_us"],
            net["intra_bw_GBps"],
            net["intra_latency_us"],
        )
        # Across nodes evaluate() charges the faster of the hierarchical and pipelined forms.
        piped = pipelined_ms(
            "allreduce",
            app.gpus,
            app.k_max,
            app.nodes,
            net["bytes"],
            np.where(app.k_max > 1, net["intra_bw_GBps"], np.inf),
            net["intra_latency_us"],
            net["inter_bw_GBps"],
            net["inter_latency_us"],
            1,
        )
        closed = np.where(app.nodes > 1, np.minimum(hier, piped), hier)
        _, first = np.unique(app.placement, return_index=True)
        for i in first:
            gids = [node * 4 + g for node, k in enumerate(int(c) for c in app.placement[i]) for g in range(k)]
            job = load_job(
                {
                    "version": 1,
                    "name": f"{name}-{app.placement[i]}",
                    "gpus": len(gids),
                    "parallelism": {"dp": len(gids)},
                    "step": {"compute_ms": 0},
                    "comm": [{"group": "dp", "collective": "allreduce", "bytes": net["bytes"]}],
                }
            )
            got = evaluate(topo, job, gids, detail=False).comm_ms
            worst = max(worst, abs(got - closed[i]) / max(closed[i], 1e-12))
            checked += 1
    return checked, worst


def scores(app: App, pred: np.ndarray) -> dict[str, float]:
    """Held-out scores: Spearman over rows, over (sorted placement, bsz) medians and over
    placement means, and the median relative error over rows."""
    t = app.test
    meas, p = app.sync_ms[t], pred[t]
    keys = np.char.add(np.char.add(app.shape_key[t], "/"), app.bsz[t].astype(str))
    agg_p, agg_m = group_medians(keys, p, meas)
    _, inv = np.unique(app.placement[t], return_inverse=True)
    n = np.bincount(inv)
    place_p, place_m = np.bincount(inv, weights=p) / n, np.bincount(inv, weights=meas) / n
    return {
        "raw": spearman(p, meas),
        "agg": spearman(agg_p, agg_m),
        "place": spearman(place_p, place_m),
        "mre": median_rel_error(p, meas),
        "groups": len(agg_m),
    }


def report(model: str, apps: dict[str, App], fits: dict[str, AppFit]) -> None:
    """Print per-app scores on the held-out rows, the fitted values and the residual by node count."""
    b_inter, nets = network(fits)
    print(f"\n== {model}: {MODELS[model]}")
    print(
        f"{'app':12s} {'rows':>5s} {'groups':>6s} {'raw':>6s} {'agg':>6s} {'place':>6s} {'mre':>6s}"
        f"   ceiling: {'raw':>6s} {'agg':>6s} {'mre':>6s}   repeats: {'rows':>4s} {'raw':>6s} {'mre':>6s}"
    )
    all_pred, all_meas, all_ceil, met = [], [], [], {"raw": 0, "agg": 0, "ceil": 0}
    for name, app in apps.items():
        pred = fits[name].predict_ms(app)
        ceil = lookup_ceiling(app)
        ok = ~np.isnan(ceil)
        s = scores(app, pred)
        c = scores(app, np.where(ok, ceil, pred))
        rep = repeat_lookup(app)
        has = app.test & ~np.isnan(rep)
        t = app.test
        all_pred.append(pred[t])
        all_meas.append(app.sync_ms[t])
        all_ceil.append(np.where(ok, ceil, pred)[t])
        met["raw"] += s["raw"] >= TARGET_SPEARMAN
        met["agg"] += s["agg"] >= TARGET_SPEARMAN
        met["ceil"] += c["raw"] >= TARGET_SPEARMAN
        print(
            f"{name:12s} {t.sum():5d} {s['groups']:6d} {s['raw']:6.3f} {s['agg']:6.3f} {s['place']:6.3f} "
            f"{s['mre']:6.3f}            {c['raw']:6.3f} {c['agg']:6.3f} {c['mre']:6.3f}            "
            + (
                f"{has.sum():4d} {spearman(rep[has], app.sync_ms[has]):6.3f} "
                f"{median_rel_error(rep[has], app.sync_ms[has]):6.3f}"
                if has.sum() >= 3
                else f"{has.sum():4d}  (the split puts every repeat on one side)"
            )
        )
    pred, meas, ceil = (np.concatenate(x) for x in (all_pred, all_meas, all_ceil))
    rho = spearman(pred, meas)
    print(
        f"{'overall':12s} {len(meas):5d} {'':6s} {rho:6.3f} {'':6s} {'':6s} {median_rel_error(pred, meas):6.3f}"
        f"            {spearman(ceil, meas):6.3f} {'':6s} {median_rel_error(ceil, meas):6.3f}"
    )
    n = len(apps)
    print(
        f"target Spearman >= {TARGET_SPEARMAN}: overall {'met' if rho >= TARGET_SPEARMAN else 'not met'}; "
        f"per app raw {met['raw']}/{n}, agg {met['agg']}/{n} (lookup ceiling raw {met['ceil']}/{n})"
    )
    print(
        f"\nfitted, inter-node bandwidth {b_inter:.2f} GB/s pinned by {ANCHOR_APP} = {ANCHOR_BYTES / 1e6:.1f} MB"
    )
    print(
        f"{'app':12s} {'g':>5s} {'h':>5s} {'c0 ms':>7s} {'S MB':>7s} {'intra GB/s':>10s} {'a_intra us':>10s} "
        f"{'a_inter us':>10s}   held-out measured/predicted, median by nodes 2 3 4"
    )
    for name, app in apps.items():
        f, net = fits[name], nets[name]
        ratio = app.sync_ms / f.predict_ms(app)
        by_nodes = " ".join(f"{np.median(ratio[app.test & (app.nodes == k)]):5.2f}" for k in (2, 3, 4))
        print(
            f"{name:12s} {f.gamma:5.2f} {f.interference:5.2f} {net['c0_ms']:7.1f} {net['bytes'] / 1e6:7.1f} "
            f"{net['intra_bw_GBps']:10.2f} {net['intra_latency_us']:10.0f} {net['inter_latency_us']:10.0f}"
            f"   {by_nodes}"
        )
    if model == "hierarchical":
        checked, worst = check_evaluate(nets, apps)
        print(f"evaluate() vs closed forms on {checked} placements: worst relative difference {worst:.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--model", choices=(*MODELS, "all"), default="all")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"calibrate_pollux: skipped, data file {args.data} is absent")
        return 0
    apps = load_apps(args.data)
    if ANCHOR_APP not in apps:
        raise SystemExit(f"--data: no rows of the anchor app {ANCHOR_APP!r} to pin the bandwidth scale")
    print(
        f"Pollux calibration: {sum(len(a.sync_ms) for a in apps.values())} rows, fit on even rows, "
        "scored on odd rows; agg = medians per (sorted placement, local_bsz)"
    )
    for model in MODELS if args.model == "all" else (args.model,):
        report(model, apps, {name: fit_app(app, model) for name, app in apps.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
