"""Shared fixtures: the default tiny model, and a colocated SGLang server as the reference
every disaggregated output must equal."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from testbed import model as model_mod
from testbed.server import ServerSpec, SGLangServer
from topologies import registry
from workloads.client import generate_payload


def pytest_collection_modifyitems(items):
    """Tests marked netns need root and iproute2; elsewhere they skip and say why.
    CI runs as root, so there they always run."""
    if os.geteuid() == 0 and shutil.which("ip"):
        return
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (network namespaces)"))


@pytest.fixture(scope="module", autouse=True)
def no_network_left_behind(request):
    """Only one emulated network runs at a time, so a module that leaves one up would
    fail every module after it: tear such a network down and fail the module that left
    it (with a name, instead of a cascade of 'network is up' errors)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        yield
        return
    before = set(registry.names_up())
    yield
    left = sorted(n for n in set(registry.names_up()) - before if _ours(n))
    for name in left:
        registry.down_by_name(name)
    if left:
        pytest.fail(f"{request.module.__name__} left network(s) {left} up (now torn down)")


def _ours(name: str) -> bool:
    """Network ``name`` was brought up by this test run (this process or one it
    started), or by a process now dead; not by another run on the same host."""
    pid = registry.owner(name)
    while pid and pid != os.getpid():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True  # its owner is gone: an orphan
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's PID
    return True if pid is None else pid == os.getpid()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The default tiny model; built under the normal cache (reused across runs)."""
    return model_mod.build(model_mod.ModelShape())


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


def ttft_parts_that_add_up(records, name: str):
    """Each request's TTFT parts (reports.ttft): present for every record, none
    negative, summing to its TTFT (within 5 ms of clock rounding). Returns the parts."""
    from protocol.metrics import TtftPart
    from reports import ttft

    parts = ttft.parts(records)
    assert len(parts) == len(records), name  # every request
    split = parts[[p.value for p in TtftPart]]
    assert (split.fillna(0) >= -0.005).all().all(), (name, split)
    assert (split.sum(axis=1) - parts["ttft_s"]).abs().max() < 0.005, name
    return split
