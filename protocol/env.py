"""Environment variables the testbed sets on the SGLang servers it launches.

The harness writes them (``testbed.deployment``), the plugin reads them
(``engine_patches``): both use these names, never a literal.
"""

from __future__ import annotations

from enum import StrEnum


class Env(StrEnum):
    PLUGIN = "PDD_TESTBED_PLUGIN"  # "1": the SGLang plugin patches this server process
    FRAME_KEY = "PDD_FRAME_KEY"  # hex: the deployment's key for KV and handoff frames
    TLS_CERT = "PDD_TLS_CERT"  # servers.tls: the deployment's certificate (PEM path)
    TLS_KEY = "PDD_TLS_KEY"  # and its key, for the listeners
    KV_TRANSFER_LOG = "PDD_KV_TRANSFER_LOG"  # one JSON line per transfer (and handoff)
    HANDOFF_PORT = "PDD_HANDOFF_PORT"  # main decode's handoff listener
    HANDOFF_PARK_TIMEOUT_S = "PDD_HANDOFF_PARK_TIMEOUT_S"  # a parked request gives up
    PACING = "PDD_PACING"  # a capacity.pacing.Pacing as JSON: pace every forward pass
    PD_POLL_INTERVAL_S = "PDD_PD_POLL_INTERVAL_S"  # idle PD scheduler's poll interval
    # KV transfer timeouts (seconds), one per engine_patches.kv_transfer Timeouts field
    KV_CONNECT_TIMEOUT_S = "PDD_KV_CONNECT_TIMEOUT_S"
    KV_BOOTSTRAP_TIMEOUT_S = "PDD_KV_BOOTSTRAP_TIMEOUT_S"
    KV_FIRST_DATA_TIMEOUT_S = "PDD_KV_FIRST_DATA_TIMEOUT_S"
    KV_IDLE_TIMEOUT_S = "PDD_KV_IDLE_TIMEOUT_S"
    KV_LATE_LEG_TIMEOUT_S = "PDD_KV_LATE_LEG_TIMEOUT_S"
    KV_POOL_REUSE_TIMEOUT_S = "PDD_KV_POOL_REUSE_TIMEOUT_S"  # a pooled connection's reuse
    DECODE_PREFIX_WAIT = "PDD_DECODE_PREFIX_WAIT"  # "1": decode waits for a prefix on its way
    KV_PACING = "PDD_KV_PACING"  # "1": prefill's KV connections pace their sends (servers.)
    # JSON {"rate_bytes_s", "peers"}: prefill's KV sends to those peers share that rate
    KV_LINE = "PDD_KV_LINE"  # (servers.kv_line_share; engine_patches.kv_transfer.line_share)
    # SGLang's own (read by SGLang, not the plugin): its HTTP server's keep-alive (whole s)
    HTTP_KEEP_ALIVE_S = "SGLANG_TIMEOUT_KEEP_ALIVE"


def kv_timeout(field: str) -> Env:
    """The variable for one KV transfer timeout (``connect``, ``idle``, ...)."""
    return Env[f"KV_{field.upper()}_TIMEOUT_S"]
