"""Writing one collection pass: latest values per GPU, raw samples, NIC counters and node states,
each as one bulk statement (upserts on SQLite and Postgres alike)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count

from apps.topology.models import Cluster, Gpu, Node
from topoweb.postgres import prepared
from topoweb.postgres.arrays import array_literal, unnest_sql

from .choices import ScrapeState
from .exposition import VALUE_FIELDS, NicReading, Scrape
from .models import GpuLatest, GpuSample, NicLatest, NodeScrape
from .sources import NodeResult, Target

BATCH = 2000
STALE_INTERVALS = 4  # a failed node's last values stay usable (stale) for this many intervals


@dataclass(frozen=True, slots=True)
class Stored:
    """What a pass wrote: nodes read and failed, GPU readings (whole GPUs and MIG instances)."""

    nodes_ok: int
    nodes_failed: int
    readings: int


_GPU_PKS: dict[tuple[int, datetime], dict[tuple[int, int], int]] = {}
_GPU_PKS_LOCK = threading.Lock()


def gpu_pks(*, cluster: Cluster) -> dict[tuple[int, int], int]:
    """(node id, GPU index) -> Gpu row id, cached per cluster and `updated_at`."""
    key = (cluster.pk, cluster.updated_at)
    with _GPU_PKS_LOCK:
        cached = _GPU_PKS.get(key)
    if cached is not None:
        return cached
    pks = {
        (node_id, index): pk
        for pk, node_id, index in Gpu.objects.filter(node__cluster=cluster).values_list(
            "pk", "node_id", "index"
        )
    }
    with _GPU_PKS_LOCK:
        for old in [k for k in _GPU_PKS if k[0] == cluster.pk]:
            del _GPU_PKS[old]
        _GPU_PKS[key] = pks
    return pks


def cluster_targets(*, cluster: Cluster) -> list[Target]:
    """Every node of the cluster as a collection target, in node order."""
    rows = (
        Node.objects.filter(cluster=cluster)
        .annotate(n_gpus=Count("gpus"))
        .order_by("position", "id")
        .values_list("id", "name", "dcgm_url", "n_gpus")
    )
    return [Target(pk, name, url or "", n) for pk, name, url, n in rows]


GPU_COLUMNS = ("gpu_id", "instance", "at", *VALUE_FIELDS)


def _gpu_rows(results: Iterable[NodeResult], pks: dict[tuple[int, int], int], now: datetime) -> list[tuple]:
    """One (gpu_id, instance, at, *values) tuple per reading of a known GPU."""
    rows = []
    for result in results:
        scrape: Scrape = result.scrape
        for (index, instance), reading in scrape.gpus.items():
            pk = pks.get((result.node_id, index))
            if pk is not None:
                get = reading.values.get
                rows.append((pk, instance, now, *(get(name) for name in VALUE_FIELDS)))
    return rows


def _write_gpu_rows(rows: list[tuple]) -> None:
    """Append the raw samples and upsert the latest values: COPY on Postgres (a 16k-GPU pass in
    a fraction of a second), bulk statements elsewhere (SQLite, the embedded default)."""
    if connection.vendor == "postgresql":
        _copy_gpu_rows(rows)
        return
    GpuLatest.objects.bulk_create(
        [GpuLatest(**dict(zip(GPU_COLUMNS, r, strict=True))) for r in rows],
        batch_size=BATCH,
        update_conflicts=True,
        unique_fields=["gpu", "instance"],
        update_fields=["at", *VALUE_FIELDS],
    )
    GpuSample.objects.bulk_create(
        [GpuSample(**dict(zip(GPU_COLUMNS, r, strict=True))) for r in rows], batch_size=BATCH
    )


def _copy_gpu_rows(rows: list[tuple]) -> None:
    qn = connection.ops.quote_name  # the unit-named columns (pcie_tx_Bps) are case-sensitive
    cols = ", ".join(qn(c) for c in GPU_COLUMNS)
    sample_table, latest_table = qn(GpuSample._meta.db_table), qn(GpuLatest._meta.db_table)
    updates = ", ".join(f"{qn(c)} = EXCLUDED.{qn(c)}" for c in ("at", *VALUE_FIELDS))
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        with raw.copy(f"COPY {sample_table} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        raw.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS metrics_latest_in ON COMMIT DELETE ROWS AS"
            f" SELECT {cols} FROM {latest_table} WITH NO DATA"
        )
        # Emptied at commit; also now, for a second pass inside one transaction (tests, a retry).
        raw.execute("DELETE FROM metrics_latest_in")
        with raw.copy(f"COPY metrics_latest_in ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        raw.execute(
            f"INSERT INTO {latest_table} ({cols}) SELECT {cols} FROM metrics_latest_in"
            f" ON CONFLICT (gpu_id, instance) DO UPDATE SET {updates}"
        )


NIC_COLUMNS = ("node_id", "device", "port", "at", "tx_bytes_total", "rx_bytes_total", "tx_Bps", "rx_Bps")


def _nic_rows(
    per_node: Iterable[tuple[int, Mapping[tuple[str, str], NicReading]]], now: datetime
) -> list[tuple]:
    """NIC_COLUMNS tuples of (node id, its NIC counters by (device, port)), each with its rates
    since the node's previous counters."""
    ok = [(node_id, nics) for node_id, nics in per_node if nics]
    if not ok:
        return []
    previous = _previous_nics([node_id for node_id, _ in ok])
    rows = []
    for node_id, nics in ok:
        for (device, port), nic in nics.items():
            tx_rate = rx_rate = None
            before = previous.get((node_id, device, port))
            if before is not None:
                seconds = (now - before[0]).total_seconds()
                tx_rate = _rate(before[1], nic.tx_bytes_total, seconds)
                rx_rate = _rate(before[2], nic.rx_bytes_total, seconds)
            rows.append(
                (node_id, device, port, now, nic.tx_bytes_total, nic.rx_bytes_total, tx_rate, rx_rate)
            )
    return rows


