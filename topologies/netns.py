"""Thin wrappers over ip/tc/nft/iptables inside named network namespaces.

Every namespace the testbed creates is named ``pddtb-<network>-<node>``, so a
``down`` after a crash finds them without any state file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

PREFIX = "pddtb-"


class NetworkError(RuntimeError):
    """A network operation failed; the message says which command and why."""


def ns_name(network: str, node: str) -> str:
    return f"{PREFIX}{network}-{node}"


def run(
    argv: Sequence[str],
    ns: str | None = None,
    check: bool = True,
    input: str | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess:
    """Run a command (inside ``ns`` when given); raise NetworkError with its stderr."""
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    try:
        done = subprocess.run(full, capture_output=True, text=True, input=input, timeout=timeout)
    except FileNotFoundError as exc:
        raise NetworkError(f"{argv[0]} is not installed (run make setup)") from exc
    except subprocess.TimeoutExpired as exc:
        raise NetworkError(f"timed out after {timeout:.0f} s: {' '.join(full)}") from exc
    if check and done.returncode != 0:
        where = f" in {ns}" if ns else ""
        raise NetworkError(
            f"`{' '.join(argv)}`{where} failed: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def pids_in(ns: str) -> list[int]:
    done = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in done.stdout.split()]
