"""The handoff's wire format, dual-path rooms, and the SGLang names its hooks target."""

from __future__ import annotations

import importlib
import inspect
import socket
import time
from types import SimpleNamespace

from engine_patches import drc_align
from engine_patches.handoff import md
from engine_patches.handoff.register import TARGETS
from protocol.env import Env
from protocol.frames import HEADER, MsgType, send_frame
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


def test_a_router_channel_stays_open_while_its_rooms_kv_is_on_the_way(monkeypatch):
    """Main decode's handoff listener, without SGLang: the commands it queues for the
    scheduler are run here by ``tick``. A router is silent on its channel from WATCH
    until the KV is held, however long the WAN takes (a dilated hetero leg took 166 s,
    and a fixed read timeout closed the channel and released the room); with no KV on
    its way, a silent router is gone after a park timeout and a margin."""
    monkeypatch.setenv(Env.HANDOFF_PARK_TIMEOUT_S, "0.1")
    monkeypatch.setattr(md, "QUIET_MARGIN_S", 0.2)
    scheduler = SimpleNamespace(server_args=SimpleNamespace(host="127.0.0.1"))
    service = md.HandoffService(scheduler, 0)
    port = service.listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as router:
        send_frame(router, MsgType.WATCH, 7)
        _until(lambda: not service.commands.empty())
        service.tick()  # WATCH before the KV: the room is watched
        assert 7 in service.watchers
        time.sleep(1.0)  # 3x the quiet limit, the KV still on its way
        send_frame(router, MsgType.RELEASE, 7, b"done")
        _until(lambda: not service.commands.empty())
        conn, kind, room, body, _ = service.commands.get_nowait()
        assert (kind, room, body) == (MsgType.RELEASE, 7, b"done")  # read, not "closed"
        service._command(conn, kind, room, body, 0.0)
        assert 7 not in service.watchers
        router.settimeout(5)
        started = time.monotonic()
        assert router.recv(1) == b""  # nothing on its way now: closed once quiet
        assert time.monotonic() - started < 4
    service.listener.close()


def test_main_decode_runs_one_extend_forward_per_scheduler_iteration(monkeypatch):
    """Two rooms' handoffs queued at once: ``tick`` runs one extend and leaves the other
    for the next loop iteration, so main decode's batch takes a decode step between
    them instead of waiting out both. ``extend_parked`` is a stand-in for SGLang's
    extend forward (what it computes is checked token-exact in test_pdd)."""
    forwards = []

    def extend(scheduler, req, tokens, through_last=False):
        req.output_ids.extend(tokens)
        forwards.append(req.rid)
        return 7, len(tokens)

    monkeypatch.setattr(md, "extend_parked", extend)
    scheduler = SimpleNamespace(server_args=SimpleNamespace(host="127.0.0.1"), waiting_queue=[])
    service = md.HandoffService(scheduler, 0)
    params = SimpleNamespace(max_new_tokens=100, ignore_eos=True, stop_token_ids=None)
    for room in (1, 2):
        req = SimpleNamespace(rid=f"r{room}", output_ids=[5], sampling_params=params)
        service.parked[room] = md.Parked(req, time.monotonic())
        body = Handoff((1, 2, 3), final=False).encode()
        service.commands.put((None, MsgType.HANDOFF, room, body, 0.0))
    service.commands.put((None, MsgType.RELEASE, 9, b"", 0.0))  # cheap: no forward
    service.tick()
    assert forwards == ["r1"] and service.commands.qsize() == 2
    service.tick()
    assert forwards == ["r1", "r2"]
    service.tick()
    assert service.commands.empty() and forwards == ["r1", "r2"]
    assert [p.req.output_ids for p in service.parked.values()] == [[5, 1, 2, 3]] * 2
    service.listener.close()


def _until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
