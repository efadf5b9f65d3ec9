"""Bootstrap rooms and the request ids PDD gives its own requests.

A room is the id that ties a prefill request to its decode request(s). PDD's
router marks a dual-path room (relay decode over the LAN *and* main decode over
the WAN) by setting ``DUAL_PATH_BIT``; the prefill server then waits for two
transfer requests for that room instead of one. It marks a P->MD room
``EARLY_START_BIT``: prefill computes without waiting for main decode's transfer
request, which crosses the WAN (a round trip, plus main decode's scheduling); the KV
waits in prefill's pool, and the request, when it comes, gets every chunk so far. SGLang
waits for the decode first because an RDMA write needs its addresses; a TCP transfer
does not. Rooms are otherwise random (below bit 61), as SGLang's own routers make them.

Two rid prefixes tell the plugin what a request is for: main decode parks a
``PARK_PREFIX`` request until the handoff, and prefill caches an ``ALIGN_PREFIX``
request's exchange (DRC alignment).
"""

from __future__ import annotations

import random

DUAL_PATH_BIT = 1 << 62
EARLY_START_BIT = 1 << 61
ROOM_BITS = 61
PARK_PREFIX = "pdd-md-"  # MD's request of a relayed pipeline: parked until the handoff
ALIGN_PREFIX = "pdd-align-"  # P caches this exchange (DRC alignment)
RESERVED_PREFIXES = (PARK_PREFIX, ALIGN_PREFIX)


def new_room(
    dual_path: bool = False, early_start: bool = False, rng: random.Random | None = None
) -> int:
    room = (rng or random).getrandbits(ROOM_BITS) | 1  # never 0: SGLang reads 0 as "unset"
    return room | (DUAL_PATH_BIT if dual_path else 0) | (EARLY_START_BIT if early_start else 0)


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
