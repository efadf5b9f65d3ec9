"""The router on its own: a dead upstream gives the client a clear error and a record."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx

from testbed.router.config import RouterConfig, ServerEntry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_a_clear_502_and_an_error_record(tmp_path):
    dead, port = free_port(), free_port()
    config = RouterConfig(
        system="colocated",
        policy="colocated",
        records=tmp_path / "records.jsonl",
        host="127.0.0.1",
        port=port,
        servers=[
            ServerEntry(
                name="gone", url=f"http://127.0.0.1:{dead}", role="colocated", host="127.0.0.1"
            )
        ],
    )
    (tmp_path / "router.json").write_text(config.model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "testbed.router", str(tmp_path / "router.json")])
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(
            f"http://127.0.0.1:{port}/generate",
            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}},
            timeout=30,
        )
        # 502 if the request came before the first health probe, 503 once the router
        # knows the server is down: either way a JSON error naming it.
        assert r.status_code in (502, 503) and "gone" in r.json()["error"]["message"]
        bad = httpx.post(f"http://127.0.0.1:{port}/generate", content=b"{not json", timeout=30)
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        time.sleep(0.2)
        records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
        assert records[0]["status"] in ("upstream_error", "rejected")
        assert records[1]["status"] == "rejected" and "gone" in records[0]["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
