"""Let P cache an exchange it is told to align on (PDD's decode-side cache alignment).

After a request ends on main decode, the router sends P the whole exchange (prompt
and output) as a prefill with SGLang's fake transfer, so P's prefix cache holds what
MD's does. SGLang marks every fake-transfer request ``skip_radix_cache_insert`` (its
warm-up requests must not pollute the cache). An AFTER hook on ``Req.__init__``
clears that mark for requests whose rid starts with ``ALIGN_PREFIX`` and nothing else.
"""

from __future__ import annotations

from protocol.rooms import ALIGN_PREFIX

TARGET = "sglang.srt.managers.schedule_batch.Req.__init__"


def _req_init_after(result, req, *args, **kwargs):
    if str(req.rid).startswith(ALIGN_PREFIX) and req.positional_embed_overrides is None:
        req.skip_radix_cache_insert = False
    return result


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _req_init_after, HookType.AFTER)
