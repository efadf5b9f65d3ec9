"""Run one command and write the CPU seconds it used (with every process it started
and waited for) to a JSON file — how the bench counts Locust's own CPU, apart from
anything else the harness starts meanwhile.

Lifecycle: start the command → forward SIGTERM/SIGINT to it → wait → write
``{"cpu_s": ..., "returncode": ...}`` → exit with its status (or its signal).

Usage: python -m workloads.cpu_meter OUT.json -- ARGV...
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m workloads.cpu_meter OUT.json -- ARGV...", file=sys.stderr)
        return 2
    out, command = Path(argv[0]), argv[2:]
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.write_text(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "returncode": code}))
    if code < 0:  # killed by a signal: end the same way, so the caller sees that
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
