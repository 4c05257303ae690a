"""dcgm-exporter and node-exporter text (no Django).

`parse_scrape(text, n_gpus=...)` turns one node's scrape into per-GPU readings (one per whole GPU
and one per MIG instance, `GPU_I_ID`) and per-port InfiniBand byte counters. Only the fields of
`GPU_FIELDS` are kept; a field the exporter does not send stays absent (never zero), and a value
outside its physical range is dropped and reported in `rejected`.

Two parsers give the same Scrape: `parse_scrape_reference` reads every sample with
prometheus-client's parser; `parse_scrape` (what collection uses, several times faster) checks
each line against the text format as exporters write it (one compiled pattern per line), reads
labels and values of the kept fields only, and hands any page it does not read that way (escaped
label values, odd spacing, a field typed counter, garbage) to the reference parser, which parses
it or raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """Where a DCGM field goes: the stored name (with its unit), the factor to that unit, and the
    physical range of the stored value."""

    name: str
    scale: float
    low: float
    high: float


FRACTION_SLACK = 1.05  # DCGM ratios overshoot 1.0 slightly (0.9956 busy reads as 1.0003); clamp those
GPU_FIELDS: Mapping[str, FieldSpec] = {
    "DCGM_FI_DEV_GPU_UTIL": FieldSpec("gpu_util", 0.01, 0.0, FRACTION_SLACK),  # sent in percent
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": FieldSpec("gr_engine_active", 1.0, 0.0, FRACTION_SLACK),
    "DCGM_FI_PROF_SM_ACTIVE": FieldSpec("sm_active", 1.0, 0.0, FRACTION_SLACK),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": FieldSpec("tensor_active", 1.0, 0.0, FRACTION_SLACK),
    "DCGM_FI_PROF_DRAM_ACTIVE": FieldSpec("dram_active", 1.0, 0.0, FRACTION_SLACK),
    "DCGM_FI_PROF_PCIE_TX_BYTES": FieldSpec("pcie_tx_Bps", 1.0, 0.0, 1e12),
    "DCGM_FI_PROF_PCIE_RX_BYTES": FieldSpec("pcie_rx_Bps", 1.0, 0.0, 1e12),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": FieldSpec("nvlink_tx_Bps", 1.0, 0.0, 1e13),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": FieldSpec("nvlink_rx_Bps", 1.0, 0.0, 1e13),
    "DCGM_FI_DEV_POWER_USAGE": FieldSpec("power_W", 1.0, 0.0, 5000.0),
    "DCGM_FI_DEV_GPU_TEMP": FieldSpec("temp_C", 1.0, -40.0, 150.0),
    "DCGM_FI_DEV_XID_ERRORS": FieldSpec("xid_last", 1.0, 0.0, 1e6),
}
FRACTION_FIELDS = frozenset({"gpu_util", "gr_engine_active", "sm_active", "tensor_active", "dram_active"})
VALUE_FIELDS: tuple[str, ...] = tuple(spec.name for spec in GPU_FIELDS.values())

IB_TX = "node_infiniband_port_data_transmitted_bytes_total"
IB_RX = "node_infiniband_port_data_received_bytes_total"
IB_FIELDS = {IB_TX: "tx_bytes_total", IB_RX: "rx_bytes_total"}
IB_MAX_BYTES = 1e22  # a counter past this is not a real port's lifetime traffic

MAX_REJECTED = 20  # messages kept per scrape; the count is kept in full
MAX_MIG_INSTANCES = 16  # MIG allows at most 7 per GPU; more is a malformed scrape
MIG_ID_MAX_LENGTH = 8


@dataclass(slots=True)
class GpuReading:
    """One GPU (instance "") or one of its MIG instances (instance = GPU_I_ID): field -> value."""

    gpu: int
    instance: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class NicReading:
    """One InfiniBand port's cumulative byte counters (node-exporter), None when not sent."""

    device: str
    port: str
    tx_bytes_total: float | None = None
    rx_bytes_total: float | None = None


