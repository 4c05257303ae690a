"""Cost model: collective times, step time, MFU and multi-job link congestion.

Units everywhere: times in milliseconds, payloads in bytes, bandwidth in GB/s (1 GB = 1e9 bytes),
latency in microseconds.

`evaluate(topology, job, gids, link_load)` prices one placement. Each `comm` entry costs the time of
its slowest group (all groups of a kind communicate at once) times its `count`; `comm_ms` sums the
entries; `step_ms = compute_ms + sum over entries of (1 - overlap) * entry time`, each entry's
overlap its own or else the job's `step.overlap` (`exposed_ms`). A job declaring
`step.microbatches` m with pp > 1 runs 1F1B: its compute part carries the bubble,
compute_ms * (m + pp - 1) / m (`pipeline_compute_ms`), and a pipeline p2p entry waits only for its
2(pp - 1) sends on the fill and drain and for each other send's excess over a microbatch's compute
(`entry_exposed_ms`); MFU = flops_per_step / (step_s * sum of
the placed GPUs' peak TFLOPS * 1e12).

How one group is priced, with B its bottleneck bandwidth (the slowest member pair, the bucket
effect, `Topology.group_path`) and a its latency:
- inside one NVLink domain: as NCCL runs it (`domain_ms`), the best of the ring's flat closed form
  over NVLink, the tree (allreduce) and, where the domain's switches support NVLS
  (`Topology.domain_nvls`: NVSwitch gen 3 in H100/H200 baseboards, NVL72 racks), NVLS at NCCL's
  published latency and efficiency (`formulas`, NCCL 2.30.7 src/graph/tuning.cc); all-to-all flat;
- allreduce over several domains: hierarchical. Reduce-scatter inside each domain (the fullest
  domain, k_max members, over the slowest such domain), a ring allreduce between the domains over
  the parallel rails (the fewest NICs any of its domains uses, S/rails per rail, B = the slowest
  member NIC and uplink), allgather inside each domain. When every domain of the group has members
  under the same set of leaves (rail-aligned, as in rail-optimised clusters), each rail's ring stays
  under one leaf: B and a are the NICs' alone, and no uplink is used;
- allgather and reducescatter over several domains: hierarchical the same way (between the domains
  over the rails, S/rails each, and inside each domain), so that a reduce-scatter and an allgather
  cost exactly the allreduce they compose;
- each of these three takes the faster of its hierarchical form and NCCL's pipelined ring (tree for
  allreduce) with one channel per rail, B = min(NVLink, rails x NIC), `pipelined_ms`: what NCCL's
  tuner does by message size (`spanning_ms`); calibrated against published nccl-tests figures in
  `calibration/`;
- alltoall over several domains: each member sends S/n to every peer, those outside its domain
  through its own NIC (shared by every spanning member on it, capped by the group's path and
  uplink share), those inside over NVLink; the group takes its slowest member
  (`alltoall_spanning_ms` for the NIC part), so 7+1, 4+4 and one rank per node differ;
- p2p: `a + S/B` on the slowest hop between consecutive members (stage i to stage i+1); for a cp
  group (context parallelism's ring attention) a ring pass: `(n-1)(a + S/B)` over the slowest hop
  of the closed ring (the last member sends to the first), every member sending at once;
- volume: `S/B` with the group's bottleneck and no latency (the seed's accounting).

Congestion, and what a "flow" is. A flow is one stream of a comm entry through a leaf switch's
uplinks (to the spines), on that leaf while the entry runs:
- ring collectives (allreduce, allgather, reducescatter) run leaf by leaf, so a group whose traffic
  crosses leaves puts one flow per parallel ring (rail) on each leaf it spans; a rail-aligned one
  puts none;
- alltoall and volume: every member GPU of a group that spans leaves is one flow on its own leaf;
- p2p: every hop between consecutive members under different leaves is one flow on each of the two.
Each flow offers the rate its path allows unshared (volume: the group's bottleneck; the others: the
network path capped by its NIC's share among the kind's groups). A leaf's uplinks
(`Topology.leaf_uplink_total_bw`, C GB/s) are shared in proportion to the rates offered on them:
other jobs' mean rates L (`link_load`, GB/s: per leaf, plus the hottest of its uplinks when
spines or single links are named, `linkload`) plus this entry's D, each flow getting its
offered rate times min(1, C / (L + D)), the least such factor over the leaves (and pods' core
links, the same way) it spans. So a light job sharing an uplink with a heavy one takes little of it.
`Prediction.flows` is this job's mean offered rate per leaf (GB/s, and per pod's core links on
its spines): what its flows carry there per step (granted rate x the group's time x count; p2p
its bytes) summed over its entries, over the step (max(step_ms, comm_ms)), to add to `link_load`.
"""

from .formulas import (
    FLAT_FORMS,
    HIERARCHICAL_FORMS,
    NVLS_COLLECTIVES,
    NVLS_EFFICIENCY_BLACKWELL,
    NVLS_EFFICIENCY_HOPPER,
    NVLS_LATENCY_US,
    allgather_ms,
    alltoall_ms,
    alltoall_spanning_ms,
    domain_ms,
    entry_exposed_ms,
    exposed_ms,
    hierarchical_allgather_ms,
    hierarchical_allreduce_ms,
    hierarchical_reducescatter_ms,
    mfu,
    most_hidden_share,
    nvls_ms,
    p2p_ms,
    pipeline_compute_ms,
    pipelined_ms,
    reducescatter_ms,
    ring_allreduce_ms,
    spanning_ms,
    step_ms,
    tree_allreduce_ms,
    volume_ms,
)
from .linkload import load_array
from .paths import KindStats, kind_stats, pair_paths
from .prediction import GroupCost, Prediction, check_gids, evaluate

__all__ = [
    "FLAT_FORMS",
    "HIERARCHICAL_FORMS",
    "NVLS_COLLECTIVES",
    "NVLS_EFFICIENCY_BLACKWELL",
    "NVLS_EFFICIENCY_HOPPER",
    "NVLS_LATENCY_US",
    "domain_ms",
    "nvls_ms",
    "tree_allreduce_ms",
    "GroupCost",
    "KindStats",
    "Prediction",
    "allgather_ms",
    "alltoall_ms",
    "alltoall_spanning_ms",
    "entry_exposed_ms",
    "exposed_ms",
    "check_gids",
    "evaluate",
    "hierarchical_allgather_ms",
    "hierarchical_allreduce_ms",
    "hierarchical_reducescatter_ms",
    "kind_stats",
    "load_array",
    "mfu",
    "most_hidden_share",
    "p2p_ms",
    "pipeline_compute_ms",
    "pipelined_ms",
    "pair_paths",
    "reducescatter_ms",
    "ring_allreduce_ms",
    "spanning_ms",
    "step_ms",
    "volume_ms",
]
