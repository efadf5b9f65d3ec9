"""Trace storage, token synthesis, cache analysis and the agentic generator's targets."""

from __future__ import annotations

import pytest

from workloads.analysis import HIT_BINS, hit_bin, hit_ratios, stats
from workloads.generator import AgenticConfig, generate
from workloads.replay import SessionState
from workloads.tokens import TokenSynth
from workloads.trace import Request, Trace


def small_trace() -> Trace:
    # Block ids: a=1..4. r2 repeats r1's prefix; r3 after an LRU of 3 blocks evicted it.
    reqs = [
        Request("r1", "s", 0, (1, 2), 8, 1, arrival_s=0.0),
        Request("r2", "s", 1, (1, 2, 3), 12, 1, arrival_s=1.0),
        Request("r3", "t", 0, (4, 5), 8, 1, arrival_s=2.0),
        Request("r4", "s", 2, (1, 2, 3, 6), 16, 1, arrival_s=3.0),
    ]
    return Trace("small", 4, reqs)


def test_infinite_and_lru_hit_ratios_on_a_known_case():
    trace = small_trace()
    assert hit_ratios(trace).tolist() == [0.0, 8 / 12, 0.0, 12 / 16]
    # LRU of 3 blocks: after r3 the cache holds 3, 4, 5 → r4 misses its first block.
    assert hit_ratios(trace, capacity_blocks=3).tolist() == [0.0, 8 / 12, 0.0, 0.0]


def test_hit_bins_edges():
    assert [hit_bin(x) for x in (0.5, 0.9, 0.95, 0.97, 0.98, 0.99, 0.999, 1.0)] == [
        "0-90",
        "90-95",
        "95-97",
        "97-98",
        "98-99",
        "99-100",
        "99-100",
        "100",
    ]
    assert set(stats(small_trace()).bins) == set(HIT_BINS)


def test_jsonl_and_parquet_round_trip(tmp_path):
    trace = generate(AgenticConfig(sessions=3, seed=4))
    for name in ("t.jsonl", "t.parquet"):
        trace.save(tmp_path / name)
        back = Trace.load(tmp_path / name)
        assert back.requests == trace.requests and back.block_tokens == trace.block_tokens
        assert back.metadata["config"]["seed"] == 4


def test_same_block_same_tokens_and_prefixes_stay_shared():
    synth = TokenSynth(vocab_size=4096, block_tokens=16, seed=3)
    a = synth.tokens((7, 8, 9), 40)
    b = synth.tokens((7, 8, 11), 48)
    assert len(a) == 40 and a[:32] == b[:32] and a[32:40] != b[32:40]
    assert TokenSynth(4096, 16, seed=3).tokens((7,)) == synth.tokens((7,))
    assert all(10 <= t < 4096 for t in b)


def test_closed_loop_prompt_carries_the_real_output():
    trace = generate(AgenticConfig(sessions=1, seed=1, anomalous_share=0.0))
    first, second = trace.sessions()["s0"][:2]
    state = SessionState(TokenSynth(4096, trace.block_tokens))
    p1 = state.prompt_for(first)
    state.done(first, p1, [5, 6, 7])
    p2 = state.prompt_for(second)
    appended = len(second.hash_ids) - len(first.hash_ids) - len(first.output_hash_ids)
    assert p2[: len(p1) + 3] == p1 + [5, 6, 7]
    assert len(p2) == len(p1) + 3 + appended * trace.block_tokens


@pytest.mark.parametrize("seed", range(4))
def test_generator_default_lands_on_the_paper_shape(seed):
    s = stats(generate(AgenticConfig(seed=seed)))
    assert 0.87 <= s.hit_mean <= 0.93, s.hit_mean  # PDD: ≈ 90% mean
    assert 0.70 <= s.share_above_95 <= 0.80, s.share_above_95  # 70-80% above 95%
    assert 0.03 <= s.anomalous_share <= 0.04, s.anomalous_share  # 3-4% anomalous
    assert s.bins["0-90"] > 0.05  # a low-hit tail exists


def test_same_seed_same_trace_other_seed_other_trace(tmp_path):
    generate(AgenticConfig(seed=5)).to_jsonl(tmp_path / "a.jsonl")
    generate(AgenticConfig(seed=5)).to_jsonl(tmp_path / "b.jsonl")
    generate(AgenticConfig(seed=6)).to_jsonl(tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"hit_high": (0.5, 0.95, 0.99)}, "shares must sum to 1"),
        ({"sessions": 10**9}, "sessions must be a whole number within 1..100,000"),  # hung
        ({"sessions": 2.5}, "sessions must be a whole number"),
        ({"turns": (5, 2)}, "turns must be two whole numbers, the first no larger"),  # randrange
        ({"turns": 3}, "turns must be two"),
        ({"output_tokens": (0, 0)}, "output_tokens must be two numbers"),  # math domain error
        ({"first_turn_tokens": (10**12, 10**12)}, "within 1..10,000,000"),  # MemoryError
        ({"system_prompt_tokens": -1}, "system_prompt_tokens must be a number"),  # was taken
        ({"think_time_s": (1.0, float("nan"))}, "think_time_s"),
        ({"session_gap_s": float("inf")}, "session_gap_s"),
        ({"hit_low": (0.05, 0.0, 0.5)}, "hit_low's hits"),  # a hit of 0 appends forever
    ],
)
def test_invalid_generator_config_is_refused_naming_the_field(fields, words):
    with pytest.raises(ValueError) as err:
        AgenticConfig(**fields)
    assert words in str(err.value)


def test_fixed_hit_requests_share_exactly_that_prefix():
    trace = generate(AgenticConfig(fixed_hit=0.75, fixed_hit_input=1024, sessions=6, seed=3))
    assert trace.metadata["generator"] == "fixed_hit"
    assert all(r.input_length == 1024 and r.turn == 0 for r in trace.requests)
    hits = hit_ratios(trace)
    assert hits[0] == 0 and list(hits[1:]) == [0.75] * 5  # after the first, one shared prefix
    with pytest.raises(ValueError, match="fixed_hit"):
        AgenticConfig(fixed_hit=1.0)


def test_open_loop_arrivals_follow_the_trace_a_poisson_or_a_constant_rate():
    from types import SimpleNamespace

    from workloads.replay import arrival_times

    reqs = [SimpleNamespace(arrival_s=float(i * i)) for i in range(2000)]
    assert arrival_times(reqs[:3], "trace", 1.0, 0) == [0.0, 1.0, 4.0]
    assert arrival_times(reqs[:3], "constant", 4.0, 0) == [0.0, 0.25, 0.5]
    times = arrival_times(reqs, "poisson", 5.0, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    assert abs(mean - 0.2) < 0.02 and min(gaps) >= 0  # exponential gaps at 5 req/s
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    assert abs(var**0.5 - 0.2) < 0.03  # exponential: sd = mean
    assert times == arrival_times(reqs, "poisson", 5.0, seed=1)  # seeded
