"""The roofline of a forward pass on the shipped profiles: prefill compute-bound, decode
memory-bound, extend in between, and the two chip types each better at their phase."""

from __future__ import annotations

import pytest

from capacity.profiles import devices, models
from capacity.roofline import Batch, step_time

MODEL = models()["1T-moe"].target()
A, B = devices()["GPU-A"].chip(), devices()["GPU-B"].chip()
PREFILL = Batch((8192,), (0,))
DECODE = Batch((1,) * 32, (8192,) * 32)
EXTEND = Batch((100,), (8192,))  # PDD's handoff: 100 token ids over an 8K prompt


def intensity(batch: Batch, chip) -> float:
    t = step_time(batch, chip, MODEL, chips=8)
    return t.compute_s / t.memory_s


def test_phases_fall_on_their_side_of_the_roofline():
    assert step_time(PREFILL, A, MODEL, 8).bound == "compute"
    assert step_time(DECODE, A, MODEL, 8).bound == "memory"
    assert intensity(DECODE, A) < intensity(EXTEND, A) < intensity(PREFILL, A)


def test_prefill_strong_and_decode_strong_chips():
    assert step_time(PREFILL, A, MODEL, 8).seconds < step_time(PREFILL, B, MODEL, 8).seconds
    assert step_time(DECODE, B, MODEL, 8).seconds < step_time(DECODE, A, MODEL, 8).seconds


def test_an_extend_costs_about_a_loaded_decode_step_not_a_prefill():
    # 100 tokens touch nearly every expert, as a loaded decode batch does: the pass
    # costs about one such step (PDD's "nearly free" on a busy main decode).
    extend = step_time(EXTEND, B, MODEL, 8).seconds
    assert extend < 2 * step_time(DECODE, B, MODEL, 8).seconds
    assert extend < step_time(PREFILL, B, MODEL, 8).seconds / 5


def test_time_scales_with_chips_and_batches_need_a_context_each():
    one, eight = step_time(PREFILL, A, MODEL, 1).seconds, step_time(PREFILL, A, MODEL, 8).seconds
    assert one == pytest.approx(8 * eight)
    with pytest.raises(ValueError, match="each sequence"):
        Batch((1, 2), (0,))
