"""When and how relay decode hands a request over to main decode: a pure function.

The relayed pipeline asks after every eager token; the answer is to wait, to send a
catch-up batch (relay decode keeps decoding while MD extends it), or to send the
final batch (MD takes the request over). PDD.md's rules:

- nothing is handed off before MD holds the prompt's KV (a pinned handoff aside: MD
  applies it once it does), nor while the previous catch-up batch is being extended,
  nor before the router's connection to MD's handoff listener is up (a pinned handoff
  then fires at the first token after it is: a lost SYN on the WAN delays it by a
  second);
- relay decode finishes a request that is about to end anyway;
- one-shot when few tokens are pending (at most ``catch_up_threshold``) or relay
  decode is busy (it should be freed at once), catch-up otherwise — also for fewer
  pending tokens when main decode is busy, since one big extend would stall every
  stream it serves; a catch-up batch carries at most ``catch_up_batch`` tokens;
- catch-up ends with a final batch once few are pending (``catch_up_done``) or when
  relay decode becomes busy.

A settle (relay decode finished before MD held the KV) hands MD the whole output at
once, off the client's path; :func:`settle_batches` splits it the same way, so that a
busy MD never stalls its streams for more than one catch-up batch's extend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocol.names import HandoffMode


class Action(enum.Enum):
    WAIT = "wait"
    BATCH = "batch"  # a catch-up batch; relay decode keeps streaming
    FINAL = "final"  # the last batch: main decode takes over


@dataclass(frozen=True)
class Knobs:
    catch_up_threshold: int = 64
    catch_up_done: int = 8
    rld_busy_requests: int = 4
    min_remaining_tokens: int = 2
    md_busy_requests: int = 8
    catch_up_batch: int = 64

    @classmethod
    def of(cls, pdd) -> Knobs:
        """From a scenario's ``pdd:`` block (a PddConfig)."""
        return cls(
            pdd.catch_up_threshold,
            pdd.catch_up_done,
            pdd.rld_busy_requests,
            pdd.min_remaining_tokens,
            pdd.md_busy_requests,
            pdd.catch_up_batch,
        )


@dataclass(frozen=True)
class HandoffState:
    """What the relayed pipeline knows after an eager token."""

    eager: int  # tokens the client got so far (the first came from prefill)
    handed: int  # eager tokens main decode already has (earlier batches)
    remaining: int  # output tokens left before the request's limit
    md_holds_kv: bool
    batch_in_flight: bool = False  # a catch-up batch MD has not extended yet
    rld_load: int = 0  # requests in flight on relay decode
    md_load: int = 0  # requests in flight on main decode
    mode: HandoffMode | None = None  # chosen at the first batch, kept after
    pinned_at: int | None = None  # x-pdd-handoff-at: hand off at this many eager tokens
    pinned_mode: HandoffMode | None = None  # x-pdd-handoff-mode
    channel_open: bool = True  # the router's handoff connection to MD is up

    @property
    def pending(self) -> int:
        """Eager tokens main decode lacks (t1 came with the KV from prefill)."""
        return self.eager - 1 - self.handed


@dataclass(frozen=True)
class Decision:
    action: Action
    mode: HandoffMode | None = None
    tokens: int = 0  # how many eager tokens the batch carries
    why: str = ""


def decide(s: HandoffState, k: Knobs) -> Decision:
    if not s.channel_open:  # nothing can be sent (a pinned handoff fires once it is)
        return Decision(Action.WAIT, s.mode, why="the handoff channel to MD is not open yet")
    pinned_now = s.pinned_at is not None and s.eager >= s.pinned_at
    if s.pinned_at is None and not s.md_holds_kv:
        return Decision(Action.WAIT, s.mode, why="main decode does not hold the KV yet")
    if s.batch_in_flight and not pinned_now:
        return Decision(Action.WAIT, s.mode, why="main decode is extending the last batch")
    if s.pinned_at is None and s.remaining < k.min_remaining_tokens:
        return Decision(Action.WAIT, s.mode, why="relay decode is about to finish")
    busy = s.rld_load > k.rld_busy_requests
    mode = s.mode or s.pinned_mode
    if mode is None:
        batched = catch_up(s.pending, s.md_load, k) and not busy
        mode = HandoffMode.CATCH_UP if batched else HandoffMode.ONE_SHOT
    if s.pinned_at is not None:
        final = pinned_now
    else:
        final = mode is HandoffMode.ONE_SHOT or s.pending <= k.catch_up_done or busy
    if final:
        return Decision(Action.FINAL, mode, s.pending, "hand over")
    if mode is HandoffMode.ONE_SHOT or s.pending == 0 or not s.md_holds_kv:
        # one-shot waits for its moment; catch-up batches need MD holding the KV
        # (their acknowledgements share the channel)
        return Decision(Action.WAIT, mode, why="not yet")
    return Decision(Action.BATCH, mode, min(s.pending, k.catch_up_batch), "catch up")


def catch_up(pending: int, md_load: int, k: Knobs) -> bool:
    """Whether MD takes ``pending`` tokens in bounded catch-up batches rather than in
    one extend: more than ``catch_up_threshold`` of them, or more than ``catch_up_done``
    while MD serves more than ``md_busy_requests`` (``md_load``, the request itself
    counted: one big extend would stall every stream it serves)."""
    md_busy = md_load > k.md_busy_requests and pending > k.catch_up_done
    return pending > k.catch_up_threshold or md_busy


def settle_batches(lacking: int, md_load: int, k: Knobs) -> list[int]:
    """The batch sizes in which a settle hands MD the ``lacking`` tokens, the last one
    final: bounded by ``catch_up_batch`` where a handoff would catch up (:func:`catch_up`),
    else one batch. Each batch is extended before the next is sent, so MD's decode
    steps run between them."""
    if lacking <= 0 or not catch_up(lacking, md_load, k):
        return [max(lacking, 0)]
    full, rest = divmod(lacking, k.catch_up_batch)
    return [k.catch_up_batch] * full + ([rest] if rest else [])


def pinned_mode(header: str | None) -> HandoffMode | None:
    """The mode an ``x-pdd-handoff-mode`` header pins (anything but catch-up: one-shot)."""
    if not header:
        return None
    return HandoffMode.CATCH_UP if header == HandoffMode.CATCH_UP else HandoffMode.ONE_SHOT
