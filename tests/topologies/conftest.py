"""Network tests need root and network namespaces (CI runs as root)."""

from __future__ import annotations

import os
import shutil

import pytest

from topologies.link import LinkSpec
from topologies.network import Network
from topologies.spec import NetworkSpec


def pytest_collection_modifyitems(items):
    for item in items:
        if "netns" in item.keywords and (os.geteuid() != 0 or not shutil.which("ip")):
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (network namespaces)"))


@pytest.fixture
def make_network(request):
    """Bring up networks for a test; every one is torn down even when the test fails."""
    nets: list[Network] = []

    def make(wan: LinkSpec | None = None, topology: str = "two_site", **kwargs) -> Network:
        spec = NetworkSpec(topology=topology, wan=wan or LinkSpec(), **kwargs)
        net = Network(
            spec, name=f"t{len(nets)}", log_dir=request.config.rootpath / "runs" / "test-net"
        )
        nets.append(net)
        return net.up()

    yield make
    for net in nets:
        net.down()
