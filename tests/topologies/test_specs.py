"""Invalid link, network and scenario specs give clear errors before anything is built."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from testbed.scenario import SCENARIO_DIR, Scenario, ScenarioError, ServersSpec
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec
from topologies.topo import one_site, two_site


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"delay_ms": -1}, "delay_ms"),
        ({"loss_pct": 101}, "loss_pct"),
        ({"rate_mbit": 0}, "rate_mbit"),
        ({"delay_ms": 1, "jitter_ms": 2}, "jitter_ms .* cannot exceed delay_ms"),
        ({"congestion_control": "vegas"}, "congestion_control must be one of"),
        ({"mtu": 100}, "mtu"),
        ({"bandwidth": 10}, "bandwidth"),  # a typo is refused, not ignored
    ],
)
def test_invalid_link_specs_are_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        LinkSpec(**fields)


def test_unknown_backend_and_topology_are_refused():
    with pytest.raises(ValidationError, match="unknown emulation backend 'tc-magic'"):
        NetworkSpec(backend="tc-magic")
    with pytest.raises(ValidationError, match="unknown topology 'ring'"):
        NetworkSpec(topology="ring")
    with pytest.raises(ValidationError, match="LAN links are RDMA-class"):
        NetworkSpec(lan=LinkSpec(delay_ms=1))


def test_scenario_file_errors_name_every_bad_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("network:\n  wan: {delay_ms: -5, loss_pct: 150}\n  backend: nope\n")
    with pytest.raises(ScenarioError) as err:
        Scenario.load(bad)
    text = str(err.value)
    for field in ("network.wan.delay_ms", "network.wan.loss_pct", "network.backend"):
        assert field in text
    with pytest.raises(ScenarioError, match="no scenario 'missing'"):
        Scenario.load("missing")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="mapping"):
        Scenario.load(tmp_path / "list.yaml")


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_validate(path):
    assert Scenario.load(path).name == path.stem


def test_shipped_scenarios_say_what_they_are():
    assert Scenario.load("default").network.wan.rate_mbit == 100
    assert Scenario.load("same_site").network.topology == "one_site"
    assert "pdd" in Scenario.load("default").systems


def test_cpu_pinning_is_checked_by_role_and_against_the_machine(tmp_path):
    from testbed.deployment import Deployment
    from testbed.server import ServerError

    with pytest.raises(ValidationError, match="unknown roles \\['gpu'\\]"):
        ServersSpec(cpus={"gpu": [0]})
    with pytest.raises(ValidationError, match="non-empty list"):
        ServersSpec(cpus={"prefill": []})
    scenario = Scenario(name="pin", servers=ServersSpec(cpus={"prefill": [0], "testbed": [4096]}))
    with pytest.raises(ServerError, match="CPUs \\[4096\\]"):  # refused before anything starts
        Deployment(scenario, "same_site_pd", tmp_path).up()
    assert not list(tmp_path.glob("server-*.log"))


def test_server_priority_is_checked_by_role_range_and_permission(tmp_path, monkeypatch):
    from testbed.deployment import Deployment
    from testbed.server import ServerError, ServerSpec

    with pytest.raises(ValidationError, match="unknown roles \\['testbed'\\]"):
        ServersSpec(nice={"testbed": -5})  # the harness's priority is not the scenario's
    with pytest.raises(ValidationError, match="from -20 to 19, got -21"):
        ServersSpec(nice={"relay_decode": -21})
    spec = ServerSpec(model_path=tmp_path, role="decode", cpus=(0,), nice=-5)
    wrapped = [sys.executable, "-m", "topologies.priority", "-5", "--"]
    assert spec.argv()[:8] == [*wrapped, "taskset", "-c", "0"]
    assert "topologies.priority" not in ServerSpec(model_path=tmp_path, role="decode").argv()
    # a user who may not raise priority is refused before anything starts, not warned
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("resource.getrlimit", lambda what: (0, 0))
    scenario = Scenario(name="nice", servers=ServersSpec(nice={"relay_decode": -5}))
    with pytest.raises(ServerError, match="servers.nice .*relay_decode.*needs root"):
        Deployment(scenario, "pdd", tmp_path).up()
    assert not list(tmp_path.glob("server-*.log"))


def test_topologies_place_roles_in_their_sites():
    topo = two_site(hosts={"prefill": 2, "main_decode": 3})
    sites = {h: topo.nodeInfo(h)["site"] for h in topo.hosts()}
    assert {h for h, s in sites.items() if s == "B"} == {"md1", "md2", "md3", "gwB"}
    assert {"p1", "p2", "rld1", "rt1", "c1", "gwA"} <= {h for h, s in sites.items() if s == "A"}
    wan = [i for *_, i in topo.links(withInfo=True) if i["kind"] == "wan"]
    assert len(wan) == 1

    single = one_site()
    assert {single.nodeInfo(h)["site"] for h in single.hosts()} == {"A"}
    assert not [i for *_, i in single.links(withInfo=True) if i["kind"] == "wan"]


@pytest.mark.parametrize(
    "section, message",
    [
        ("network: {hosts: {gpu: 1}}", "network.hosts.*unknown role 'gpu'"),
        ("cost: {site_accelerators: {A: GPU-A, B: GPU-Z}}", "cost.*GPU-Z.*does not price"),
        ("sla: {attainment: 0.9}", "sla.ttft_s: Field required"),
        ("systems: [pdd, magic]", "unknown systems \\['magic'\\]"),
        ("servers: {port: 0}", "servers.port"),
        ("servers: {router_port: 70000}", "servers.router_port"),
        ("pdd: {handoff_port: 30000}", "pdd.handoff_port and servers.port are both port 30000"),
        ("servers: {bootstrap_port: 8000}", "servers.router_port and servers.bootstrap_port"),
        ("network: {wan: {delay_ms: .inf}}", "network.wan.delay_ms"),
        ("servers: {kv_idle_timeout_s: .inf}", "servers.kv_idle_timeout_s"),
        ("pdd: {settle_timeout_s: .nan}", "pdd.settle_timeout_s"),
        ("sla: {ttft_s: .inf, itl_s: 0.1}", "sla.ttft_s"),
        ("network: {hosts: {prefill: 99}}", "hosts.prefill: 99 hosts"),
        ("network: {hosts: {prefill: -3}}", "hosts.prefill: -3 hosts"),
        # a system whose host is missing: before, the systems ahead of it ran first
        ("network: {hosts: {relay_decode: 0}}", "same_site_pd needs a host of role relay_decode"),
        ("network: {hosts: {client: 0}}", "colocated needs a host of role client"),
        ("network: {topology: one_site}\nsystems: [pdd]", "pdd needs a host of role relay_decode"),
        ("name: ../../etc", "name '../../etc'"),
        ("name: a/b", "name 'a/b'"),
        ("name: ''", "name ''"),
    ],
)
def test_invalid_scenarios_fail_before_anything_starts(tmp_path, section, message):
    path = tmp_path / "bad.yaml"
    path.write_text(section + "\n")
    with pytest.raises(ScenarioError, match=f"(?s){message}"):
        Scenario.load(path)


def test_set_overrides_apply_before_validation_and_refuse_bad_input():
    sc = Scenario.load(
        "default", ["network.wan.rate_mbit=25", "pdd.turn_wait_s=0.25", "systems=[pdd, colocated]"]
    )
    assert sc.network.wan.rate_mbit == 25 and sc.pdd.turn_wait_s == 0.25
    assert sc.systems == ["pdd", "colocated"]
    with pytest.raises(ScenarioError, match="network.wan.rate_mbit"):
        Scenario.load("default", ["network.wan.rate_mbit=-1"])  # validated like the file
    with pytest.raises(ScenarioError, match="expected dotted.field=value"):
        Scenario.load("default", ["network.wan.rate_mbit"])
    with pytest.raises(ScenarioError, match="is not a section"):
        Scenario.load("default", ["name.x=1"])
    with pytest.raises(ScenarioError, match="pdd.colour"):
        Scenario.load("default", ["pdd.colour=blue"])  # an unknown field: refused


def test_shaped_links_are_tclinks_for_mn_custom_and_lan_links_are_plain():
    from mininet.link import TCLink

    topo = two_site(wan=LinkSpec(rate_mbit=100, delay_ms=10, loss_pct=1))
    infos = [i for *_, i in topo.links(withInfo=True)]
    (wan,) = [i for i in infos if i["kind"] == "wan"]
    assert wan["cls"] is TCLink and (wan["bw"], wan["delay"], wan["loss"]) == (100, "10.0ms", 1)
    assert all("cls" not in i for i in infos if i["kind"] == "lan")
