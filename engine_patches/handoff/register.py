"""Hooks that give a decode scheduler the handoff (three narrow AROUND hooks).

1. ``DecodeTransferQueue.pop_transferred``: PDD requests whose KV arrived are parked
   instead of joining the waiting queue.
2. ``Scheduler.process_decode_queue``: each loop iteration, handoff commands are
   carried out (on the scheduler thread).
3. ``Scheduler.abort_request``: an abort for a parked request ends it.
4. ``Scheduler.is_fully_idle``: a scheduler holding parked requests is not idle (its
   idle-time pool checks would otherwise call their KV a leak).
Each is a no-op unless ``PDD_HANDOFF_PORT`` is set (the testbed sets it on decode
servers of a pdd deployment).
"""

from __future__ import annotations

from engine_patches.handoff.md import service_for

POP_TRANSFERRED = "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred"
PROCESS_QUEUE = "sglang.srt.managers.scheduler.Scheduler.process_decode_queue"
ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"
IDLE = "sglang.srt.managers.scheduler.Scheduler.is_fully_idle"
TARGETS = (POP_TRANSFERRED, PROCESS_QUEUE, ABORT, IDLE)


def _pop_transferred_around(original, queue, *args, **kwargs):
    reqs = original(queue, *args, **kwargs)
    service = service_for(queue.scheduler)
    return service.park(reqs) if service is not None and reqs else reqs


def _process_queue_around(original, scheduler, *args, **kwargs):
    result = original(scheduler, *args, **kwargs)
    service = service_for(scheduler)
    if service is not None:
        service.tick()
    return result


def _abort_around(original, scheduler, recv_req, *args, **kwargs):
    result = original(scheduler, recv_req, *args, **kwargs)
    service = service_for(scheduler)
    if service is not None:
        service.abort(getattr(recv_req, "rid", None), bool(getattr(recv_req, "abort_all", False)))
    return result


def _is_fully_idle_around(original, scheduler, *args, **kwargs):
    idle = original(scheduler, *args, **kwargs)
    if not idle or kwargs.get("for_health_check"):
        return idle
    service = service_for(scheduler)
    return service is None or not service.parked


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in zip(
        TARGETS,
        (_pop_transferred_around, _process_queue_around, _abort_around, _is_fully_idle_around),
        strict=True,
    ):
        HookRegistry.register(target, hook, HookType.AROUND)
