"""An inventory's parts without servers: the host agent serves its transfer log by
offset; the harness's mirror copies only what is logged after it starts, whole lines
only, with every time moved onto the harness's clock by the offset the preflight
measured; the scenario refuses inventories that cannot run."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from testbed.agent import HostAgent
from testbed.doctor import run as doctor_run
from testbed.inventory import LocalHosts, LogMirror, on_harness_clock
from testbed.scenario import Scenario, ScenarioError
from tests.testbed.test_doctor import SkewedAgent

PORT = 30621


def line(**fields) -> str:
    return json.dumps(fields) + "\n"


def test_the_mirror_copies_new_whole_lines_onto_the_harness_clock(tiny_model, tmp_path):
    log = tmp_path / "host" / "transfers.jsonl"
    log.parent.mkdir()
    log.write_text(line(room=1, side="decode", start=1.0, end=2.0))  # an earlier run's
    agent = SkewedAgent({"role": "main_decode"}, tiny_model, "127.0.0.1", PORT, log).start()
    try:
        url = f"http://127.0.0.1:{PORT}"
        r = httpx.get(f"{url}/transfers", params={"offset": 0, "limit": 5})
        assert r.content == log.read_bytes()[:5] and int(r.headers["x-log-size"]) > 5
        assert httpx.get(f"{url}/transfers", params={"offset": -1}).status_code == 400

        (check,) = doctor_run([url], tiny_model, max_offset_s=5)
        offset_s = check.offset_ms / 1000  # the host's clock runs 2 s ahead
        assert 1.9 < offset_s < 2.1
        dest = tmp_path / "run" / "transfers-md.jsonl"
        mirror = LogMirror([(url, dest, offset_s)], poll_s=0.05).start()
        now = time.time() + 2.0  # what the host's clock says
        with open(log, "a") as f:
            f.write(line(room=7, side="decode", peer="p1", start=now, end=now + 0.5))
            f.write(line(room=7, side="handoff", received=now + 1, extended_at=now + 1.1))
            f.write('{"room": 8, "side": "dec')  # still being written: not copied yet
        deadline = time.monotonic() + 10
        while dest.read_text().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        mirror.stop()
        copied = [json.loads(x) for x in dest.read_text().splitlines()]
        assert [c["room"] for c in copied] == [7, 7]  # the earlier run's line is not copied
        assert copied[0]["peer"] == "p1"
        assert abs(copied[0]["start"] - (now - offset_s)) < 1e-6
        assert abs(copied[0]["end"] - copied[0]["start"] - 0.5) < 1e-6
        assert abs(copied[1]["received"] - (now + 1 - offset_s)) < 1e-6
        assert abs(copied[0]["start"] - time.time()) < 1.0  # on this machine's clock
        assert mirror.problems() == []
    finally:
        agent.stop()


def test_an_agent_without_a_transfer_log_says_so(tiny_model):
    agent = HostAgent({"role": "prefill"}, tiny_model, "127.0.0.1", PORT + 1).start()
    try:
        r = httpx.get(f"http://127.0.0.1:{PORT + 1}/transfers")
        assert r.status_code == 404 and "--transfer-log" in r.text
        assert httpx.get(f"http://127.0.0.1:{PORT + 1}/host").json()["transfer_log"] is False
    finally:
        agent.stop()


def test_times_move_by_the_offset_and_nothing_else_does():
    moved = on_harness_clock({"room": 5, "start": 10.0, "end": None, "time": 0.0, "pages": 3}, 2)
    assert moved == {"room": 5, "start": 8.0, "end": None, "time": 0.0, "pages": 3}


def inventory(**extra) -> dict:
    hosts = [
        {"name": "p1", "place": "prefill", "site": "A", "address": "10.0.0.1"},
        {"name": "rld1", "place": "relay_decode", "site": "A", "address": "10.0.0.2"},
        {"name": "md1", "place": "main_decode", "site": "B", "address": "10.1.0.1"},
    ]
    return {"hosts": hosts, **extra}


def load(tmp_path, data: dict) -> Scenario:
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps({"name": "inv", **data}))
    return Scenario.load(path)


@pytest.mark.parametrize(
    "data, says",
    [
        ({"systems": ["pdd"], "inventory": inventory()}, "frame_key_file"),
        (
            {"systems": ["pdd"], "inventory": inventory(frame_key_file="/etc/hostname")},
            "/etc/hostname: not a frame key",
        ),
        (
            {
                "systems": ["pdd"],
                "servers": {"frame_auth": False},
                "inventory": {"hosts": inventory()["hosts"][:2]},
            },
            "main_decode host; the inventory has none",
        ),
        (
            {
                "systems": ["pdd"],
                "servers": {"frame_auth": False, "tls": True},
                "inventory": inventory(),
            },
            "servers.tls",
        ),
        (
            {
                "systems": ["pdd"],
                "servers": {"frame_auth": False},
                "inventory": {"hosts": [*inventory()["hosts"], inventory()["hosts"][0]]},
            },
            "names repeat: p1",
        ),
        (
            {
                "systems": ["pdd"],
                "servers": {"frame_auth": False},
                "inventory": {"hosts": [{**inventory()["hosts"][0], "place": "gateway"}]},
            },
            "place must be one of",
        ),
    ],
)
def test_the_scenario_refuses_an_inventory_that_cannot_run(tmp_path, data, says):
    with pytest.raises(ScenarioError, match=says):
        load(tmp_path, data)


def test_the_harness_runs_here_and_nothing_on_the_hosts(tmp_path):
    sc = load(
        tmp_path,
        {
            "systems": ["pdd"],
            "servers": {"frame_auth": False},
            "inventory": inventory(router_address="10.9.9.9"),
        },
    )
    hosts = LocalHosts(sc.inventory)
    assert hosts.hosts_with_role("router") == hosts.hosts_with_role("client") == ["harness"]
    assert hosts.hosts_with_role("main_decode") == ["md1"] and hosts.site("md1") == "B"
    assert hosts.address("harness") == "10.9.9.9" and hosts.address("p1") == "10.0.0.1"
    assert hosts.exec_argv("harness", ["true"]) == ["true"]
    with pytest.raises(RuntimeError, match="inventory host"):
        hosts.exec_argv("p1", ["true"])
