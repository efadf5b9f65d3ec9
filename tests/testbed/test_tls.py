"""servers.tls: the KV transfer and the handoff run over TLS 1.3 with the deployment's
own certificate (real servers, real namespaces), token-exact; a peer that does not
speak TLS is refused at both listeners, and one that does but lacks the frame key too."""

from __future__ import annotations

import random
import socket
import ssl

import httpx
import pytest

from protocol import headers, tls
from protocol.names import Pipeline, Role
from protocol.records import read_records
from testbed.deployment import Deployment
from testbed.router.config import PddConfig
from testbed.scenario import Scenario, ServersSpec
from tests.conftest import reference_output
from tests.testbed.hostile_frames import assert_closed_soon, frame, untagged
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec
from workloads.client import generate_payload

pytestmark = [pytest.mark.sglang, pytest.mark.netns]


@pytest.fixture(scope="module")
def pdd_tls(tmp_path_factory):
    scenario = Scenario(
        name="test_tls",
        network=NetworkSpec(wan=LinkSpec(rate_mbit=100, delay_ms=5, queue_packets=2000)),
        servers=ServersSpec(tls=True, kv_idle_timeout_s=5, max_total_tokens=30000),
        pdd=PddConfig(direct_wan_bound_s=0.1),
        systems=["pdd"],
    )
    with Deployment(scenario, "pdd", tmp_path_factory.mktemp("tls"), "ttls") as deployment:
        yield deployment


def test_relayed_and_direct_requests_are_token_exact_over_tls(pdd_tls, colocated):
    rng = random.Random(81)
    for pipeline in (Pipeline.P_RLD_MD, Pipeline.P_MD):
        prompt = [rng.randrange(10, 4000) for _ in range(400)]
        pins = {headers.PIPELINE: pipeline, headers.HANDOFF_AT: "10"}
        session = f"tls-{pipeline}"
        r = httpx.post(
            f"{pdd_tls.router_url}/generate",
            json=generate_payload(prompt, 40, False),
            headers={headers.SESSION: session, headers.TURN: "0", **pins},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == reference_output(colocated, prompt, 40)
        (rec,) = [x for x in read_records(pdd_tls.records_path) if x.session_id == session]
        assert rec.kv_link == "wan" and rec.kv_bytes > 0
        if pipeline == Pipeline.P_RLD_MD:
            assert rec.handoff_mode in ("one-shot", "catch-up") and not rec.fallback


def test_listeners_refuse_plain_tcp_and_tls_peers_without_the_frame_key(pdd_tls):
    servers = {s.role: s for s in pdd_tls.servers}
    listeners = [
        (servers[Role.PREFILL].spec.host, pdd_tls.scenario.servers.bootstrap_port),
        (servers[Role.MAIN_DECODE].spec.host, pdd_tls.scenario.pdd.handoff_port),
    ]
    for address in listeners:
        assert_closed_soon(address, frame(7, 1, b""))  # a PDKV frame, but in the clear
        raw = socket.create_connection(address, timeout=10)
        with tls.client_context().wrap_socket(raw) as s:  # the deployment's cert verifies
            assert s.version() == "TLSv1.3"
            s.sendall(untagged(1, 2, b"\x00" * 20))  # ...but no frame key: closed
            assert _closed_within(s, 10.0), address


def _closed_within(s: ssl.SSLSocket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False
