"""Bootstrap rooms: which transfers fan out to two destinations.

A room is the id that ties a prefill request to its decode request(s). PDD's
router marks a dual-path room (relay decode over the LAN *and* main decode over
the WAN) by setting ``DUAL_PATH_BIT``; the prefill server then waits for two
transfer requests for that room instead of one. Rooms are otherwise random
(below bit 61), as SGLang's own routers make them.
"""

from __future__ import annotations

import random

DUAL_PATH_BIT = 1 << 62
ROOM_BITS = 61


def new_room(dual_path: bool = False, rng: random.Random | None = None) -> int:
    room = (rng or random).getrandbits(ROOM_BITS) | 1  # never 0: SGLang reads 0 as "unset"
    return room | DUAL_PATH_BIT if dual_path else room


def is_dual_path(room: int | None) -> bool:
    return bool(room and room & DUAL_PATH_BIT)


def legs_expected(room: int | None) -> int:
    return 2 if is_dual_path(room) else 1