@dataclass(slots=True)
class Scrape:
    """A parsed scrape: readings by (gpu, instance), NIC ports by (device, port), and what was
    dropped (first MAX_REJECTED messages, and how many in all)."""

    gpus: dict[tuple[int, str], GpuReading] = field(default_factory=dict)
    nics: dict[tuple[str, str], NicReading] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    rejected_count: int = 0

    def reject(self, message: str) -> None:
        self.rejected_count += 1
        if len(self.rejected) < MAX_REJECTED:
            self.rejected.append(message)


def field_value(metric: str, value: float) -> tuple[str, float] | None | str:
    """(stored field, value in its unit) for a DCGM metric; None if the metric is not one we keep;
    a message (str) if the value is outside the field's physical range or not finite."""
    spec = GPU_FIELDS.get(metric)
    if spec is None:
        return None
    if not math.isfinite(value):
        return f"{metric}: not a finite number ({value!r})"
    v = value * spec.scale
    if not spec.low <= v <= spec.high:
        return f"{metric}: {v:g} outside {spec.low:g}..{spec.high:g}"
    if spec.name in FRACTION_FIELDS:
        v = min(v, 1.0)
    return spec.name, v


def gpu_label(labels: Mapping[str, str], n_gpus: int | None, label: str = "gpu") -> int | str:
    """The GPU index a sample names (its `label`), or a message when it is missing or out of range."""
    raw = labels.get(label, "")
    if not raw.isdigit() or len(raw) > 4:
        return f"{label}={raw!r}: not a GPU index"
    gpu = int(raw)
    if n_gpus is not None and gpu >= n_gpus:
        return f"{label}={gpu}: the node has {n_gpus} GPUs"
    return gpu


def mig_instance(labels: Mapping[str, str]) -> str | None:
    """The MIG instance id ("" for a whole GPU), or None when GPU_I_ID is not a short number."""
    raw = labels.get("GPU_I_ID", "")
    if raw == "":
        return ""
    return raw if raw.isdigit() and len(raw) <= MIG_ID_MAX_LENGTH else None


def add_gpu_sample(
    scrape: Scrape, metric: str, labels: Mapping[str, str], value: float, gpu: int | str
) -> None:
    """Record one DCGM sample for GPU `gpu` (or the message why its GPU is unknown)."""
    kept = field_value(metric, value)
    if kept is None:
        return
    if isinstance(gpu, str):
        scrape.reject(f"{metric}: {gpu}")
        return
    if isinstance(kept, str):
        scrape.reject(f"{kept} (gpu {gpu})")
        return
    instance = mig_instance(labels)
    if instance is None:
        scrape.reject(f"{metric}: GPU_I_ID={labels.get('GPU_I_ID')!r} is not an instance id")
        return
    key = (gpu, instance)
    reading = scrape.gpus.get(key)
    if reading is None:
        if instance and sum(1 for g, i in scrape.gpus if g == gpu and i) >= MAX_MIG_INSTANCES:
            scrape.reject(f"{metric}: more than {MAX_MIG_INSTANCES} MIG instances on gpu {gpu}")
            return
        reading = scrape.gpus[key] = GpuReading(gpu, instance)
    name, v = kept
    reading.values[name] = v


def add_nic_sample(scrape: Scrape, metric: str, labels: Mapping[str, str], value: float) -> None:
    """Record one node-exporter InfiniBand byte counter."""
    device, port = labels.get("device", ""), labels.get("port", "")
    if not device or len(device) > 64 or len(port) > 8:
        scrape.reject(f"{metric}: device={device!r} port={port!r} is not a port")
        return
    if not (math.isfinite(value) and 0 <= value <= IB_MAX_BYTES):
        scrape.reject(f"{metric}: {value!r} is not a byte count ({device} port {port})")
        return
    nic = scrape.nics.setdefault((device, port), NicReading(device, port))
    setattr(nic, IB_FIELDS[metric], value)


