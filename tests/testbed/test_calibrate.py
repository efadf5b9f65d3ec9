"""Calibration's arithmetic (no servers): per kind of pass, the share that ran late at
the slice's k and the k at which all but 2.5% of the passes fit; a slice fits its k
while no kind missed more than that share."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from testbed.bench.calibrate import needed, with_dilation
from testbed.scenario import Scenario


def _passes(server, mode, modelled_s, real_s, paced_s, n):
    row = {"server": server, "mode": mode, "modelled_s": modelled_s, "real_s": real_s}
    return [{**row, "miss": real_s > paced_s}] * n


def test_each_pass_kind_reports_its_late_share_and_the_k_all_but_a_few_passes_need():
    # at k = 50: 98 decode passes of 40 ms fit their 50 ms, two stalled ones did not
    rows = _passes("md", "decode", 0.001, 0.040, 0.050, 98)
    rows += _passes("md", "decode", 0.001, 0.500, 0.050, 2)
    rows += _passes("p", "prefill", 0.010, 0.200, 0.500, 10)
    table = needed(pd.DataFrame(rows), miss_share=0.025)
    assert table.loc[("md", "decode"), "passes"] == 100
    assert table.loc[("md", "decode"), "miss_share"] == pytest.approx(0.02)
    assert table.loc[("p", "prefill"), "miss_share"] == 0
    # the stalls are beyond the 97.5th percentile: they do not set the need
    assert table.loc[("md", "decode"), "needed_k"] == pytest.approx(40, rel=0.15)
    assert table.loc[("p", "prefill"), "needed_k"] == pytest.approx(20)


def test_the_chosen_dilation_replaces_the_scenarios():
    hetero = Scenario.load("hetero")
    assert hetero.emulation.calibrate
    assert with_dilation(hetero, 77).emulation.dilation == 77
    # the load's duration, in testbed seconds for the scenario's own k, stretches with k
    assert hetero.emulation.dilation == 100
    assert with_dilation(hetero, 200).workload.duration_s == 2 * hetero.workload.duration_s


def test_the_load_starts_at_its_first_request_and_warm_up_passes_come_before(tmp_path):
    from testbed.bench.calibrate import load_start

    assert load_start(tmp_path) == float("-inf")  # no records: every pass counts
    (tmp_path / "records.jsonl").write_text('{"arrival": 12.0}\n{"arrival": 10.5}\n')
    assert load_start(tmp_path) == 10.5


def _round(tried, proposal, missed):
    return {"tried": tried, "proposal": proposal, "miss_share": missed}


@pytest.mark.parametrize(
    ("rounds", "chosen", "next_k", "recorded"),
    [
        ([_round(100, 108, 0.02)], 100, None, 0),  # fits: the run uses it
        ([_round(100, 160, 0.0)], 100, None, 0),  # fits, though its need x margin is higher
        ([_round(100, 60, 0.0)], None, 60, None),  # fits, a clearly smaller k may: try it
        # halfway between a k that missed and one that fitted, at least
        ([_round(100, 60, 0.0), _round(60, 70, 0.04)], None, 80, None),
        ([_round(100, 60, 0.0), _round(60, 70, 0.04), _round(80, 70, 0.01)], 80, None, 2),
        ([_round(100, 199, 0.17), _round(199, 112, 0.0)], None, 150, None),  # hetero's
        ([_round(50, 209, 0.3)], None, 209, None),  # saturated cores: measure at the proposal
        ([_round(100, 105, 0.04)], None, 115, None),  # too many late: at least x 1.15
        ([_round(50, 209, 0.3), _round(209, 86, 0.0)], None, 130, None),
        ([_round(50, 209, 0.3), _round(209, 86, 0.0), _round(130, 95, 0.01)], 130, None, 2),
        # no round left: the smallest k whose own slice fitted
        ([_round(50, 209, 0.3), _round(209, 86, 0.0), _round(86, 150, 0.1)], 209, None, 1),
        # none fitted: the k whose slice had the fewest late passes, not an unmeasured one
        ([_round(100, 127, 0.03), _round(127, 176, 0.03), _round(176, 590, 0.035)], 100, None, 0),
        ([_round(50, 80, 0.3), _round(80, 130, 0.1), _round(130, 200, 0.05)], 130, None, 2),
    ],
)
def test_calibration_runs_rounds_until_a_slice_fits_its_k(rounds, chosen, next_k, recorded):
    from testbed.bench.calibrate import settle

    decision = settle(rounds, tolerance=0.15, max_rounds=3, miss_share=0.025)
    assert (decision.k, decision.next_k) == (chosen, next_k), decision.why
    # the slice whose measurements the run records as the calibration
    assert decision.round is (None if recorded is None else rounds[recorded])


def test_a_round_is_not_run_twice_at_the_same_k():
    from testbed.bench.calibrate import settle

    # 100 fitted and proposed 60; 60 missed and asks for 100 again: the run uses 100
    rounds = [_round(100, 60, 0.0), _round(60, 100, 0.2)]
    assert settle(rounds, tolerance=0.15, max_rounds=6, miss_share=0.025).k == 100
    # 100 missed, asked for 120; 120 missed, asked for 100: on to 138, not back
    rounds = [_round(100, 120, 0.1), _round(120, 100, 0.05)]
    assert settle(rounds, tolerance=0.15, max_rounds=6, miss_share=0.025).next_k == 138


def test_each_next_round_runs_at_the_k_the_round_before_proposed(monkeypatch, tmp_path):
    """The loop around ``settle`` (the bathtub end-to-end test runs one round): a stand-in
    slice (no servers) misses many passes at k = 50 and proposes 209, fits 209 but
    proposes 86: the next round runs halfway between 50 and 209, fits 130, which the
    run uses (its proposal is below what missed: no rounds left in any case)."""
    from testbed.bench import calibrate

    proposals = {50: 209, 209: 86, 130: 95}
    late = {50: 0.3, 209: 0.0, 130: 0.01}
    tried = []

    def slice_(target, tiny_kv, out, console, run_system):
        k = target.emulation.dilation
        tried.append(k)
        return {
            "system": "pdd",
            "needed": proposals[k] / 1.2,
            "miss_share": late[k],
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

    assert tried == [50, 209, 130]
    assert found["dilation"] == 130 and [r["tried"] for r in found["rounds"]] == tried
