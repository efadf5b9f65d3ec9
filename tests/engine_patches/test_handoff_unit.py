"""The handoff's wire format, dual-path rooms, and the SGLang names its hooks target."""

from __future__ import annotations

import importlib
import inspect

from engine_patches import drc_align
from engine_patches.handoff.register import TARGETS
from protocol.frames import HEADER
from protocol.handoff import Extended, Handoff, Ready
from protocol.rooms import is_dual_path, legs_expected, new_room


def test_a_handoff_frame_is_four_bytes_per_token_plus_a_fixed_header():
    tokens = tuple(range(4000, 4100))
    body = Handoff(tokens, final=True).encode()
    assert HEADER.size + len(body) == Handoff.wire_bytes(100) == 20 + 1 + 400
    back = Handoff.decode(body)
    assert back.tokens == tokens and back.final
    assert Handoff.decode(Handoff((), False).encode()) == Handoff((), False)
    assert Ready.decode(Ready(812, 800).encode()) == Ready(812, 800)
    ext = Extended.decode(Extended(63, 63, 1234, 0.25, True).encode())
    assert (ext.tokens, ext.extend_tokens, ext.next_token, ext.final) == (63, 63, 1234, True)


def test_dual_path_rooms_expect_two_destinations():
    plain, dual = new_room(), new_room(dual_path=True)
    assert not is_dual_path(plain) and legs_expected(plain) == 1
    assert is_dual_path(dual) and legs_expected(dual) == 2
    assert plain > 0 and dual < 2**63  # fits SGLang's signed 64-bit room


def test_handoff_and_alignment_hook_targets_exist():
    """An SGLang upgrade that renames what the handoff hooks must fail here."""
    from sglang.srt.managers.schedule_batch import Req

    init = inspect.unwrap(Req.__init__)  # the plugin may have hooked it already
    assert "skip_radix_cache_insert" in init.__code__.co_names  # what drc_align clears
    for target in (*TARGETS, drc_align.TARGET):
        module, cls, attr = target.rsplit(".", 2)
        assert callable(getattr(getattr(importlib.import_module(module), cls), attr)), target


def test_the_final_extend_predicts_only_a_token_that_cannot_end_the_request():
    """A request that ended in its merge step would crash SGLang's release path (seen:
    a short Mooncake output on main decode), so the prediction is only taken when at
    least one more token is to come and no stop token or string could match."""
    from types import SimpleNamespace

    from engine_patches.handoff.md import predicts_safely

    def req(outputs, max_new, **params):
        base = dict(ignore_eos=True, stop_token_ids=None, stop_strs=None, max_new_tokens=max_new)
        return SimpleNamespace(
            output_ids=[0] * outputs, sampling_params=SimpleNamespace(**{**base, **params})
        )

    assert predicts_safely(req(1, 10), new_tokens=5)  # 7 outputs after it: 3 to come
    assert not predicts_safely(req(1, 7), new_tokens=5)  # the prediction would be the last
    assert not predicts_safely(req(1, 100, ignore_eos=False), new_tokens=5)  # EOS could end it
    assert not predicts_safely(req(1, 100, stop_strs=["\n"]), new_tokens=5)
