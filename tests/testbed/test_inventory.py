"""An inventory deployment for real: ``testbed serve`` started by hand inside three
hosts of an emulated two-site network (stand-ins for remote hosts: their own
addresses, the WAN between them), the harness on this machine against them.

The same requests through a managed deployment and through the inventory give the
same tokens and put the same bytes on the WAN; the preflight names a host started
with the wrong port; a bench of two systems against the one inventory completes,
token-exact between the systems, with every KV transfer in the mirrored logs."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import time

import httpx
import pytest
from rich.console import Console

from protocol import headers
from protocol.records import read_jsonl, read_records
from reports.run_data import load_run
from testbed.bench.run import run_bench
from testbed.deployment import Deployment
from testbed.doctor import check_inventory
from testbed.scenario import Scenario
from testbed.server import ServerError
from tests.testbed.pdd_deployment import stream
from topologies.network import Network

pytestmark = [pytest.mark.sglang, pytest.mark.netns]

PLACES = {"p1": "prefill", "rld1": "relay_decode", "md1": "main_decode"}
AGENT_PORT = 30090
PIN = {headers.PIPELINE: "P->RLD->MD", headers.HANDOFF_AT: "9", headers.HANDOFF_MODE: "one-shot"}


def base_scenario() -> dict:
    data = Scenario.load("default").model_dump(mode="json")
    data.update(name="test_inventory", systems=["pdd"])
    data["network"]["wan"].update(rate_mbit=100, delay_ms=5, loss_pct=0, jitter_ms=0)
    data["servers"].update(max_total_tokens=20000, cpus={})
    data["pdd"].update(turn_wait_s=60)  # a turn waits for MD to cache the last: same hits
    data["workload"]["generator"].update(
        sessions=2, turns=[2, 2], anomalous_share=0.0, output_tokens=[8, 16]
    )
    return data


def requests_of(deployment: Deployment) -> list[tuple]:
    """Two turns of one session (the second hits the caches), the first relayed (pinned:
    under the scenario's bound the policy would send its 300 tokens direct) with a
    pinned handoff: per request its tokens and what its KV put on the WAN."""
    rng = random.Random(11)
    history = [rng.randrange(10, 4000) for _ in range(300)]
    out = []
    for turn in range(2):
        pins = PIN if turn == 0 else {headers.PIPELINE: "P->MD"}  # routing is timing's
        ids = stream(deployment, history, 24, "inv", turn, pins=pins)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            path = deployment.records_path
            recs = [r for r in read_records(path) if r.turn == turn] if path.exists() else []
            if recs:
                break
            time.sleep(0.2)
        (rec,) = recs
        out.append((ids, rec.pipeline, rec.kv_link, rec.kv_bytes, rec.kv_wire_bytes))
        history = history + ids + [rng.randrange(10, 4000) for _ in range(40)]
    return out


def md_wire_bytes(deployment: Deployment) -> int:
    (md,) = [s for s in deployment.servers if s.role == "main_decode"]
    lines = read_jsonl(deployment.transfer_log(md.name))
    return sum(d["wire_bytes"] for d in lines if d["side"] == "decode")


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    """The reference: the same scenario, servers launched by the testbed."""
    scenario = Scenario.model_validate(base_scenario())
    with Deployment(scenario, "pdd", tmp_path_factory.mktemp("managed"), "tinvm") as d:
        got = requests_of(d)
    return got, md_wire_bytes(d)  # down first: the inventory's hosts need the network


@pytest.fixture(scope="module")
def hosts(tiny_model, tmp_path_factory):
    """The network with `testbed serve` in p1, rld1 and md1, as a user starts them."""
    tmp = tmp_path_factory.mktemp("hosts")
    key = tmp / "frame.key"
    testbed = [sys.executable, "-m", "testbed.cli"]
    subprocess.run([*testbed, "key", str(key)], check=True, capture_output=True)
    sc = Scenario.model_validate(base_scenario())
    net = Network(sc.network, "tinv", log_dir=tmp).up()
    procs = []
    try:
        for host, place in PLACES.items():
            argv = [*testbed, "serve", "--role", place, "--model", str(tiny_model)]
            argv += ["--host", net.address(host), "--port", str(sc.servers.port)]
            argv += ["--bootstrap-port", str(sc.servers.bootstrap_port)]
            argv += ["--max-total-tokens", str(sc.servers.max_total_tokens)]
            argv += ["--transfer-log", str(tmp / f"{host}-transfers.jsonl")]
            argv += ["--frame-key-file", str(key), "--agent-port", str(AGENT_PORT)]
            argv += ["--log", str(tmp / f"{host}-sglang.log")]
            if place == "main_decode":
                argv += ["--handoff-port", str(sc.pdd.handoff_port)]
            procs.append(net.popen(host, argv, tmp / f"{host}-serve.log"))
        deadline = time.monotonic() + 300
        for proc in procs:
            while "ready" not in proc.log():
                assert proc.alive(), proc.log()[-2000:]
                assert time.monotonic() < deadline, proc.log()[-2000:]
                time.sleep(1)
        inventory = {
            "hosts": [
                {
                    "name": host,
                    "place": place,
                    "site": net.site(host),
                    "address": net.address(host),
                    "port": sc.servers.port,
                    "agent_port": AGENT_PORT,
                }
                for host, place in PLACES.items()
            ],
            "router_address": net.harness_address,
            "frame_key_file": str(key),
        }
        yield {**base_scenario(), "inventory": inventory}
    finally:
        for proc in procs:
            proc.stop()
        net.down()


def test_the_inventory_gives_the_managed_tokens_and_wan_bytes(managed, hosts, tmp_path):
    scenario = Scenario.model_validate(hosts)
    with Deployment(scenario, "pdd", tmp_path / "inv") as d:
        got = requests_of(d)
        wire = md_wire_bytes(d)
        manifest = (tmp_path / "inv" / "manifest.json").read_text()
    reference, reference_wire = managed
    assert got == reference  # tokens, pipeline, WAN link, KV and wire bytes
    assert got[0][1] == "P->RLD->MD" and got[0][2] == "wan" and got[0][4] > 0
    assert wire == reference_wire > 0  # every transfer to main decode, mirrored
    assert '"clock_offset_ms"' in manifest and '"by hand (inventory)"' in manifest


def test_the_preflight_names_a_host_started_with_another_port(hosts, tmp_path):
    data = {**hosts, "pdd": {**hosts["pdd"], "handoff_port": 8111}}
    checks = check_inventory(Scenario.model_validate(data))
    problems = [p for c in checks for p in c.problems]
    assert len(problems) == 1 and "md1" in problems[0] and "handoff port" in problems[0]
    data = {**hosts, "servers": {**hosts["servers"], "max_total_tokens": 40000}}
    with pytest.raises(ServerError, match="p1 .* below servers.max_total_tokens=40000"):
        Deployment(Scenario.model_validate(data), "pdd", tmp_path).up()
    p1 = hosts["inventory"]["hosts"][0]
    health = httpx.get(f"http://{p1['address']}:{p1['port']}/health", timeout=10)
    assert health.status_code == 200  # a refused run leaves the hosts' servers alone


def test_a_bench_of_two_systems_runs_against_one_inventory(hosts, tmp_path):
    data = {**hosts, "systems": ["cross_site_pd", "pdd"]}
    run_dir = run_bench(Scenario.model_validate(data), tmp_path, Console(file=io.StringIO()))
    run = load_run(run_dir)
    outputs = {}
    for name, s in run.systems.items():
        recs = s.records
        assert len(recs) == 4 and (recs["status"] == "ok").all(), name
        assert (recs["kv_wire_bytes"] > 0).all(), name  # joined from the mirrored logs
        outputs[name] = {r.request_id.split("-")[0]: list(r.output_ids) for r in recs.itertuples()}
    assert outputs["pdd"] == outputs["cross_site_pd"]
    assert "inventory" in (run_dir / "pdd" / "manifest.json").read_text()
