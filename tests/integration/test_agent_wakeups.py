"""Agent long-polls woken by a change committed in another process, through Redis pub/sub."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import redis

from apps.executors.agents import wakeups


def test_a_wakeup_published_by_another_process_ends_a_waiting_poll(require_redis, settings):
    settings.CACHE_URL = None
    settings.CELERY_BROKER_URL = require_redis
    assert wakeups.listen_for_other_processes()
    channel = wakeups._channel()
    client = redis.Redis.from_url(require_redis)
    deadline = time.monotonic() + 10
    while dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
        assert time.monotonic() < deadline, "the listener did not subscribe"
        time.sleep(0.05)
    since = wakeups.epoch(424242, "node-x")
    other = wakeups.epoch(424242, "node-y")
    message = json.dumps({"origin": "another-process", "cluster": 424242, "nodes": ["node-x"]})
    publish = "import redis, sys; redis.Redis.from_url(sys.argv[1]).publish(sys.argv[2], sys.argv[3])"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", publish, require_redis, channel, message], check=True)
    assert wakeups.wait_for_change(424242, "node-x", since, timeout_s=10)
    assert time.monotonic() - t0 < 5
    # Only the node named: another node's poll keeps waiting.
    assert wakeups.epoch(424242, "node-y") == other
    assert not wakeups.wait_for_change(424242, "node-y", other, timeout_s=0.2)
