"""A real router process for tests: a colocated-policy router over the given servers,
started, waited for, and stopped (even when the test fails)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from testbed.router.config import RouterConfig, ServerEntry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def colocated_config(tmp: Path, servers: dict[str, int], **fields) -> RouterConfig:
    """Router config over servers ``name → port`` on 127.0.0.1 (colocated role)."""
    return RouterConfig(
        system="colocated",
        policy="colocated",
        records=tmp / "records.jsonl",
        host="127.0.0.1",
        port=free_port(),
        servers=[
            ServerEntry(name=n, url=f"http://127.0.0.1:{p}", role="colocated", host="127.0.0.1")
            for n, p in servers.items()
        ],
        **fields,
    )


@contextlib.contextmanager
def running_router(config: RouterConfig, tmp: Path):
    """Yields the router's URL once it answers /health."""
    path = tmp / "router.json"
    path.write_text(config.model_dump_json())
    with open(tmp / "router.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "testbed.router", str(path)], stdout=log, stderr=log
        )
        url = f"http://127.0.0.1:{config.port}"
        try:
            for _ in range(100):
                try:
                    httpx.get(url + "/health", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)
