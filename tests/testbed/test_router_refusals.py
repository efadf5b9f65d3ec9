"""A request a server refuses (a sampling option SGLang does not take: the router passes
options through unchecked) is the client's error on every pipeline, whichever server
answers first: the server's status and message, a ``rejected`` record, and the
deployment serves on (real servers: the ``pdd`` deployment of
tests/testbed/conftest.py)."""

from __future__ import annotations

import httpx
import pytest

from protocol import headers
from protocol.names import Pipeline
from tests.testbed.pdd_deployment import record_of, stream
from workloads.client import generate_payload

pytestmark = [pytest.mark.sglang, pytest.mark.netns]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("pipeline", [Pipeline.P_MD, Pipeline.P_RLD_MD, Pipeline.RLD_ONLY])
def test_an_option_sglang_refuses_is_the_clients_error_not_a_server_failure(
    pdd, pipeline, streamed
):
    prompt = list(range(40, 140))
    payload = generate_payload(prompt, 4, streamed)
    payload["sampling_params"]["no_such_option"] = 1
    session = f"refused-{pipeline}-{streamed}"
    hdrs = {headers.SESSION: session, headers.TURN: "0", headers.PIPELINE: pipeline}
    r = httpx.post(f"{pdd.router_url}/generate", json=payload, headers=hdrs, timeout=60)
    assert r.status_code == 400, r.text  # was 502 "upstream failure" when prefill answered
    assert "no_such_option" in r.text
    record = record_of(pdd, session)
    assert record.status == "rejected" and "no_such_option" in record.error
    assert len(stream(pdd, prompt, 4, f"{session}-then", pins={headers.PIPELINE: pipeline})) == 4
