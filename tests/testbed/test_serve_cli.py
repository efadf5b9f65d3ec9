"""`testbed serve` comes up, prints its URL, answers the doctor through its host agent,
and leaves no process behind after SIGTERM."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.sglang


def test_serve_then_sigterm_leaves_no_process(tiny_model, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "testbed.cli",
        "serve",
        "--model",
        str(tiny_model),
        "--port",
        "30202",
        "--log",
        str(tmp_path / "serve.log"),
        "--agent-port",
        "30203",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        output = ""
        while "ready" not in output and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                output += proc.stdout.readline()
        assert "http://127.0.0.1:30202" in output, output
        doctor = [sys.executable, "-m", "testbed.cli", "doctor", "--model", str(tiny_model)]
        checked = subprocess.run(
            [*doctor, "--host", "http://127.0.0.1:30203"], capture_output=True, text=True
        )
        assert checked.returncode == 0 and "colocated" in checked.stdout, checked.stdout
        family = psutil.Process(proc.pid).children(recursive=True)
        assert any("sglang" in " ".join(p.cmdline()) for p in family)

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, f"left behind: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