def parse_scrape_reference(text: str, *, n_gpus: int | None = None) -> Scrape:
    """Parse one node's exporter text with prometheus-client's parser. Raises ValueError when the
    text is not the Prometheus text format (garbage, a truncated line); samples of fields we do
    not keep are skipped."""
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in IB_FIELDS:
                add_nic_sample(scrape, name, sample.labels, sample.value)
            elif name in GPU_FIELDS:
                add_gpu_sample(scrape, name, sample.labels, sample.value, gpu_label(sample.labels, n_gpus))
    return scrape


# One sample line as exporters write it: a legacy metric name, labels whose values need no escape
# (names not starting with "__"), a value of at most 40 characters, an optional integer timestamp,
# spaces between them.
_LABEL = r'(?:[a-zA-Z]|_[a-zA-Z0-9])[a-zA-Z0-9_]*="[^"\\\n]*"'
_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"
    rf"(?:\{{((?:{_LABEL},)*(?:{_LABEL},?)?)\}})?"
    r" +([-+]?(?:[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|Inf))"
    r"(?: +-?[0-9]{1,20})?[ \t\r]*"
)
_LABEL_PAIR = re.compile(r'([a-zA-Z0-9_]+)="([^"]*)"')
_INTEGER = re.compile(r"[-+]?[0-9]+")
# HELP and TYPE lines the reference parser reads alike; TYPE with one of its five types.
_HELP = re.compile(r"# HELP [a-zA-Z_:][a-zA-Z0-9_:]*(?:[ \t].*)?")
_TYPE = re.compile(r"# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|untyped|summary|histogram)[ \t\r]*")
# A counter family not named *_total: prometheus-client renames its samples NAME_total.
_RENAMED_BY_COUNTER = frozenset(GPU_FIELDS) | {name.removesuffix("_total") for name in IB_FIELDS}
_MAX_VALUE_CHARS = 40


class _NotCanonical(Exception):
    """A line the fast parser does not read; the reference parser decides."""


def parse_scrape(text: str, *, n_gpus: int | None = None) -> Scrape:
    """Parse one node's exporter text: the same Scrape as `parse_scrape_reference` (and the same
    ValueError on text that is not the Prometheus text format), reading only the kept fields."""
    try:
        return _parse_canonical(text, n_gpus)
    except _NotCanonical:
        return parse_scrape_reference(text, n_gpus=n_gpus)


def _parse_canonical(text: str, n_gpus: int | None) -> Scrape:
    scrape = Scrape()
    match_sample = _SAMPLE.fullmatch
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        if line[0] == "#":
            # Other comments are skipped; one that may be a HELP or TYPE line must be canonical.
            if "HELP" in line or "TYPE" in line or not line.startswith("# "):
                _comment(line)
            continue
        m = match_sample(line)
        if m is None:
            raise _NotCanonical
        name, body = m.group(1, 2)
        pairs = _LABEL_PAIR.findall(body) if body else ()
        labels = dict(pairs)
        if len(labels) != len(pairs):
            raise _NotCanonical  # a label named twice: an error there
        if name not in GPU_FIELDS and name not in IB_FIELDS:
            continue
        raw = m.group(3)
        if len(raw) > _MAX_VALUE_CHARS:
            raise _NotCanonical  # a number too long for a float: not read alike
        value = int(raw) if _INTEGER.fullmatch(raw) else float(raw)
        if name in IB_FIELDS:
            add_nic_sample(scrape, name, labels, value)
        else:
            add_gpu_sample(scrape, name, labels, value, gpu_label(labels, n_gpus))
    return scrape


def _comment(line: str) -> None:
    """A comment line read as the reference parser reads it, or _NotCanonical."""
    if line.startswith("# HELP "):
        if _HELP.fullmatch(line) is None:
            raise _NotCanonical
        return
    typed = _TYPE.fullmatch(line)
    if typed is None or (typed.group(2) == "counter" and typed.group(1) in _RENAMED_BY_COUNTER):
        raise _NotCanonical


def exposition_lines(metric: str, rows: Iterable[tuple[Mapping[str, str], float]], help_text: str) -> str:
    """Text-format lines of one gauge family (used by the simulated exporter)."""
    out = [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
    for labels, value in rows:
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        out.append(f"{metric}{{{body}}} {value:.6g}")
    return "\n".join(out) + "\n"
