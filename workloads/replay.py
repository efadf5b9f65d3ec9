"""Replaying a trace's sessions: prompts from blocks, the real output in the next turn.

A closed-loop session sends turn n+1 only after turn n finished, plus its think time;
its prompt is what turn n sent, the output turn n really received (in place of the
blocks that stood for it), and the tokens of the newly appended blocks. Open-loop
replay sends each request at its arrival time with its prompt built from blocks alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from protocol import clock
from protocol.records import TokenTimes
from protocol.stream import StreamError
from workloads.client import iter_new_tokens
from workloads.tokens import TokenSynth
from workloads.trace import Request, Trace


@dataclass
class ClientRecord(TokenTimes):
    """What the client saw of one request (wall-clock seconds)."""

    START = "sent"
    request_id: str
    session_id: str
    turn: int
    sent: float
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    expected_output_tokens: int = 0
    status: str = "ok"
    error: str | None = None


class SessionState:
    """Builds each turn's prompt of one session as it is replayed."""

    def __init__(self, synth: TokenSynth) -> None:
        self.synth = synth
        self.prev: Request | None = None
        self.prev_prompt: list[int] = []
        self.prev_output: list[int] = []

    def prompt_for(self, req: Request) -> list[int]:
        prev = self.prev
        exchange = prev.hash_ids + prev.output_hash_ids if prev else ()
        if not prev or not prev.output_hash_ids or req.hash_ids[: len(exchange)] != exchange:
            return self.synth.tokens(req.hash_ids, req.input_length)
        skip = len(exchange)
        appended = self.synth.tokens(req.hash_ids[skip:])
        return self.prev_prompt + self.prev_output + appended

    def done(self, req: Request, prompt: list[int], output: list[int]) -> None:
        self.prev, self.prev_prompt, self.prev_output = req, prompt, output


def consume_stream(lines, record: ClientRecord) -> list[int]:
    """Read SGLang's SSE lines (str), timing each new token; returns the output ids."""
    output: list[int] = []
    try:
        for new, _ in iter_new_tokens(lines):
            if new:
                now = clock.now()
                output.extend(new)
                record.token_times.extend([now] * len(new))
                record.first_token = record.first_token or now
    except StreamError as exc:
        record.status, record.error = "error", str(exc)
    record.output_tokens = len(output)
    record.finish = clock.now()
    if record.status == "ok" and record.output_tokens < record.expected_output_tokens:
        record.status, record.error = "error", "stream ended early"
    return output


def session_order(trace: Trace) -> list[list[Request]]:
    """Sessions ordered by their first request's arrival (or id)."""
    sessions = list(trace.sessions().values())
    sessions.sort(key=lambda turns: (turns[0].arrival_s or 0.0, turns[0].session_id))
    return sessions


def arrival_times(requests, shape: str, rate: float, seed: int) -> list[float]:
    """When each request leaves (seconds from the start): the trace's own times, or a
    Poisson process / a constant rate of ``rate`` requests per second (in trace order)."""
    if shape == "trace":
        return [r.arrival_s or 0.0 for r in requests]
    if rate <= 0:
        raise ValueError(f"--rate must be positive, got {rate}")
    if shape == "constant":
        return [i / rate for i in range(len(requests))]
    rng, t, out = random.Random(seed), 0.0, []
    for _ in requests:
        out.append(t)
        t += rng.expovariate(rate)
    return out
