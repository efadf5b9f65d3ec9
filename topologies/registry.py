"""The testbed networks up on this host, known from their state files
(``STATE_DIR/<name>.json``, written by ``Network.up``) and their namespaces' names
(``pddtb-<name>-<node>``), and torn down from those alone: after a crash, or a
``kill -9`` of the process that brought a network up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from topologies.netns import PREFIX, list_namespaces, ns_name, pids_in, run

STATE_DIR = Path(os.environ.get("PDD_STATE_DIR", "/run/pdd-testbed"))


def state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def names_up() -> list[str]:
    """Every network with a state file or a namespace on this host."""
    from_state = {p.stem for p in STATE_DIR.glob("*.json")} if STATE_DIR.exists() else set()
    from_ns = {ns[len(PREFIX) :].rsplit("-", 1)[0] for ns in list_namespaces()}
    return sorted(from_state | from_ns)


def owner(name: str) -> int | None:
    """The PID of the process that brought network ``name`` up (None: no state)."""
    try:
        return json.loads(state_path(name).read_text()).get("pid")
    except (OSError, ValueError):
        return None


def down_by_name(name: str) -> list[str]:
    """Tear down network ``name`` from its state file and namespace prefix; idempotent.
    Returns the namespaces removed."""
    state = state_path(name)
    namespaces = set(list_namespaces(ns_name(name, "")))
    if state.exists():
        with contextlib.suppress(ValueError, OSError):
            namespaces |= set(json.loads(state.read_text()).get("namespaces", []))
    _kill_processes_in(sorted(namespaces))
    for ns in sorted(namespaces):
        run(["ip", "netns", "del", ns], check=False)
    # Normally gone with its peer's namespace; a crash between the two steps of
    # creating it could leave it alone.
    run(["ip", "link", "del", f"{PREFIX}{name}"[:15]], check=False)
    state.unlink(missing_ok=True)
    return sorted(namespaces)


def _kill_processes_in(namespaces: Sequence[str], grace: float = 5.0) -> None:
    """SIGTERM every process in the namespaces (all started by the testbed), then SIGKILL."""
    pids = {pid for ns in namespaces for pid in pids_in(ns)}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if alive(p)}
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still "exists"; reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True
