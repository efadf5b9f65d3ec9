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


class _Launched(Exception):
    """Raised by the stand-in for SGLangServer: the spec `testbed serve` built."""

    def __init__(self, spec) -> None:
        self.spec = spec


def test_serve_passes_its_timeouts_to_the_server_it_launches(tmp_path, monkeypatch):
    """`testbed serve --handoff-park-timeout` (and the KV timeouts) reach the server's
    environment, where main decode's handoff listener and the KV backend read them. The
    launch itself is stood in for (the real one is the test above): SGLangServer raises
    with the spec it was given."""
    from typer.testing import CliRunner

    from protocol.env import Env
    from testbed import hosts_cli
    from testbed.cli import app

    def launched(spec, log):
        raise _Launched(spec)

    monkeypatch.setattr(hosts_cli, "SGLangServer", launched)
    monkeypatch.setattr(hosts_cli, "resolve_model", lambda model: tmp_path)
    args = ["serve", "--role", "main_decode", "--handoff-park-timeout", "900"]
    result = CliRunner().invoke(app, [*args, "--kv-idle-timeout", "77"])
    assert isinstance(result.exception, _Launched), result.output
    env = dict(result.exception.spec.extra_env)
    assert float(env[Env.HANDOFF_PARK_TIMEOUT_S]) == 900
    assert float(env[Env.KV_IDLE_TIMEOUT_S]) == 77