def _previous_nics(node_ids: list[int]) -> dict[tuple[int, str, str], tuple]:
    """The stored counters of these nodes' ports: (node id, device, port) -> (at, tx, rx). Every
    agent's sync asks this for its own node: a prepared statement on Postgres, values elsewhere."""
    if prepared.prepared():
        [rows] = prepared.fetch_all([(_nic_sql().previous, [array_literal(node_ids)])])
    else:
        rows = (
            NicLatest.objects.filter(node_id__in=node_ids)
            .order_by()
            .values_list("node_id", "device", "port", "at", "tx_bytes_total", "rx_bytes_total")
        )
    return {(node_id, device, port): (at, tx, rx) for node_id, device, port, at, tx, rx in rows}


def _write_nic_rows(rows: list[tuple]) -> None:
    """Upsert NIC_COLUMNS tuples. On Postgres one prepared statement whatever the number of rows,
    its values as one array literal per column (an agent's sync writes its node's ports, the
    exporters' pass every node's); elsewhere one INSERT ... ON CONFLICT DO UPDATE per BATCH rows,
    written once per row count."""
    if not rows:
        return
    if prepared.prepared():
        # Each column one array literal (psycopg would dump a list element by element, in Python).
        prepared.execute(_nic_sql().upsert, [array_literal(column) for column in zip(*rows, strict=True)])
        return
    at = NicLatest._meta.get_field("at")
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        params = []
        for row in batch:
            params.extend((*row[:3], at.get_db_prep_save(row[3], connection), *row[4:]))
        with connection.cursor() as cursor:
            cursor.execute(_nic_upsert_sql(len(batch)), params)


@dataclass(frozen=True, slots=True)
class _NicSql:
    previous: str
    upsert: str


@functools.cache
def _nic_sql() -> _NicSql:
    """Postgres's statements of the NIC counters (`_previous_nics`, `_write_nic_rows`)."""
    qn = connection.ops.quote_name
    read = ", ".join(qn(c) for c in ("node_id", "device", "port", "at", "tx_bytes_total", "rx_bytes_total"))
    arrays = unnest_sql([NicLatest._meta.get_field(c) for c in NIC_COLUMNS])
    return _NicSql(
        previous=f"SELECT {read} FROM {qn(NicLatest._meta.db_table)} WHERE node_id = ANY(%s::bigint[])",
        upsert=_nic_upsert(f"SELECT * FROM {arrays}"),
    )


