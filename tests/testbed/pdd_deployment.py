"""How the PDD tests talk to a deployment (the ``pdd`` fixture, tests/testbed/conftest.py):
a streamed request through the router, and the router's record of it."""

from __future__ import annotations

import time

import httpx

from protocol import headers
from protocol.records import read_records
from testbed.deployment import Deployment
from workloads.client import generate_payload, iter_new_tokens


def stream(pdd: Deployment, prompt, new_tokens, session, turn=0, pins=None) -> list[int]:
    ids = []
    hdrs = {headers.SESSION: session, headers.TURN: str(turn), **(pins or {})}
    payload = generate_payload(prompt, new_tokens, True)
    with httpx.stream(
        "POST", f"{pdd.router_url}/generate", json=payload, headers=hdrs, timeout=300
    ) as r:
        assert r.status_code == 200
        for new, _ in iter_new_tokens(r.iter_lines()):
            ids += new
    return ids


def record_of(pdd: Deployment, session: str, turn: int = 0):
    """The router's record of a request (written just after its last token)."""
    deadline = time.monotonic() + 10
    while True:
        records = read_records(pdd.records_path) if pdd.records_path.exists() else []
        mine = [r for r in records if r.session_id == session and r.turn == turn]
        if mine or time.monotonic() > deadline:
            return mine[-1]
        time.sleep(0.2)
