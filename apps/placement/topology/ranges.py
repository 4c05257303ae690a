"""Physical ranges of every numeric field and the size limits of job and topology spec v1.

What the loaders accept (documented in docs/spec-limits.md). A value outside its range is an error
naming the field. The ranges hold the largest hardware we know of with room to spare, and keep every
cost-model result finite: the slowest path (MIN_BW_GBps) carrying the largest payload
(MAX_COMM_BYTES) MAX_COMM_COUNT times in each of MAX_COMM_ENTRIES entries is about 6e18 ms.
"""

from __future__ import annotations

import re

# Names: cluster, switch, node, NIC, NVLink domain and job names are host-name-like, so that they
# are safe in a shell word, a hostfile line or a URL path segment.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
NAME_RE = re.compile(rf"^{NAME_PATTERN}\Z")
NAME_HELP = (
    "a non-empty string of at most 100 letters, digits, '.', '_' and '-', starting with a letter or digit"
)
# GPU model names may also hold spaces and parentheses ("NVIDIA H100 80GB HBM3" as nvidia-smi says).
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._()+ -]{0,98}[A-Za-z0-9._()+-])?\Z")
GPU_MODEL_HELP = f"{NAME_HELP} (inner spaces, '(', ')' and '+' allowed)"
MAX_URL_CHARS = 200
# Job spec `user`: a Django user name (letters, digits and @.+-_).
USER_RE = re.compile(r"^[\w.@+-]{1,150}\Z")
USER_HELP = "a non-empty string of at most 150 letters, digits and @ . + - _"

# Cluster size: the largest cluster TopoWeb supports.
MAX_CLUSTER_GPUS = 131_072
MAX_NODES = 32_768
MAX_NODE_GPUS = 128
MAX_NODE_NICS = 64
MAX_SWITCHES = 16_384
MAX_LINKS = 262_144
MAX_GPU_MODELS = 64

# Hardware figures.
MAX_PEAK_TFLOPS = 100_000.0  # dense per GPU; today's largest are below 10,000
MIN_PEAK_TFLOPS = 1e-3  # one GFLOPS: below any accelerator, and keeps every MFU finite
# A GPU model's measured relative speed (`gpu_models.<m>.speed`): only ratios between models count,
# and the range keeps the largest ratio (1e6) times the longest step (MAX_COMPUTE_MS) finite.
MIN_GPU_SPEED = 1e-3
MAX_GPU_SPEED = 1_000.0
# GPU models a job may name in `gpu_models`.
MAX_JOB_GPU_MODELS = 16
MIN_BW_GBps = 0.01  # 80 Mbit/s, a slow management network
MAX_BW_GBps = 1_000_000.0  # per GPU in an NVLink domain, per NIC, per cable or bundle of cables
MAX_LATENCY_US = 1_000_000.0  # one second

# Generator counts (`generate:`); the totals are checked against the cluster limits above.
MAX_GEN_SWITCHES = 4_096  # spines, leaves, cores per pod
MAX_GEN_PODS = 1_024
MAX_GEN_NODES_PER_LEAF = 1_024
MAX_NVLINK_DOMAIN_NODES = 1_024

# Job spec v1. Every float field has a physical lower bound above 0 (a field that may be 0 is 0 or
# at least that bound): a subnormal (5e-324) divided into anything, or scaled by 1e-3, gives a
# division by zero or an overflow in a derived quantity (MFU, needed TFLOPS, step time).
MIN_FLOPS_PER_STEP = 1.0
MIN_COMPUTE_MS = 1e-3  # one microsecond per step
MIN_COMM_BYTES = 1.0  # a collective of less than one byte is none: write 0
MIN_RUNTIME_S = 1e-3
MAX_PRIORITY = 1_000_000  # priorities run from -MAX_PRIORITY to MAX_PRIORITY
MAX_FLOPS_PER_STEP = 1e24
MAX_COMPUTE_MS = 3_600_000.0  # one hour per step
MAX_COMM_BYTES = 1e15  # 1 PB per rank per step
MAX_COMM_COUNT = 1_000_000
MAX_COMM_ENTRIES = 64
MAX_RUNTIME_S = 366 * 86_400.0  # one year