@functools.lru_cache(maxsize=64)
def _nic_upsert_sql(count: int) -> str:
    row = f"({', '.join(['%s'] * len(NIC_COLUMNS))})"
    return _nic_upsert(f"VALUES {', '.join([row] * count)}")


def _nic_upsert(rows: str) -> str:
    """The NIC counters' upsert of `rows` (VALUES or a SELECT of NIC_COLUMNS)."""
    qn = connection.ops.quote_name  # tx_Bps and rx_Bps are case-sensitive
    cols = ", ".join(qn(c) for c in NIC_COLUMNS)
    updates = ", ".join(f"{qn(c)} = EXCLUDED.{qn(c)}" for c in NIC_COLUMNS[3:])
    return (
        f"INSERT INTO {qn(NicLatest._meta.db_table)} ({cols}) {rows}"
        f" ON CONFLICT (node_id, device, port) DO UPDATE SET {updates}"
    )


def agent_nics_store(*, node_id: int, counters: Iterable[Mapping], now: datetime) -> int:
    """Store the NIC byte counters a node agent sent in its sync ({device, port, tx_bytes,
    rx_bytes}, as the agent's `nics.nic_counters` reads them from sysfs): the same rows and rates
    as an exporter's InfiniBand counters. Returns how many ports were stored."""
    nics = {
        (c["device"], c["port"]): NicReading(c["device"], c["port"], c.get("tx_bytes"), c.get("rx_bytes"))
        for c in counters
    }
    rows = _nic_rows([(node_id, nics)], now)
    _write_nic_rows(rows)
    return len(rows)


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    # A counter that went down was reset (driver reload): no rate for this interval.
    if before is None or after is None or seconds <= 0 or after < before:
        return None
    return (after - before) / seconds


def _states(results: Sequence[NodeResult], now: datetime, stale_s: float) -> list[NodeScrape]:
    known = {
        s.node_id: s
        for s in NodeScrape.objects.filter(node_id__in=[r.node_id for r in results]).only(
            "node_id", "last_success_at", "last_error", "last_error_at"
        )
    }
    rows = []
    for r in results:
        before = known.get(r.node_id)
        row = NodeScrape(
            node_id=r.node_id,
            last_attempt_at=now,
            duration_ms=r.fetch_ms + r.parse_ms,
            last_success_at=before.last_success_at if before else None,
            last_error=before.last_error if before else "",
            last_error_at=before.last_error_at if before else None,
        )
        if r.ok:
            row.state = ScrapeState.OK
            row.last_success_at = now
            row.gpus_read = len(r.scrape.gpus)
            row.rejected = r.scrape.rejected_count
            if r.scrape.rejected:
                row.last_error, row.last_error_at = "; ".join(r.scrape.rejected[:5]), now
        else:
            recent = row.last_success_at is not None and now - row.last_success_at <= timedelta(
                seconds=stale_s
            )
            row.state = ScrapeState.STALE if recent else ScrapeState.ERROR
            row.last_error, row.last_error_at = r.error, now
        rows.append(row)
    return rows


STATE_FIELDS = [
    "state",
    "last_attempt_at",
    "last_success_at",
    "last_error",
    "last_error_at",
    "duration_ms",
    "gpus_read",
    "rejected",
]


def results_store(
    *, cluster: Cluster, results: Sequence[NodeResult], now: datetime, interval_s: float
) -> Stored:
    """Write one pass: upsert latest values and NIC counters of the nodes read, append raw samples,
    and upsert every node's state. A failed node keeps its earlier values."""
    ok = [r for r in results if r.ok]
    rows = _gpu_rows(ok, gpu_pks(cluster=cluster), now)
    nics = _nic_rows(((r.node_id, r.scrape.nics) for r in ok), now)
    states = _states(results, now, stale_s=STALE_INTERVALS * interval_s)
    with transaction.atomic():
        _write_gpu_rows(rows)
        _write_nic_rows(nics)
        NodeScrape.objects.bulk_create(
            states,
            batch_size=BATCH,
            update_conflicts=True,
            unique_fields=["node"],
            update_fields=STATE_FIELDS,
        )
    return Stored(len(ok), len(results) - len(ok), len(rows))
