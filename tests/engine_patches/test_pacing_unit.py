"""The pacing hook on stand-in batches: each pass takes k x its modelled time.

``FakeBatch`` stands in for SGLang's ScheduleBatch (only the fields the hook reads:
forward_mode, reqs' seqlen, extend_lens, prefix_lens) and ``run_batch`` for the real
forward pass (it sleeps a chosen time). The real hook on a real server is tested in
tests/testbed/test_pacing.py.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from capacity.pacing import Pacing
from capacity.profiles import devices, models
from capacity.roofline import Batch, step_time
from engine_patches.pacing.hook import Pacer, batch_shape

MODEL = models()["1T-moe"].target()
CHIP = devices()["GPU-B"].chip()


class Mode:
    def __init__(self, name: str):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_extend(self):
        return self.name == "extend"

    def is_mixed(self):
        return False


def fake_batch(mode: str, new: list[int], context: list[int]):
    reqs = [SimpleNamespace(seqlen=c + 1) for c in context]
    return SimpleNamespace(forward_mode=Mode(mode), reqs=reqs, extend_lens=new, prefix_lens=context)


CASES = {
    "prefill": (fake_batch("extend", [4096], [0]), Batch((4096,), (0,))),
    "extend": (fake_batch("extend", [100], [8192]), Batch((100,), (8192,))),
    "decode": (fake_batch("decode", [1] * 16, [4000] * 16), Batch((1,) * 16, (4000,) * 16)),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_a_pass_takes_dilation_times_its_modelled_time(mode, tmp_path):
    batch, shape = CASES[mode]
    assert batch_shape(batch) == (mode, shape)
    pacing = Pacing(CHIP, MODEL, chips=8, dilation=20, log_path=str(tmp_path / "p.jsonl"))
    expected = 20 * step_time(shape, CHIP, MODEL, 8).seconds
    real = expected / 4

    start = time.monotonic()
    Pacer(pacing).around(lambda s, b: time.sleep(real), None, batch)
    took = time.monotonic() - start

    assert expected <= took < expected + 0.05
    (line,) = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert line["mode"] == mode and not line["miss"]
    assert line["paced_s"] == pytest.approx(expected)
    assert line["real_s"] == pytest.approx(real, abs=0.02)


def test_a_pass_slower_than_its_paced_time_is_reported_as_a_miss(tmp_path):
    batch, shape = CASES["decode"]
    pacing = Pacing(CHIP, MODEL, chips=8, dilation=1, log_path=str(tmp_path / "p.jsonl"))
    expected = step_time(shape, CHIP, MODEL, 8).seconds
    Pacer(pacing).around(lambda s, b: time.sleep(expected * 3), None, batch)
    line = json.loads((tmp_path / "p.jsonl").read_text())
    assert line["miss"] and line["real_s"] > line["paced_s"]


def test_passes_without_a_forward_are_not_paced():
    batch = fake_batch("idle", [], [])
    assert batch_shape(batch) is None
    pacing = Pacing(CHIP, MODEL, chips=1, dilation=1000)
    start = time.monotonic()
    assert Pacer(pacing).around(lambda s, b: "done", None, batch) == "done"
    assert time.monotonic() - start < 0.05


def test_pacing_round_trips_through_the_environment():
    pacing = Pacing(CHIP, MODEL, chips=4, dilation=12.5, log_path="/tmp/x")
    assert Pacing.from_json(pacing.to_json()) == pacing
    with pytest.raises(ValueError):
        Pacing(CHIP, MODEL, chips=0)
