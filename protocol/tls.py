"""Optional TLS for the KV and handoff connections (``servers.tls`` in a scenario).

The harness makes one self-signed certificate per deployment and hands its path (and
its key's, to the listeners) to every server and the router in ``Env.TLS_CERT`` and
``Env.TLS_KEY``. Listeners (prefill's KV port, main decode's handoff port) wrap each
accepted connection as servers; the connecting side (decode's receiver, the router's
handoff channel) verifies the listener against that certificate as its only trust
anchor. Names are not checked: the certificate stands for the deployment, not for an
address. Clients are authenticated by the frame tags (``protocol.frames``), not here.
"""

from __future__ import annotations

import os
import ssl

from protocol.env import Env


def enabled() -> bool:
    return bool(os.environ.get(Env.TLS_CERT))


def _tls13(protocol: int) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def server_context() -> ssl.SSLContext | None:
    """For a listener; None when the deployment runs without TLS."""
    if not enabled():
        return None
    ctx = _tls13(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ[Env.TLS_CERT], os.environ.get(Env.TLS_KEY) or None)
    ctx.num_tickets = 0  # no session tickets: an idle pooled connection stays quiet
    return ctx


def client_context() -> ssl.SSLContext | None:
    """For a connecting side: trusts the deployment's certificate and nothing else."""
    if not enabled():
        return None
    ctx = _tls13(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # the certificate stands for the deployment, not a name
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(os.environ[Env.TLS_CERT])
    return ctx
