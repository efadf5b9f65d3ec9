"""CPU pinning of a deployment: the link emulators on the 'link' CPUs (else the
testbed's), the router and Locust on the 'testbed' CPUs, servers on their role's."""

from __future__ import annotations

import os

import pytest

from testbed.pinning import CpuPins
from testbed.server import ServerError
from topologies.link import LinkSpec
from topologies.network import Network
from topologies.spec import NetworkSpec

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to tell masks apart")


@pytest.fixture
def restored():
    yield
    os.sched_setaffinity(0, CPUS)


@two_cpus
def test_link_falls_back_to_the_testbeds_cpus_and_servers_get_their_roles(restored):
    first, last = CPUS[0], CPUS[-1]
    pins = CpuPins({"prefill": [first], "testbed": [last]})
    pins.pin("link")
    assert os.sched_getaffinity(0) == {last}
    assert pins.cpus_for("prefill") == (first,) and pins.cpus_for("decode") == tuple(CPUS)
    pins.restore()
    assert sorted(os.sched_getaffinity(0)) == CPUS
    assert CpuPins({}).cpus_for("prefill") == ()  # nothing pinned
    with pytest.raises(ServerError, match="CPUs \\[4096\\]"):
        CpuPins({"link": [4096]})


@pytest.mark.netns
@two_cpus
def test_the_link_emulators_run_on_the_link_cpus_and_the_rest_on_the_testbeds(restored, tmp_path):
    """On two cores a decoder shares its core with the testbed: the link emulators'
    per-packet work can go to the other one (``servers.cpus.link``)."""
    first, last = CPUS[0], CPUS[-1]
    pins = CpuPins({"link": [first], "testbed": [last]})
    net = Network(NetworkSpec(wan=LinkSpec(delay_ms=5)), name="pin", log_dir=tmp_path)
    try:
        pins.pin("link")
        net.up()
        pins.pin("testbed")
        daemons = [pid for link in net.applied for pid in link.daemon_pids]
        if not daemons:
            pytest.skip(f"the {net.backend_name} backend delays in the kernel (no daemon)")
        assert {frozenset(os.sched_getaffinity(pid)) for pid in daemons} == {frozenset({first})}
        assert os.sched_getaffinity(0) == {last}
    finally:
        net.down()
