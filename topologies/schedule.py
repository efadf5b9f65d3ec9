"""A WAN that changes during a run: rate dips, loss bursts and cuts at given times.

A scenario's ``network.wan_schedule`` lists :class:`WanEvent` s (seconds from the start
of the load). :class:`WanSchedule` applies them on a running :class:`Network` from a
thread and puts the link back to its spec when each ends (and when the run stops),
logging every change with its wall-clock time (``wan_schedule.jsonl`` in the run), so
the report can place a fault on the same clock as the requests.

Lifecycle: ``WanSchedule(net, events, log).start()`` at the load's start → events
applied and restored on time → ``stop()`` (restores the spec, joins the thread).
Delay and jitter are fixed for a run (its link daemon keeps them); rate, loss and
cuts change in place. Under emulation the scenario's events are dilated like the rest
(times x k, rates scaled as the WAN's).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WanEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    at_s: float = Field(..., ge=0, description="Seconds after the load starts.")
    for_s: float = Field(..., gt=0, description="How long it lasts; then the spec's link.")
    rate_mbit: float | None = Field(None, gt=0, description="The WAN's rate meanwhile.")
    loss_pct: float | None = Field(None, ge=0, le=100, description="Random loss meanwhile.")
    cut: bool = Field(False, description="Drop every packet both ways (a fibre cut).")

    @model_validator(mode="after")
    def _one_change(self) -> WanEvent:
        changes = [self.rate_mbit is not None, self.loss_pct is not None, self.cut]
        if sum(changes) != 1:
            raise ValueError("a WAN event changes exactly one of rate_mbit, loss_pct, cut")
        return self

    @property
    def what(self) -> str:
        if self.cut:
            return "cut"
        if self.rate_mbit is not None:
            return f"rate {self.rate_mbit:g} Mbit/s"
        return f"loss {self.loss_pct:g}%"


def check_schedule(events: list[WanEvent], wan_shaped: bool) -> list[WanEvent]:
    """Events in time order, none overlapping another; rate changes need a shaped WAN."""
    events = sorted(events, key=lambda e: e.at_s)
    for a, b in zip(events, events[1:], strict=False):
        if b.at_s < a.at_s + a.for_s:
            raise ValueError(f"WAN events overlap: {a.what} at {a.at_s:g} s and {b.what}")
    if not wan_shaped and any(e.rate_mbit is not None for e in events):
        raise ValueError("a WAN rate change needs a shaped WAN (network.wan.rate_mbit)")
    return events


class WanSchedule:
    def __init__(self, net, events: list[WanEvent], log: Path) -> None:
        self.net, self.events, self.log = net, list(events), Path(log)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wan-schedule", daemon=True)
        self.errors: list[str] = []

    def start(self) -> WanSchedule:
        if self.events:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        start = time.monotonic()
        for event in self.events:
            if self._stop.wait(max(0.0, start + event.at_s - time.monotonic())):
                return
            self._apply(event)
            ended = self._stop.wait(event.for_s)
            self._restore(event)
            if ended:
                return

    def _apply(self, event: WanEvent) -> None:
        try:
            if event.cut:
                self.net.cut_wan()
            elif event.rate_mbit is not None:
                self.net.set_wan_rate(event.rate_mbit)
            else:
                self.net.set_wan_loss(event.loss_pct)
        except Exception as exc:  # recorded; the bench checks errors after the load
            self.errors.append(f"{event.what}: {exc}")
        self._write(event, "start")

    def _restore(self, event: WanEvent) -> None:
        try:
            if event.cut:
                self.net.restore_wan()
            elif event.rate_mbit is not None:
                self.net.set_wan_rate(self.net.spec.wan.rate_mbit)
            else:
                self.net.set_wan_loss(self.net.spec.wan.loss_pct)
        except Exception as exc:
            self.errors.append(f"restoring after {event.what}: {exc}")
        self._write(event, "end")

    def _write(self, event: WanEvent, phase: str) -> None:
        row = {"time": time.time(), "phase": phase, **event.model_dump()}
        with open(self.log, "a") as f:
            f.write(json.dumps(row) + "\n")
