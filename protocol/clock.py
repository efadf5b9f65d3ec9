"""The one clock records are stamped with: wall-clock seconds that advance like the
monotonic clock.

Each process reads the wall clock once, at import, and from then on adds the monotonic
clock's progress to it. Timestamps from router, servers and transfers still line up on
one host (every process anchors to the same wall clock), while a duration between two
of them (a TTFT, an inter-token gap) is what the monotonic clock measured: a step of the
wall clock (NTP, a hypervisor's time sync) in the middle of a request cannot shorten or
stretch it. Load tools measure their latencies the same way (AIPerf pairs
``perf_counter_ns`` with one ``time_ns`` reading).
"""

from __future__ import annotations

import time

_WALL0 = time.time()
_MONO0 = time.monotonic()


def now() -> float:
    """Seconds since the epoch, advancing monotonically within this process."""
    return _WALL0 + (time.monotonic() - _MONO0)
