"""Waiting, before a router is stopped, until it has written every request's record.

A relayed request's record is written once prefill answers, which it does when its KV
leg to main decode has crossed the WAN: seconds after the client's last token on a slow
line. Stopped before that, the router writes the record without its KV transfer joined
(and says so in ``fallback``); a harness waits here first.
"""

from __future__ import annotations

import time

import httpx

RECORDS_WAIT_S = 60.0  # at most this long; a WAN leg still crossing after it is cut


def wait_for_records(router_url: str, timeout_s: float = RECORDS_WAIT_S) -> int:
    """Poll the router's ``/pdd/stats`` until no record is pending. Returns how many
    still were when ``timeout_s`` ran out (0: all written; also when the router does
    not answer, which the caller's health check reports)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reply = httpx.get(f"{router_url}/pdd/stats", timeout=5)
            pending = int(reply.json().get("records_pending", 0))
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            return 0
        if pending <= 0 or time.monotonic() >= deadline:
            return max(0, pending)
        time.sleep(0.2)
