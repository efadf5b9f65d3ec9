"""Networks for topology tests, torn down even when a test fails."""

from __future__ import annotations

import pytest

from topologies.link import LinkSpec
from topologies.network import Network
from topologies.spec import NetworkSpec


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
