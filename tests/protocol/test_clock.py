"""The records' one clock: anchored to the wall clock, advancing with the monotonic one."""

from __future__ import annotations

import subprocess
import sys
import time

from protocol import clock


def test_now_starts_at_the_wall_clock_and_never_goes_back():
    stamps = [clock.now() for _ in range(10_000)]
    assert all(b >= a for a, b in zip(stamps, stamps[1:], strict=False))
    assert abs(clock.now() - time.time()) < 1.0  # no wall-clock step on this host


def test_a_wall_clock_step_does_not_change_a_duration(monkeypatch):
    start = clock.now()
    monkeypatch.setattr(time, "time", lambda: 0.0)  # the wall clock jumps back to 1970
    time.sleep(0.05)
    took = clock.now() - start
    assert 0.05 <= took < 1.0


def test_two_processes_stamp_on_one_timeline():
    """A record from another process (a server, a load client) lines up with this one's."""
    code = "from protocol import clock; print(clock.now())"
    before = clock.now()
    other = float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    after = clock.now()
    # (processes anchored minutes apart may differ by the wall clock's slew since: < 1 s)
    assert before - 1.0 <= other <= after + 1.0
