"""Fixtures for tests that run real servers: a colocated reference on loopback."""

from __future__ import annotations

import os

import httpx
import pytest

from testbed.server import ServerSpec, SGLangServer
from workloads.client import generate_payload


def pytest_collection_modifyitems(items):
    for item in items:
        if "netns" in item.keywords and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root (network namespaces)"))


@pytest.fixture(scope="session")
def colocated(tiny_model, tmp_path_factory):
    """A colocated SGLang server: the reference every PD output must equal."""
    server = SGLangServer(
        ServerSpec(model_path=tiny_model, port=30401),
        tmp_path_factory.mktemp("colocated") / "server.log",
    )
    server.start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def reference_output(server: SGLangServer, prompt: list[int], new_tokens: int) -> list[int]:
    r = httpx.post(
        f"{server.spec.url}/generate", json=generate_payload(prompt, new_tokens, False), timeout=300
    )
    r.raise_for_status()
    return r.json()["output_ids"]
