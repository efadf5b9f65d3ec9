"""``tcp``: a KV-cache transfer backend for SGLang PD disaggregation over plain TCP.

Moves the actual KV pages from a prefill server's pool into a decode server's pool
(works on CPU, and through an emulated WAN). Decode opens TCP connections to the prefill
server's bootstrap port and pools them (``servers.kv_pool_reuse_s``); each carries one
transfer at a time:

    decode                                   prefill (scheduler process)
    send_metadata ── TransferRequest ──────▶ listener: request parked by room
                                              sender.poll: Bootstrapping → WaitingForInput
                                              send(pages) … (as chunks become ready)
    write pages   ◀────────── KvChunk* ────── (checksummed, only pages decode lacks)
    (idle clock)  ◀────────── Waiting* ────── while prefill computes the next chunk:
                                              decode's idle timeout is for the wire
    write aux     ◀────────── Aux ─────────── last chunk: first token, metadata
    verify counts ◀────────── Done ─────────
                  ────────── Ack ─────────▶  sender.poll: Success
    poll: Success
    pool the conn ◀────────── Window ─────── its congestion state now; the connection
                                              waits for decode's next request

Any timeout, reset or abort ends the transfer as ``KVPoll.Failed`` on both sides with
the reason in ``failure_exception()``. The wire format is in :mod:`protocol.frames`
and :mod:`protocol.kv`.
"""
