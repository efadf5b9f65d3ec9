"""Each process's CPU share during the load (``testbed.cpu_share``): the network's
namespaces stand in as one host whose only process is this test's own."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from testbed import cpu_share


def burn(cpu_s: float) -> None:
    """Spend ``cpu_s`` seconds of this process's CPU time."""
    start = time.process_time()
    while time.process_time() - start < cpu_s:
        pass


def test_the_loads_share_counts_from_the_mark_not_from_the_process_start(monkeypatch):
    monkeypatch.setattr(cpu_share, "pids_in", lambda ns: [os.getpid()])
    net = SimpleNamespace(hosts=["h1"], ns=lambda host: host, topo=SimpleNamespace(nodes=list))
    burn(0.3)  # start-up: before the load
    mark = cpu_share.mark(net)
    burn(0.2)  # the load
    (row,) = cpu_share.processes(net, mark)
    assert row["host"] == "h1" and row["pid"] == os.getpid()
    # the load's 0.2 s, read in clock ticks (10 ms) at the mark and at the end (CI read
    # 0.18999); the start-up's 0.3 s is not in it
    assert 0.17 <= row["load_cpu_s"] < 0.3 < row["cpu_s"]
    assert 0 < row["load_share"] <= 1.05  # one thread: at most one CPU
    (life,) = cpu_share.processes(net)
    assert "load_share" not in life and life["cpu_s"] >= row["cpu_s"]
