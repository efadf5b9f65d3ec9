"""``python -m testbed.router CONFIG.json``: run the router until SIGTERM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aiohttp import web

from testbed.router.app import Router
from testbed.router.config import RouterConfig


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m testbed.router CONFIG.json", file=sys.stderr)
        return 2
    config = RouterConfig.model_validate(json.loads(Path(argv[0]).read_text()))
    router = Router(config)
    print(
        f"router ({config.system}, policy {config.policy}) on {config.host}:{config.port}",
        flush=True,
    )
    web.run_app(
        router.app(),
        host=config.host,
        port=config.port,
        print=None,
        handle_signals=True,
        access_log=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
