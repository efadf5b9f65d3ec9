"""Emulation mode's scenario side: the dilated view a bench runs, what a run records,
and the clear errors for profiles that do not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity.pacing import Pacing
from protocol.env import Env
from protocol.names import Role
from testbed.deployment import line_env
from testbed.dilation import EmulationSpec, for_testbed, pacing_env, record
from testbed.router.config import upstream_keep_alive_s
from testbed.scenario import Scenario, ScenarioError
from testbed.server import server_env
from testbed.workload_cli import locust_argv

TINY_KV = 8192


def test_the_testbed_view_dilates_every_time_and_scales_the_wan_rate():
    target = Scenario.load("hetero")
    k = target.emulation.dilation
    run = for_testbed(target, TINY_KV)
    scale = TINY_KV / 50_000
    assert run.network.wan.rate_mbit == pytest.approx(target.network.wan.rate_mbit * scale / k)
    assert run.network.wan.delay_ms == pytest.approx(target.network.wan.delay_ms * k)
    assert run.network.wan.jitter_ms == pytest.approx(target.network.wan.jitter_ms * k)
    assert run.network.wan.loss_pct == target.network.wan.loss_pct
    assert (run.sla.ttft_s, run.sla.itl_s) == pytest.approx((target.sla.ttft_s * k, 0.03 * k))
    assert run.pdd.direct_wan_bound_s == pytest.approx(target.pdd.direct_wan_bound_s * k)
    # the KV backend's waits: a stalled transfer, a dual path's late main-decode request
    assert run.servers.kv_idle_timeout_s == pytest.approx(target.servers.kv_idle_timeout_s * k)
    assert run.servers.kv_late_leg_s == pytest.approx(target.servers.kv_late_leg_s * k)
    assert run.servers.kv_pool_reuse_s == pytest.approx(target.servers.kv_pool_reuse_s * k)
    # the router's HTTP connections to its servers stay open (and their windows grown)
    # between requests as long as in the target's time
    assert run.servers.http_keep_alive_s == pytest.approx(target.servers.http_keep_alive_s * k)
    assert run.workload.generator["time_scale"] == pytest.approx(k)
    # A 100-token KV transfer takes the target's time x k on the dilated link.
    target_s = 100 * 50_000 * 8 / (target.network.wan.rate_mbit * 1e6)
    run_s = 100 * TINY_KV * 8 / (run.network.wan.rate_mbit * 1e6)
    assert run_s == pytest.approx(k * target_s)
    assert run.emulation.applied and for_testbed(run, TINY_KV) == run  # applied once


def test_the_servers_keep_alive_reaches_sglang_and_the_router_closes_first():
    """Each server's HTTP keep-alive (dilated on hetero) is what its SGLang gets, in
    whole seconds and never shorter; the router's own idle connections close before it.
    Prefill paces its KV sends only where the scenario says so."""
    for name in ("default", "hetero"):
        servers = for_testbed(Scenario.load(name), TINY_KV).servers
        env = dict(server_env(servers, Path("/tmp/transfers.jsonl")))
        assert servers.http_keep_alive_s <= int(env[Env.HTTP_KEEP_ALIVE_S])
        assert int(env[Env.HTTP_KEEP_ALIVE_S]) < servers.http_keep_alive_s + 1
        assert upstream_keep_alive_s(servers.http_keep_alive_s) < servers.http_keep_alive_s
        assert Env.KV_PACING not in env  # the kernel's default unless servers.kv_pacing
        paced = dict(server_env(servers.model_copy(update={"kv_pacing": True}), Path("/t")))
        assert paced[Env.KV_PACING] == "1"


def test_without_emulation_nothing_changes():
    sc = Scenario.load("default")
    assert for_testbed(sc, TINY_KV) is sc
    assert record(sc, TINY_KV) == {} and pacing_env(sc, "A", "/tmp/p") == ()


def test_a_run_records_the_dilation_and_the_kv_scaling():
    sc = Scenario.load("hetero")
    rec = record(sc, TINY_KV)
    assert rec["kv_scaling"] == "wan_rate" and rec["kv_scale"] == pytest.approx(TINY_KV / 50_000)
    assert rec["dilation"] == sc.emulation.dilation and rec["site_devices"] == {
        "A": "GPU-A",
        "B": "GPU-B",
    }
    assert set(rec["devices"]) == {"GPU-A", "GPU-B"}
    json.dumps(rec)  # stored as JSON


def test_each_site_paces_as_its_own_chip():
    sc = Scenario.load("hetero")
    ((name, a_env),) = pacing_env(sc, "A", "/tmp/a")
    ((_, b_env),) = pacing_env(sc, "B", "/tmp/b")
    assert name == Env.PACING
    a, b = Pacing.from_json(a_env), Pacing.from_json(b_env)
    assert a.chip.peak_tflops > b.chip.peak_tflops  # prefill-strong A
    assert b.chip.memory_bandwidth_tbps > a.chip.memory_bandwidth_tbps  # decode-strong B
    assert a.chips == b.chips == 16 and a.dilation == b.dilation == sc.emulation.dilation
    with pytest.raises(ValueError, match="site 'C'"):
        pacing_env(sc, "C", "/tmp/c")


@pytest.mark.parametrize(
    "emulation, cost, message",
    [
        ({"model": "2T-dense"}, {}, "emulation.model '2T-dense' is not in profiles"),
        (
            {"model": "1T-moe"},
            {"table": {"accelerators": {"GPU-Z": 1.0}}, "site_accelerators": {"A": "GPU-Z"}},
            "GPU-Z",
        ),
        ({"model": "1T-moe", "dilation": 0.5}, {}, "greater than or equal to 1"),
        ({"model": "1T-moe"}, {}, "congestion_control 'cubic' does not dilate"),  # default
    ],
)
def test_invalid_emulation_is_refused_before_anything_starts(tmp_path, emulation, cost, message):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"emulation": emulation, "cost": cost}))
    with pytest.raises(ScenarioError, match=message):
        Scenario.load(path)


def test_emulation_spec_defaults():
    spec = EmulationSpec(model="1T-moe")
    assert (spec.chips_per_server, spec.dilation, spec.applied) == (8, 10.0, False)


def test_requests_in_flight_at_the_loads_end_get_dilated_time_to_finish():
    sc = Scenario.load("hetero")
    run = for_testbed(sc, TINY_KV)
    k = sc.emulation.dilation
    assert run.workload.stop_timeout_s == min(sc.workload.stop_timeout_s * k, 600)
    assert "--stop-timeout" in (argv := locust_argv("http://r", Path("t"), run.workload, Path(".")))
    assert argv[argv.index("--stop-timeout") + 1] == f"{run.workload.stop_timeout_s:g}"


def test_a_clients_read_timeout_is_dilated_and_reaches_locust():
    """900 s of the target's time without a response byte, not 900 s of the testbed's
    (4.4 s of the target's at k = 203: a baseline's queue under load would fail them)."""
    sc = Scenario.load("hetero")
    run = for_testbed(sc, TINY_KV)
    assert run.workload.request_timeout_s == sc.workload.request_timeout_s * sc.emulation.dilation
    argv = locust_argv("http://r", Path("t"), run.workload, Path("."))
    assert argv[argv.index("--request-timeout") + 1] == f"{run.workload.request_timeout_s:g}"


def test_prefill_shares_the_dilated_wan_with_the_far_sites_hosts_where_asked():
    """servers.kv_line_share: prefill (only) gets the WAN's testbed-time rate and the
    other site's addresses; a scenario without it gets nothing."""

    class TwoSites:  # stands in for topologies.network.Network's host lookup
        hosts = ["p1", "rld1", "md1"]
        site = {"p1": "A", "rld1": "A", "md1": "B"}.get
        address = {"p1": "10.77.1.10", "rld1": "10.77.1.11", "md1": "10.77.2.10"}.get

    hetero = for_testbed(Scenario.load("hetero"), TINY_KV)
    shared = hetero.model_copy(
        update={"servers": hetero.servers.model_copy(update={"kv_line_share": True})}
    )
    ((name, value),) = line_env(shared, TwoSites(), Role.PREFILL, "p1")
    line = json.loads(value)
    assert name == Env.KV_LINE and line["peers"] == ["10.77.2.10"]
    assert line["rate_bytes_s"] == pytest.approx(hetero.network.wan.rate_mbit * 1e6 / 8)
    assert line_env(shared, TwoSites(), Role.MAIN_DECODE, "md1") == ()
    assert line_env(hetero, TwoSites(), Role.PREFILL, "p1") == ()
