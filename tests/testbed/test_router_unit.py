"""The router on its own: a dead upstream gives the client a clear error and a record."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from testbed.router.policies import Loads
from tests.testbed.router_process import colocated_config, free_port, running_router


def test_unreachable_server_is_a_clear_502_and_an_error_record(tmp_path):
    config = colocated_config(tmp_path, {"gone": free_port()})
    with running_router(config, tmp_path) as url:
        r = httpx.post(
            f"{url}/generate",
            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}},
            timeout=30,
        )
        # 502 if the request came before the first health probe, 503 once the router
        # knows the server is down: either way a JSON error naming it.
        assert r.status_code in (502, 503) and "gone" in r.json()["error"]["message"]
        bad = httpx.post(f"{url}/generate", content=b"{not json", timeout=30)
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        time.sleep(0.2)
        records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
        assert records[0]["status"] in ("upstream_error", "rejected")
        assert records[1]["status"] == "rejected" and "gone" in records[0]["error"]


def test_loads_learn_a_decoders_interval_from_requests_it_decoded_alone():
    loads = Loads()
    loads.learn_itl("md", [0.0, 0.05, 0.10, 0.15, 0.30], switched=False)  # median gap 0.05
    assert loads.itl["md"] == pytest.approx(0.05)
    loads.learn_itl("md", [0.0, 0.2, 0.4, 0.6], switched=True)  # two servers' gaps: ignored
    loads.learn_itl("md", [0.0, 0.1], switched=False)  # one gap says too little
    assert loads.itl["md"] == pytest.approx(0.05)
    loads.learn_itl("md", [0.0, 0.15, 0.30, 0.45], switched=False)  # decays towards 0.15
    assert loads.itl["md"] == pytest.approx(0.05 + Loads.ITL_WEIGHT * 0.10)
