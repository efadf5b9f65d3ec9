"""Pace SGLang's forward passes to the modelled time of the chip a server stands for.

The tiny model computes the real tokens; this hook makes each pass *take* as long as
the target model's pass would on the target chips, times a dilation factor k (a CPU
is slower than the chip it stands for, so the testbed runs k times slower than the
real thing, and the network is slowed by the same k; see docs/heterogeneous.md).

Lifecycle: a server started with ``PDD_PACING`` (a :class:`capacity.pacing.Pacing` as JSON) in its
environment registers an AROUND hook on ``Scheduler.run_batch`` → each pass is
timed → the hook sleeps until k x its modelled time has passed → one line per pass
goes to the pacing log (mode, shape, modelled, real and paced seconds, and ``miss``
when the real pass alone took longer than its paced time — reported, never hidden).
Without ``PDD_PACING`` nothing is registered and passes run at the CPU's speed.
"""

from __future__ import annotations

import os
import time

from capacity.pacing import Pacing
from capacity.roofline import Batch
from protocol import clock
from protocol.env import Env
from protocol.records import JsonlWriter, PassRecord

TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"


def batch_shape(batch) -> tuple[str, Batch] | None:
    """(mode, shape) of an SGLang ScheduleBatch; None for passes with no forward."""
    mode = batch.forward_mode
    if mode.is_decode():
        context = tuple(max(r.seqlen - 1, 0) for r in batch.reqs)
        return "decode", Batch((1,) * len(context), context)
    if mode.is_extend() or mode.is_mixed():
        shape = Batch(tuple(batch.extend_lens), tuple(batch.prefix_lens))
        if mode.is_mixed():
            return "mixed", shape
        return ("prefill" if not any(shape.context) else "extend"), shape
    return None  # idle or PD decode's prebuilt placeholder: nothing computed


class Pacer:
    def __init__(self, pacing: Pacing):
        self.pacing = pacing
        self.log = JsonlWriter(pacing.log_path or None)

    def around(self, original, scheduler, batch, *args, **kwargs):
        start = time.monotonic()
        result = original(scheduler, batch, *args, **kwargs)
        real = time.monotonic() - start
        shaped = batch_shape(batch)
        if shaped is None:
            return result
        mode, shape = shaped
        target = self.pacing.paced_seconds(shape)
        if real < target:
            time.sleep(target - real)
        self.log.write(
            PassRecord(
                time=clock.now(),
                mode=mode,
                seqs=len(shape.new_tokens),
                new_tokens=sum(shape.new_tokens),
                context=sum(shape.context),
                modelled_s=target / self.pacing.dilation,
                paced_s=target,
                real_s=real,
                miss=real > target,
            )
        )
        return result


def register() -> None:
    text = os.environ.get(Env.PACING)
    if not text:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, Pacer(Pacing.from_json(text)).around, HookType.AROUND)
