"""Shaping a real interface (here the WAN side of a gateway in a network this test
built, standing in for a gateway host): the delay and rate are what the spec says,
a parameter that cannot be applied is refused, and unshape puts the link back."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from testbed.cli import app
from topologies.check import iperf, ping
from topologies.link import LinkSpec

pytestmark = pytest.mark.netns


def test_net_shape_and_unshape_a_gateways_wan_interface(make_network):
    net = make_network(LinkSpec())  # an unshaped WAN: what a real one looks like here
    (gw_a,) = [h for h in net.topo.hosts() if net.role(h) == "gateway" and net.site(h) == "A"]
    ns = net.ns(gw_a)
    dev = next(
        f"eth{info['port1'] if info['node1'] == gw_a else info['port2']}"
        for *_, info in net.topo.links(withInfo=True)
        if info["kind"] == "wan"
    )
    before = ping(net, "c1", "md1", count=20).min_ms
    cli = CliRunner()
    shaped = cli.invoke(
        app, ["net", "shape", "{rate_mbit: 20, delay_ms: 15}", "--dev", dev, "--netns", ns]
    )
    assert shaped.exit_code == 0, shaped.output
    assert "delay_ms by" in shaped.output  # says which mechanism applies each parameter
    rtt = ping(net, "c1", "md1", count=20).min_ms
    assert before + 15 <= rtt <= before + 17  # one direction delayed by 15 ms
    mbit = iperf(net, "p1", "md1", seconds=3)["sum_received"]["bits_per_second"] / 1e6
    assert 16 <= mbit <= 21, mbit
    again = cli.invoke(app, ["net", "shape", "{delay_ms: 1}", "--dev", dev, "--netns", ns])
    assert again.exit_code == 1 and "shaped already" in again.output
    bad = cli.invoke(app, ["net", "shape", "{delay_ms: -3}", "--dev", "eth9", "--netns", ns])
    assert bad.exit_code == 1 and "delay_ms" in bad.output
    done = cli.invoke(app, ["net", "unshape", "--dev", dev, "--netns", ns])
    assert done.exit_code == 0 and "delay daemon" in done.output, done.output
    assert ping(net, "c1", "md1", count=20).min_ms <= before + 1
    gone = cli.invoke(app, ["net", "unshape", "--dev", dev, "--netns", ns])
    assert gone.exit_code == 1 and "not shaped" in gone.output
