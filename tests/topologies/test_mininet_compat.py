"""The topologies build and route under Mininet's own runtime (as with ``mn --custom``)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.netns

CUSTOM = Path(__file__).resolve().parents[2] / "topologies" / "mn_custom.py"


@pytest.mark.parametrize("name", ["two_site", "one_site"])
def test_mn_custom_topologies_ping_all(name):
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.nodelib import LinuxBridge

    setLogLevel("error")
    topos = runpy.run_path(str(CUSTOM))["topos"]
    net = Mininet(topo=topos[name](), switch=LinuxBridge, controller=None, autoSetMacs=True)
    try:
        net.start()
        assert net.pingAll(timeout=2) == 0.0
    finally:
        net.stop()
