"""The two-site scenario the deployment tests build on, and the PDD deployment the
pipeline tests share: one per test module that asks for it (``test_pdd``,
``test_pdd_peers``).

Prefill and relay decode in site A, main decode in site B (100 Mbit/s WAN, 5 ms one
way), bounds set so that routing, anomalous traffic and session alignment show.
"""

from __future__ import annotations

import pytest

from testbed.deployment import Deployment
from testbed.router.config import PddConfig
from testbed.scenario import Scenario, ServersSpec
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec


def two_sites(system: str, **fields) -> Scenario:
    """The tests' two-site scenario for one system: a 100 Mbit/s WAN, 5 ms one way, and
    servers that give up on a cut WAN after 5 s (``fields``: more of the scenario)."""
    fields.setdefault("servers", ServersSpec(kv_idle_timeout_s=5, max_total_tokens=60000))
    return Scenario(
        name=f"test_{system}",
        network=NetworkSpec(wan=LinkSpec(rate_mbit=100, delay_ms=5, queue_packets=2000)),
        systems=[system],
        **fields,
    )


@pytest.fixture(scope="module")
def pdd(tmp_path_factory):
    # prefill's KV sends share the WAN's rate (servers.kv_line_share): off by default,
    # its real path runs here (tests/testbed/test_prefix_wait.py checks the pacing)
    scenario = two_sites(
        "pdd",
        servers=ServersSpec(kv_idle_timeout_s=5, max_total_tokens=60000, kv_line_share=True),
        pdd=PddConfig(
            direct_wan_bound_s=0.1,
            anomalous_min_input=1500,
            anomalous_max_output=4,
            turn_wait_s=60,  # the aligned-session test checks P's and MD's hits turn by turn
        ),
    )
    with Deployment(scenario, "pdd", tmp_path_factory.mktemp("pdd"), "tpdd") as deployment:
        yield deployment
