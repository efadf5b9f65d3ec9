"""The bootstrap interval of a percentile ratio (reports/spread.py), on synthetic
requests whose true ratio is known."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.spread import goodput_ratio_interval, per_request, ratio_interval, said


def requests(n: int, scale: float, seed: int, gaps: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.exponential(scale, gaps) for _ in range(n)]


def test_the_interval_holds_the_true_ratio_and_leaves_out_what_it_is_not():
    fast, slow = requests(60, 0.02, 1), requests(60, 0.06, 2)  # 3x at every percentile
    low, high = ratio_interval(slow, fast, 50)
    assert low < 3 < high and low > 2
    same = ratio_interval(requests(60, 0.02, 3), fast, 50)
    assert same[0] < 1 < same[1] and same[1] < 2


def test_more_requests_narrow_the_interval_and_the_same_run_gives_the_same_one():
    few = ratio_interval(requests(15, 0.06, 4), requests(15, 0.02, 5), 90)
    many = ratio_interval(requests(400, 0.06, 4), requests(400, 0.02, 5), 90)
    assert many[1] - many[0] < (few[1] - few[0]) / 2
    again = ratio_interval(requests(15, 0.06, 4), requests(15, 0.02, 5), 90)
    assert again == few


def test_one_slow_request_moves_the_p99_interval_more_than_many_gaps_would_say():
    """A request's gaps go together: one request of long gaps is one draw, so the
    interval is wide, where resampling gaps on their own would call it settled."""
    base = requests(40, 0.02, 6)
    stalled = [*requests(39, 0.02, 7), np.full(20, 0.2)]  # one request stalled throughout
    low, high = ratio_interval(stalled, base, 99)
    assert low < 1.2 and high > 2.4  # a run without that request would show no stall

    def gap_by_gap(reqs):
        return [np.array([g]) for r in reqs for g in r]

    low, high = ratio_interval(gap_by_gap(stalled), gap_by_gap(base), 99)
    assert low > 2  # gaps drawn on their own: the stall looks settled


def test_records_give_ttft_and_gaps_per_ok_request_and_nothing_gives_no_interval():
    frame = pd.DataFrame(
        {
            "status": ["ok", "ok", "error"],
            "arrival": [0.0, 1.0, 2.0],
            "first_token": [0.5, 1.25, None],
            "token_times": [[0.5, 0.6, 0.8], [1.25], []],
        }
    )
    assert [list(x) for x in per_request(frame, "ttft")] == [[0.5], [0.25]]
    gaps = per_request(frame, "itl")
    assert len(gaps) == 1 and np.allclose(gaps[0], [0.1, 0.2])
    assert ratio_interval([], gaps, 50) is None and said(None) == ""
    assert said((1.234, 2.5)) == " [x1.23-x2.50]"


def test_the_goodput_ratios_interval_holds_the_true_ratio_and_narrows_with_requests():
    """Each request met the SLA or not; the spans are kept. 40 of 50 against 25 of 50
    over the same span is x1.6: the interval holds it, and one run of 50 requests a side
    cannot tell 1.25x from 1.6x by much (two default runs: x1.37, then x1.12)."""
    met = np.array([1.0] * 40 + [0.0] * 10), 50.0
    half = np.array([1.0] * 25 + [0.0] * 25), 50.0
    low, high = goodput_ratio_interval(met, half)
    assert low < 1.6 < high and high - low > 0.3
    many = goodput_ratio_interval((np.tile(met[0], 20), 50.0), (np.tile(half[0], 20), 50.0))
    assert low < many[0] < 1.6 < many[1] < high
    slower = goodput_ratio_interval(met, (half[0], 100.0))  # the other took twice as long
    assert slower[0] > low * 1.9
    assert goodput_ratio_interval(met, (np.array([]), 50.0)) is None
    assert goodput_ratio_interval(met, half) == (low, high)  # seeded


def test_a_handoff_gap_p90_over_the_itl_p50_is_wide_on_three_handoffs_narrow_on_many():
    """The gap target compares two percentiles of different lists: one gap per relayed
    request at P90, every request's inter-token gaps at P50."""
    itl = requests(50, 0.03, 8)  # P50 of an exponential: 0.03 x ln 2 = 21 ms
    rng = np.random.default_rng(9)
    three = [np.array([g]) for g in rng.uniform(0.03, 0.06, 3)]
    many = [np.array([g]) for g in rng.uniform(0.03, 0.06, 300)]
    true = 0.057 / (0.03 * np.log(2))  # P90 of U(30, 60 ms) over the ITL P50: ~x2.7
    wide, narrow = ratio_interval(three, itl, 90, q_b=50), ratio_interval(many, itl, 90, q_b=50)
    assert narrow[0] < true < narrow[1] and narrow[1] - narrow[0] < wide[1] - wide[0]
    assert ratio_interval(many, itl, 90) != narrow  # q_b, not q, on the second list
