"""Start a command at a CPU priority that holds between sessions.

``nice`` alone does not, where the kernel groups tasks by session (autogroup: on by
default in many kernels, this machine's included, ``/proc/sys/kernel/
sched_autogroup_enabled``): each session's group gets an equal share of a core, whatever
the nice values of the tasks in it, and every server, router and daemon the testbed
starts leads a session of its own. Measured here: two busy loops on one core, each in
its own session, one at nice 5, shared it 49/51; with the niced one's session group
also at 5, 75/25, as CFS's weights say. So the command first leads a session of its
own (unless it already does), gives that session's group the priority
(``/proc/self/autogroup``), takes it itself (``os.nice``, relative to the launcher's
as ``nice -n``), then becomes the command::

    python -m topologies.priority N -- argv...

A priority that cannot be given ends the command with a readable error (a testbed that
says a server runs below prefill must not run it at equal priority).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")
RETRY_S = 0.11  # an unprivileged write is refused (EAGAIN) within 0.1 s of the last one


def priority_argv(nice: int, argv: Sequence[str]) -> list[str]:
    """``argv`` started at CPU priority ``nice`` (0: as it is)."""
    if not nice:
        return list(argv)
    return [sys.executable, "-m", "topologies.priority", str(nice), "--", *argv]


def take(nice: int) -> None:
    """This process (and what it execs) at ``nice``, its session's group too."""
    if os.getsid(0) != os.getpid():
        os.setsid()  # a group of its own: the launcher's stays as it is
    if AUTOGROUP.exists():
        for attempt in range(3):
            try:
                AUTOGROUP.write_text(str(nice))
                break
            except BlockingIOError:
                if attempt == 2:
                    raise
                time.sleep(RETRY_S)
    os.nice(nice)  # relative to the launcher's, as nice -n


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].lstrip("+-").isdigit():
        print("usage: python -m topologies.priority NICE -- argv...", file=sys.stderr)
        return 2
    nice = int(args[0])
    try:
        take(nice)
    except OSError as exc:
        print(f"topologies.priority: cannot run at nice {nice}: {exc}", file=sys.stderr)
        return 1
    os.execvp(args[2], args[2:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
