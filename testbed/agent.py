"""The host agent that ``testbed serve --agent-port`` runs beside its server: what the
harness's preflight (``testbed doctor``) asks a host it did not launch itself.

``GET /host`` answers what the server was started with (role, URL, ports, whether
it logs transfers, the frame key's fingerprint), the model directory's content hash,
the installed versions (SGLang, the project and its plugin, torch), and the host's
wall clock (``time_ns``), read as late as possible so the doctor can place it between
its own send and receive times. ``GET /transfers?offset=N&limit=M`` answers the
server's transfer log from byte N (header ``x-log-size``: its size now), which an
inventory deployment's harness mirrors into its run directory.

Lifecycle: ``HostAgent(info, model_dir, host, port, transfer_log).start()`` (the model
hash is computed once, before the first answer) → a daemon thread serves until the
process ends → ``stop()``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from importlib import metadata
from pathlib import Path

from aiohttp import web

MODEL_FILES = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.py")
VERSIONED = ("pdd-testbed", "sglang", "torch", "transformers")
MAX_READ = 8 << 20  # bytes of the transfer log per answer


def key_fingerprint(key_hex: str) -> str:
    """Which frame key a host uses, without revealing it (empty: frames untagged)."""
    return hashlib.sha256(bytes.fromhex(key_hex)).hexdigest()[:16] if key_hex else ""


def model_hash(model_dir: Path) -> str:
    """sha256 over the model directory's weights, config and tokenizer files (names
    and contents, in a fixed order): two hosts serve the same model iff it matches."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in MODEL_FILES for p in Path(model_dir).glob(pattern)})
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    out = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


class HostAgent:
    def __init__(
        self, info: dict, model_dir: Path, host: str, port: int, transfer_log: Path | None = None
    ) -> None:
        self.info = {**info, "model_hash": model_hash(model_dir), "versions": versions()}
        self.info["transfer_log"] = transfer_log is not None
        self.host, self.port, self.transfer_log = host, port, transfer_log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def _host(self, request: web.Request) -> web.Response:
        return web.json_response({**self.info, "time_ns": time.time_ns()})

    async def _transfers(self, request: web.Request) -> web.Response:
        if self.transfer_log is None:
            raise web.HTTPNotFound(text="this server was started without --transfer-log")
        try:
            offset = int(request.query.get("offset", 0))
            limit = min(int(request.query.get("limit", 1 << 20)), MAX_READ)
        except ValueError:
            raise web.HTTPBadRequest(text="offset and limit are integers") from None
        if offset < 0 or limit < 0:
            raise web.HTTPBadRequest(text="offset and limit are >= 0")
        try:
            with open(self.transfer_log, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(offset)
                body = f.read(limit) if offset < size else b""
        except FileNotFoundError:  # nothing logged yet
            size, body = 0, b""
        return web.Response(body=body, headers={"x-log-size": str(size)})

    def start(self) -> HostAgent:
        threading.Thread(target=self._run, name="pdd-host-agent", daemon=True).start()
        self._ready.wait(30)
        if self._error is not None:
            raise OSError(f"host agent on {self.host}:{self.port}: {self._error}")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/host", self._host)
        app.router.add_get("/transfers", self._transfers)
        runner = web.AppRunner(app, access_log=None)
        try:
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            self._loop.run_until_complete(site.start())
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
