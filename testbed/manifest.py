"""A deployment's manifest: what ran (scenario, system, servers and how each was
started, the network as applied, versions, host, commit), written beside its records
so a run can be reproduced and checked (``testbed reproduce``)."""

from __future__ import annotations

import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from testbed.dilation import record
from testbed.model import describe as describe_model


def manifest(deployment, model: Path) -> dict:
    """A deployment's manifest (``deployment``: a testbed.deployment.Deployment)."""
    return {
        "deployment": "inventory" if deployment.scenario.inventory else "managed",
        "scenario": deployment.scenario.model_dump(mode="json"),
        "system": deployment.system.name,
        "policy": deployment.system.policy,
        "model": str(model),
        "kv_bytes_per_token": describe_model(model)["kv_bytes_per_token"],
        "emulation": record(deployment.scenario, describe_model(model)["kv_bytes_per_token"]),
        "servers": [
            {
                "name": s.name,
                "role": s.role,
                "host": s.host,
                "site": s.site,
                "url": s.spec.url,
                "argv": s.spec.argv(),
                **(
                    {"inventory": s.server.describe(), "clock_offset_ms": off}
                    if (off := deployment.clock_offsets_ms.get(s.host)) is not None
                    else {}
                ),
            }
            for s in deployment.servers
        ],
        "router": deployment.router_url,
        "network": {
            "name": deployment.net.name,
            "backend": deployment.net.backend_name,
            "links": [vars(a) for a in deployment.net.applied],
        },
        "versions": versions(),
        "host": {
            "kernel": platform.release(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": deployment.pins.all_cpus,
        },
        "git_commit": git_commit(),
        "started": time.time(),
    }


def versions() -> dict[str, str]:
    out = {}
    for dist in ("pdd-testbed", "sglang", "torch", "transformers", "locust", "pandas"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def git_commit() -> str | None:
    def git(*args: str) -> subprocess.CompletedProcess:
        here = Path(__file__).parent
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=here, timeout=5)

    try:
        done, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain").stdout.strip()
        return done.stdout.strip() + ("-dirty" if dirty else "") if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None
