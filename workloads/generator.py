"""Agentic multi-turn sessions with PDD's prefix-hit shape.

A session is a tool-call loop: turn n's prompt is turn n-1's prompt, its output, and
newly appended tokens (tool results, a user message). The appended length is drawn so
that the turn's prefix-hit ratio (what a cache holding the whole exchange saves) follows
a skewed mixture: most turns hit 95-99.5%, some 85-95%, a tail of low hits. First
turns share a system prompt. Anomalous requests — very long input, very short output
(PDD's 3-4%) — are single-turn sessions. Sessions start open-loop (Poisson); later
turns follow closed-loop after a think time.

``length_scale``/``time_scale`` shrink paper-sized contexts and pauses to fit a small
machine; both are recorded in the trace's metadata. Same config (seed) → same trace.
``fixed_hit`` replaces sessions by single requests at one prefix-hit ratio (the bathtub).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from workloads.trace import MAX_PROMPT_TOKENS, Request, Trace

MAX_SESSIONS = 100_000
MAX_TURNS = 10_000
MAX_SECONDS = 86_400.0  # a think time or a gap between sessions


@dataclass(frozen=True)
class AgenticConfig:
    sessions: int = 40
    turns: tuple[int, int] = (8, 20)  # per session, inclusive
    block_tokens: int = 16
    system_prompt_tokens: int = 1024  # shared by every session (tool definitions)
    first_turn_tokens: tuple[int, int] = (128, 512)
    output_tokens: tuple[int, int] = (16, 128)  # log-uniform
    max_context_tokens: int = 12_000  # a session ends before its prompt exceeds this
    hit_high: tuple[float, float, float] = (0.85, 0.955, 0.995)  # share, low, high
    hit_mid: tuple[float, float, float] = (0.10, 0.85, 0.95)
    hit_low: tuple[float, float, float] = (0.05, 0.30, 0.70)
    anomalous_share: float = 0.035
    anomalous_input_tokens: tuple[int, int] = (6000, 10000)
    anomalous_output_tokens: tuple[int, int] = (2, 8)
    think_time_s: tuple[float, float] = (0.5, 3.0)
    session_gap_s: float = 3.0  # mean gap between session starts (Poisson)
    length_scale: float = 1.0
    time_scale: float = 1.0
    seed: int = 0
    # The bathtub's workload: instead of sessions, single requests of fixed_hit_input
    # tokens whose first fixed_hit share is one prefix shared by all (cached after the
    # first request), the rest new; outputs as above.
    fixed_hit: float | None = None
    fixed_hit_input: int = 4096

    def __post_init__(self) -> None:
        """Every field within its range, named where it is not (a negative system prompt
        was taken, reversed turns failed in ``randrange``, a billion sessions hung)."""
        _within("sessions", self.sessions, 1, MAX_SESSIONS, whole=True)
        _within("turns", self.turns, 1, MAX_TURNS, pair=True, whole=True)
        _within("system_prompt_tokens", self.system_prompt_tokens, 0, MAX_PROMPT_TOKENS)
        for name in ("first_turn_tokens", "output_tokens", "anomalous_input_tokens",
                     "anomalous_output_tokens"):  # fmt: skip
            _within(name, getattr(self, name), 1, MAX_PROMPT_TOKENS, pair=True)
        for name in ("max_context_tokens", "fixed_hit_input"):
            _within(name, getattr(self, name), 1, MAX_PROMPT_TOKENS)
        _within("think_time_s", self.think_time_s, 0, MAX_SECONDS, pair=True)
        _within("session_gap_s", self.session_gap_s, 0, MAX_SECONDS)
        for name in ("hit_high", "hit_mid", "hit_low"):
            share, *low_high = getattr(self, name)
            _within(f"{name}'s share", share, 0, 1)
            # a hit of 0 would append without end
            _within(f"{name}'s hits", low_high, 1e-3, 1, pair=True)
        shares = self.hit_high[0] + self.hit_mid[0] + self.hit_low[0]
        if not math.isclose(shares, 1.0, abs_tol=1e-6):
            raise ValueError(f"hit mixture shares must sum to 1, got {shares}")
        if not 0 <= self.anomalous_share < 0.5:
            raise ValueError("anomalous_share must be in [0, 0.5)")
        if self.block_tokens < 1 or self.length_scale <= 0 or self.time_scale <= 0:
            raise ValueError("block_tokens, length_scale and time_scale must be positive")
        if self.fixed_hit is not None and not 0 <= self.fixed_hit < 1:
            raise ValueError(f"fixed_hit must be in [0, 1), got {self.fixed_hit}")


def _within(name: str, value, low: float, high: float, pair=False, whole=False) -> None:
    """``value`` is a number within low..high (a ``whole`` one: an integer); a ``pair``
    (a range to draw from) is two such, the first no larger."""
    try:
        lo, hi = value if pair else (value, value)
        ok = low <= lo <= hi <= high and not isinstance(value, str)
        ok = ok and not (whole and not all(type(x) is int for x in (lo, hi)))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        what = "two numbers, the first no larger," if pair else "a number"
        what = what.replace("number", "whole number") if whole else what
        raise ValueError(f"{name} must be {what} within {low:,}..{high:,}; got {value!r}")


class _Blocks:
    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> tuple[int, ...]:
        out = tuple(range(self.next, self.next + n))
        self.next += n
        return out


def generate(config: AgenticConfig = AgenticConfig(), name: str = "agentic") -> Trace:
    rng = random.Random(config.seed)
    bt = config.block_tokens
    blocks = _Blocks()

    def n_blocks(tokens: float) -> int:
        return max(1, round(tokens * config.length_scale / bt))

    def scaled_time(lo_hi: tuple[float, float]) -> float:
        return rng.uniform(*lo_hi) * config.time_scale

    if config.fixed_hit is not None:
        return _fixed_hit(config, rng, blocks, n_blocks, name)
    system = blocks.take(n_blocks(config.system_prompt_tokens))
    max_blocks = n_blocks(config.max_context_tokens)
    requests: list[Request] = []
    start = 0.0
    for s in range(config.sessions):
        start += rng.expovariate(1.0 / config.session_gap_s) * config.time_scale
        prompt = system + blocks.take(n_blocks(rng.uniform(*config.first_turn_tokens)))
        for turn in range(rng.randint(*config.turns)):
            out_blocks = n_blocks(math.exp(rng.uniform(*map(math.log, config.output_tokens))))
            output = blocks.take(out_blocks)
            requests.append(
                Request(
                    request_id=f"s{s}t{turn}",
                    session_id=f"s{s}",
                    turn=turn,
                    hash_ids=prompt,
                    input_length=len(prompt) * bt,
                    output_length=out_blocks * bt,
                    arrival_s=start if turn == 0 else None,
                    think_time_s=None if turn == 0 else scaled_time(config.think_time_s),
                    output_hash_ids=output,
                )
            )
            exchange = prompt + output
            appended = max(1, round(len(exchange) * (1 - (h := _draw_hit(rng, config))) / h))
            if len(exchange) + appended > max_blocks:
                break
            prompt = exchange + blocks.take(appended)
    # Anomalous requests: their own sessions, spread over the run.
    n_anomalous = round(len(requests) * config.anomalous_share / (1 - config.anomalous_share))
    for a in range(n_anomalous):
        prompt = system + blocks.take(n_blocks(rng.uniform(*config.anomalous_input_tokens)))
        out = max(1, round(rng.uniform(*config.anomalous_output_tokens)))
        requests.append(
            Request(
                request_id=f"a{a}t0",
                session_id=f"a{a}",
                turn=0,
                hash_ids=prompt,
                input_length=len(prompt) * bt,
                output_length=out,
                arrival_s=rng.uniform(0, start),
                anomalous=True,
            )
        )
    metadata = {
        "source": "generator",
        "generator": "agentic",
        "config": asdict(config),
        "length_scale": config.length_scale,
        "time_scale": config.time_scale,
    }
    return Trace(name, bt, requests, metadata)


def _fixed_hit(config: AgenticConfig, rng: random.Random, blocks, n_blocks, name) -> Trace:
    bt, total = config.block_tokens, n_blocks(config.fixed_hit_input)
    shared = blocks.take(round(total * config.fixed_hit))
    requests, start = [], 0.0
    for s in range(config.sessions):
        start += rng.expovariate(1.0 / config.session_gap_s) * config.time_scale
        prompt = shared + blocks.take(max(1, total - len(shared)))
        out = n_blocks(math.exp(rng.uniform(*map(math.log, config.output_tokens))))
        requests.append(
            Request(
                request_id=f"s{s}t0",
                session_id=f"s{s}",
                turn=0,
                hash_ids=prompt,
                input_length=len(prompt) * bt,
                output_length=out * bt,
                arrival_s=start,
                output_hash_ids=blocks.take(out),
            )
        )
    metadata = {
        "source": "generator",
        "generator": "fixed_hit",
        "config": asdict(config),
        "length_scale": config.length_scale,
        "time_scale": config.time_scale,
    }
    return Trace(name, bt, requests, metadata)


def _draw_hit(rng: random.Random, config: AgenticConfig) -> float:
    x = rng.random()
    for share, lo, hi in (config.hit_high, config.hit_mid, config.hit_low):
        if x < share:
            return rng.uniform(lo, hi)
        x -= share
    return rng.uniform(config.hit_high[1], config.hit_high[2])
