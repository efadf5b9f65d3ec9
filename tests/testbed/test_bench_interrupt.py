"""A bench killed mid-run (SIGTERM, as a CI timeout or `kill` sends): it tears down
everything it started, exits non-zero with a readable message, and the cut-short
system is marked INCOMPLETE so no report passes it off as complete."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reports.run_data import load_run

pytestmark = [pytest.mark.sglang, pytest.mark.netns]


def bench_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "-bench-" in line]


def leftover_processes(run_root) -> list[str]:
    """The bench's router (its argv names the run directory) and servers (bound to the
    emulated network's 10.77.x addresses), if any survived."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if (str(run_root) in argv and "testbed.router" in argv) or "--host 10.77." in argv:
            found.append(argv)
    return found


def test_sigterm_tears_down_and_marks_the_system_incomplete(tmp_path):
    assert not bench_namespaces(), "a bench network is already up"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "bench",
            "same_site",
            "--system",
            "colocated",
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("bench-*/colocated/manifest.json")):  # servers are up
            assert proc.poll() is None and time.monotonic() < deadline, "bench never came up"
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the bench hung: kill it, and leave no network behind
            proc.kill()
            subprocess.run([sys.executable, "-m", "testbed.cli", "net", "down", "--name", "bench"])
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted" in out
    assert not bench_namespaces() and not leftover_processes(tmp_path)
    (run_dir,) = tmp_path.glob("bench-*")
    assert (run_dir / "colocated" / "INCOMPLETE").exists()
    assert not (run_dir / "report.html").exists()
    assert load_run(run_dir).systems == {}  # reports leave the cut-short system out
