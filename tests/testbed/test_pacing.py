"""A real SGLang server paced as 8 GPU-B chips running the 1T MoE, k = 40 times slower.

What a user would notice: the first token comes after k x the modelled prefill, tokens
stream at k x the modelled decode step, a cached-prefix turn pays k x the modelled
extend, and the tokens are exactly the unpaced server's.
"""

from __future__ import annotations

import json
import random
import statistics

import httpx
import pytest

from capacity.roofline import Batch, step_time
from testbed.dilation import EmulationSpec, pacing_env
from testbed.scenario import Scenario
from testbed.server import ServerSpec, SGLangServer
from tests.conftest import reference_output
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec
from workloads.client import stream_generate

pytestmark = pytest.mark.sglang

K = 40.0
NEW_TOKENS = 12
CHIPS = 8


@pytest.fixture(scope="module")
def paced(tiny_model, tmp_path_factory):
    scenario = Scenario(
        name="paced",
        emulation=EmulationSpec(model="1T-moe", chips_per_server=CHIPS, dilation=K),
        network=NetworkSpec(wan=LinkSpec(congestion_control="reno")),  # the one that dilates
    )
    log = tmp_path_factory.mktemp("paced") / "pacing.jsonl"
    env = pacing_env(scenario, "B", str(log))
    server = SGLangServer(
        ServerSpec(model_path=tiny_model, port=30451, extra_env=env), log.with_name("server.log")
    )
    server.start()
    try:
        server.wait_healthy()
        yield server, log
    finally:
        server.stop()


def modelled(batch: Batch) -> float:
    from capacity.profiles import devices, models

    chip, model = devices()["GPU-B"].chip(), models()["1T-moe"].target()
    return K * step_time(batch, chip, model, CHIPS).seconds


def test_passes_follow_the_profile_and_tokens_stay_exact(paced, colocated):
    server, log = paced
    rng = random.Random(7)
    prompt = [rng.randrange(10, 2000) for _ in range(600)]
    with httpx.Client() as client:
        first = stream_generate(client, server.spec.url, prompt, NEW_TOKENS)
        follow = prompt + first.output_ids + [rng.randrange(10, 2000) for _ in range(40)]
        log_start = len(log.read_text().splitlines())
        second = stream_generate(client, server.spec.url, follow, NEW_TOKENS)

    assert first.output_ids == reference_output(colocated, prompt, NEW_TOKENS)
    assert second.output_ids == reference_output(colocated, follow, NEW_TOKENS)

    # Client side: TTFT at least the paced prefill; tokens at the paced decode step.
    prefill = modelled(Batch((len(prompt),), (0,)))
    assert prefill <= first.ttft < prefill + 0.5
    gaps = [b - a for a, b in zip(first.token_times, first.token_times[1:], strict=False)]
    decode = modelled(Batch((1,), (len(prompt) + NEW_TOKENS // 2,)))
    assert statistics.median(gaps) == pytest.approx(decode, rel=0.15)

    # The hook's log: every kind of pass; a pass whose real CPU time outran its paced
    # time (a noisy shared core) is logged as a miss, and misses stay rare.
    passes = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = {p["mode"] for p in passes}
    assert {"prefill", "decode", "extend"} <= kinds
    misses = [p for p in passes if p["miss"]]
    assert len(misses) <= 0.1 * len(passes), misses
    for p in passes:
        assert p["paced_s"] == pytest.approx(K * p["modelled_s"])
        assert (p["real_s"] > p["paced_s"]) == p["miss"]
    extend = [p for p in passes[log_start:] if p["mode"] == "extend"][0]
    expected = modelled(Batch((extend["new_tokens"],), (extend["context"],)))
    assert extend["paced_s"] == pytest.approx(expected)
    assert extend["context"] >= len(prompt)  # the cached prefix was not recomputed
    assert prefill > extend["paced_s"] > decode  # extend between decode and prefill
