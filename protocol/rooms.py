"""Bootstrap rooms and the request ids PDD gives its own requests.

A room is the id that ties a prefill request to its decode request(s). PDD's
router marks a dual-path room (relay decode over the LAN *and* main decode over
the WAN) by setting ``DUAL_PATH_BIT``; the prefill server then waits for two
transfer requests for that room instead of one. It marks a P->MD room
``EARLY_START_BIT``: prefill computes without waiting for main decode's transfer
request, which crosses the WAN (a round trip, plus main decode's scheduling); the KV
waits in prefill's pool, and the request, when it comes, gets every chunk so far. SGLang
waits for the decode first because an RDMA write needs its addresses; a TCP transfer
does not. A room also says when it was routed (``ORDER_BIT`` set: the router's wall
clock in microseconds above 20 random bits), so a decode server can tell which of two
requests the router sent first (:func:`routed_before`: main decode holds a request back
only for KV routed before it, as the router predicts it; SGLang's own routers' random
rooms say nothing). The router also names, in the request it sends main decode, the
room whose KV it predicted that request held back for (``AFTER_KEY`` in SGLang's
``custom_params``, which reach the scheduler's request untouched: :func:`with_after`,
:func:`after_room`): main decode may take the later request first, before the other has
reached it, and it cannot hold a request for one it has not seen. A request whose client
waits on main decode (P->MD) names, too, how long main decode may hold it back at most
(``HOLD_KEY``: :func:`hold_bound`): about what its own KV's crossing was predicted to
take, past which the hold has lost its point (hetero run 061253: a P->MD turn the
router predicted unheld waited 76 s behind its session's stalled transfer, TTFT 89 s).

Two rid prefixes tell the plugin what a request is for: main decode parks a
``PARK_PREFIX`` request until the handoff, and prefill caches an ``ALIGN_PREFIX``
request's exchange (DRC alignment).
"""

from __future__ import annotations

import random
import time

DUAL_PATH_BIT = 1 << 62
EARLY_START_BIT = 1 << 61
ORDER_BIT = 1 << 60
RANDOM_BITS = 20  # below the routing time: rooms routed in one microsecond differ here
TIME_BITS = 40  # microseconds, wrapping every 12.7 days (compared modulo that)
PARK_PREFIX = "pdd-md-"  # MD's request of a relayed pipeline: parked until the handoff
ALIGN_PREFIX = "pdd-align-"  # P caches this exchange (DRC alignment)
RESERVED_PREFIXES = (PARK_PREFIX, ALIGN_PREFIX)
AFTER_KEY = "__pdd_after_room"  # custom_params: the room decode should wait for first
HOLD_KEY = "__pdd_hold_s"  # custom_params: the most seconds decode may hold the request


def new_room(
    dual_path: bool = False,
    early_start: bool = False,
    rng: random.Random | None = None,
    routed_us: int | None = None,
) -> int:
    """A fresh room, stamped with when it was routed (``routed_us``: now by default)."""
    routed_us = time.time_ns() // 1000 if routed_us is None else routed_us
    stamp = (routed_us % (1 << TIME_BITS)) << RANDOM_BITS
    room = stamp | (rng or random).getrandbits(RANDOM_BITS) | 1 | ORDER_BIT  # never 0
    return room | (DUAL_PATH_BIT if dual_path else 0) | (EARLY_START_BIT if early_start else 0)


def routed_before(room: int | None, other: int | None) -> bool | None:
    """Whether ``room`` was routed before ``other`` (None: either says nothing of it)."""
    if not isinstance(room, int) or not isinstance(other, int):
        return None
    if not (room & ORDER_BIT and other & ORDER_BIT):
        return None
    mask = (1 << TIME_BITS) - 1
    ahead = ((other >> RANDOM_BITS) - (room >> RANDOM_BITS)) & mask  # modulo the wrap
    return 0 < ahead < (1 << (TIME_BITS - 1))


def with_after(body: dict, room: int | None, path: str, hold_s: float | None = None) -> dict:
    """``body`` naming ``room`` as the transfer decode holds it back for, and ``hold_s``
    as the longest decode may hold it back (None: not named): a native ``/generate``
    request carries ``custom_params`` in its sampling params, an OpenAI one at its top."""
    named = {k: v for k, v in ((AFTER_KEY, room), (HOLD_KEY, hold_s)) if v is not None}
    if not named:
        return body
    if path == "/generate":
        params = dict(body.get("sampling_params") or {})
        params["custom_params"] = {**(params.get("custom_params") or {}), **named}
        return {**body, "sampling_params": params}
    return {**body, "custom_params": {**(body.get("custom_params") or {}), **named}}


def _custom(req, key: str):
    custom = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    value = custom.get(key) if isinstance(custom, dict) else None
    return None if isinstance(value, bool) else value


def after_room(req) -> int | None:
    """The room the router named for an SGLang request (``with_after``), if any."""
    room = _custom(req, AFTER_KEY)
    return room if isinstance(room, int) else None


def hold_bound(req) -> float | None:
    """The longest the router allows decode to hold an SGLang request back (``with_after``),
    if it said (a number of seconds, at least 0)."""
    seconds = _custom(req, HOLD_KEY)
    if isinstance(seconds, int | float) and seconds == seconds:  # not NaN
        return max(0.0, float(seconds))
    return None


def is_dual_path(room: int | None) -> bool:
    return bool(room and room & DUAL_PATH_BIT)


def starts_early(room: int | None) -> bool:
    return bool(room and room & EARLY_START_BIT)


def legs_expected(room: int | None) -> int:
    return 2 if is_dual_path(room) else 1


def md_rid(room: int) -> str:
    """Main decode's rid for a relayed request's room."""
    return f"{PARK_PREFIX}{room}"


def align_rid(room: int) -> str:
    return f"{ALIGN_PREFIX}{room}"
