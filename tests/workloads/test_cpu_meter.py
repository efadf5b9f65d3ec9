"""The CPU meter the bench runs each Locust process under: it counts its command's CPU
(children included), passes its exit status on, and forwards SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

METER = [sys.executable, "-m", "workloads.cpu_meter"]
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_it_counts_the_commands_cpu_and_passes_its_status_on(tmp_path):
    out = tmp_path / "cpu.json"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}]); sys.exit(3)"
    rc = subprocess.run([*METER, str(out), "--", sys.executable, "-c", child]).returncode
    got = json.loads(out.read_text())
    assert rc == 3 and got["returncode"] == 3
    assert got["cpu_s"] >= 0.3  # the grandchild's busy loop is counted too


def test_sigterm_reaches_the_command_and_the_meter_still_writes(tmp_path):
    out = tmp_path / "cpu.json"
    meter = subprocess.Popen([*METER, str(out), "--", "sleep", "60"])
    time.sleep(0.5)
    meter.send_signal(signal.SIGTERM)
    assert meter.wait(10) == -signal.SIGTERM
    assert json.loads(out.read_text())["returncode"] == -signal.SIGTERM
