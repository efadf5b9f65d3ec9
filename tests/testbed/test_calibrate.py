"""Calibration's arithmetic (no servers): the k each kind of pass needs is the 99th
percentile of real / modelled time, and the largest need sets the run's k."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

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


def test_each_next_round_runs_at_the_k_the_round_before_proposed(monkeypatch, tmp_path):
    """The loop around ``settle`` (the bathtub end-to-end test runs one round): a stand-in
    slice (no servers) proposes 209 at k = 50, then 86, then 95, which settles."""
    from testbed.bench import calibrate

    proposals = {50: 209, 209: 86, 86: 95}
    tried = []

    def slice_(target, tiny_kv, out, console, run_system):
        k = target.emulation.dilation
        tried.append(k)
        return {
            "system": "pdd",
            "needed": proposals[k] / 1.2,
            "by_pass": [],
            "tried": k,
            "proposal": proposals[k],
        }

    monkeypatch.setattr(calibrate, "calibration_slice", slice_)
    base = Scenario.load("hetero")
    emulation = base.emulation.model_copy(
        update={"dilation": 50, "calibration_rounds": 3, "calibration_tolerance": 0.15}
    )
    target = base.model_copy(update={"emulation": emulation})

    found = calibrate.calibrate(target, 0, tmp_path, Console(file=io.StringIO()), None)

    assert tried == [50, 209, 86]  # each round at the one before's proposal
    assert found["dilation"] == 95 and [r["tried"] for r in found["rounds"]] == tried
