"""A command started at a priority gets it against commands in other sessions (the
testbed starts every server, router and daemon in a session of its own, and where the
kernel groups tasks by session, ``nice`` alone changed nothing between them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from topologies.priority import main, priority_argv

SPIN = "import time\nt, n = time.time(), 0\nwhile time.time() - t < 2.0: n += 1\nprint(n)"


def _spin(argv: list[str]) -> subprocess.Popen:
    # one core for both; each in a session of its own, as HostProcess starts them
    return subprocess.Popen(
        ["taskset", "-c", "0", *argv], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def test_a_niced_command_in_its_own_session_gets_the_smaller_share_of_a_shared_core():
    plain = _spin([sys.executable, "-c", SPIN])
    niced = _spin(priority_argv(5, [sys.executable, "-c", SPIN]))
    a, b = int(plain.communicate(timeout=30)[0]), int(niced.communicate(timeout=30)[0])
    # CFS's weights at nice 0 and 5: 1024 and 335, a 25% share; equal priority: 50%
    assert b / (a + b) < 0.4, (a, b)


def test_the_priority_is_the_commands_and_its_sessions_not_the_launchers():
    probe = (
        "import os, pathlib; g = pathlib.Path('/proc/self/autogroup');"
        "print(os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0) == os.getpid(),"
        " g.read_text().split()[-1] if g.exists() else 'none')"
    )
    before = _group()
    out = subprocess.run(
        priority_argv(3, [sys.executable, "-c", probe]), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    nice, leader, group = out.stdout.split()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert int(nice) == base + 3 and leader == "True"
    assert group in ("3", "none")  # its session's group, where the kernel has them
    assert _group() == before  # the launcher's session keeps its priority
    assert priority_argv(0, ["true"]) == ["true"]


def _group() -> str:
    path = Path("/proc/self/autogroup")
    return path.read_text() if path.exists() else ""


def test_a_malformed_call_is_refused(capsys):
    assert main(["5", "true"]) == 2
    assert "usage" in capsys.readouterr().err
    assert main(["low", "--", "true"]) == 2  # not a priority: the usage, no traceback
    assert "usage" in capsys.readouterr().err
