"""Processes started inside a host's namespace: a handle, a log, an exit status.

Lifecycle: ``HostProcess.start()`` spawns ``ip netns exec <ns> argv`` (or ``argv`` on
this host when ``ns`` is None) in a new process group, output to its log →
``poll()``/``wait()`` → ``stop()`` sends SIGTERM to the group, then SIGKILL after a
grace period. ``Network.down`` also kills every process left in
the network's namespaces, so nothing outlives the network even after a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path


class HostProcess:
    def __init__(
        self,
        host: str,
        ns: str | None,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host, self.ns, self.argv = host, ns, list(argv)
        self.log_path = log_path
        self.env = env
        self._proc: subprocess.Popen | None = None

    def start(self) -> HostProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, *self.argv] if self.ns else self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self._proc, "not started"
        return self._proc.pid

    def poll(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        assert self._proc, "not started"
        return self._proc.wait(timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> int | None:
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            _killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)
        _killpg(self._proc.pid, signal.SIGKILL)  # stragglers in the group
        return self._proc.returncode


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
