"""Per-node wakeups of waiting polls in one process: a change wakes the polls of the nodes it
names and no others; a whole-cluster change wakes every poll of that cluster."""

from __future__ import annotations

import threading
import time

from apps.scheduling import wakeups

CLUSTER = 535353


def waiters(
    *nodes: str, timeout_s: float = 5.0
) -> tuple[dict[str, tuple[bool, float]], list[threading.Thread]]:
    results: dict[str, tuple[bool, float]] = {}

    def wait(node: str) -> None:
        since = wakeups.epoch(CLUSTER, node)
        started = time.monotonic()
        results[node] = (wakeups.wait_for_change(CLUSTER, node, since, timeout_s), time.monotonic() - started)

    threads = [threading.Thread(target=wait, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(wakeups._WAITING.get(CLUSTER, {})) < len(set(nodes)):
        time.sleep(0.01)
    return results, threads


def test_a_change_wakes_only_the_polls_of_its_nodes():
    results, threads = waiters("node-a", "node-b", timeout_s=1.0)
    wakeups._bump(CLUSTER, ("node-a",))
    for t in threads:
        t.join(10)
    changed, waited = results["node-a"]
    assert changed and waited < 0.9
    changed, waited = results["node-b"]
    assert not changed and waited >= 0.9
    assert CLUSTER not in wakeups._WAITING


def test_a_whole_cluster_change_wakes_every_poll_of_the_cluster():
    results, threads = waiters("node-a", "node-b")
    wakeups._bump(CLUSTER + 1, None)  # another cluster: nobody here wakes
    wakeups._bump(CLUSTER, None)
    for t in threads:
        t.join(10)
    assert all(changed and waited < 4 for changed, waited in results.values())
    assert CLUSTER not in wakeups._WAITING


def test_a_change_before_the_wait_answers_at_once():
    since = wakeups.epoch(CLUSTER, "node-c")
    wakeups._bump(CLUSTER, ("node-c",))
    assert wakeups.wait_for_change(CLUSTER, "node-c", since, 30.0)
    assert CLUSTER not in wakeups._WAITING
