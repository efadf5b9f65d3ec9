"""Calibration's arithmetic (no servers): the k each kind of pass needs is the 99th
percentile of real / modelled time, and the largest need sets the run's k."""

from __future__ import annotations

import pandas as pd
import pytest

from testbed.bench.calibrate import needed, with_dilation
from testbed.scenario import Scenario


def test_each_pass_kind_needs_the_k_that_99_percent_of_its_passes_fit():
    rows = [{"server": "md", "mode": "decode", "modelled_s": 0.001, "real_s": 0.040}] * 99
    rows += [{"server": "md", "mode": "decode", "modelled_s": 0.001, "real_s": 0.500}]  # outlier
    rows += [{"server": "p", "mode": "prefill", "modelled_s": 0.010, "real_s": 0.200}] * 10
    table = needed(pd.DataFrame(rows))
    assert table.loc[("md", "decode"), "passes"] == 100
    assert table.loc[("md", "decode"), "needed_k"] == pytest.approx(40, rel=0.15)
    assert table.loc[("p", "prefill"), "needed_k"] == pytest.approx(20)


def test_the_chosen_dilation_replaces_the_scenarios():
    hetero = Scenario.load("hetero")
    assert hetero.emulation.calibrate
    assert with_dilation(hetero, 77).emulation.dilation == 77


def test_the_load_starts_at_its_first_request_and_warm_up_passes_come_before(tmp_path):
    from testbed.bench.calibrate import load_start

    assert load_start(tmp_path) == float("-inf")  # no records: every pass counts
    (tmp_path / "records.jsonl").write_text('{"arrival": 12.0}\n{"arrival": 10.5}\n')
    assert load_start(tmp_path) == 10.5


def _round(tried, proposal):
    return {"tried": tried, "proposal": proposal}


@pytest.mark.parametrize(
    ("rounds", "chosen", "recorded"),
    [
        ([_round(100, 108)], 108, 0),  # within 15%: settled on the first slice
        ([_round(100, 90)], 90, 0),  # a little lower: settled too
        ([_round(50, 209)], None, None),  # saturated cores proposed far more: measure there
        ([_round(50, 209), _round(209, 86)], None, None),  # generous: try the lower k
        ([_round(50, 209), _round(209, 86), _round(86, 95)], 95, 2),  # settled on the third
        # no round left: the smallest k whose own slice fitted it (the slice that tried it)
        ([_round(50, 209), _round(209, 86), _round(86, 150)], 209, 1),
        # none fitted: the largest proposal (the slice that proposed it)
        ([_round(50, 80), _round(80, 130), _round(130, 200)], 200, 2),
    ],
)
def test_calibration_runs_rounds_until_the_proposal_settles(rounds, chosen, recorded):
    from testbed.bench.calibrate import settle

    decision = settle(rounds, tolerance=0.15, max_rounds=3)
    assert decision.k == chosen, decision.why
    # the slice whose measurements the run records as the calibration
    assert decision.round is (None if recorded is None else rounds[recorded])
