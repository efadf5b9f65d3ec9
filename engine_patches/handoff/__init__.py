"""Token-ID handoff with extend-decode on the main-decode server (PDD).

The router opens one connection per request to MD's handoff port (a listener in
MD's scheduler process, like the KV transfer's) and speaks PDKV frames:

    router                                   MD scheduler
    WATCH(room)   ─────────────────────────▶  KV for room held? (request parked)
                  ◀──────────── READY(room)   prompt length, decode-side prefix hit
    HANDOFF(room, final, t2..tk) ──────────▶  one EXTEND forward over t1..t(k-1)
                  ◀────────── EXTENDED(room)  tokens, the forward's own next token
    (final: the request joins MD's decode batch and streams from t(k+1) on)
    RELEASE(room) ─────────────────────────▶  relay decode finished it: drop it

A HANDOFF frame is the 20-byte header, one flag byte and 4 bytes per token id.
"""
