"""The fault matrix's bookkeeping (testbed.bench.faults), without servers: what counts
as a lost or duplicated token, a slow error, a hang and a recovery."""

from __future__ import annotations

from testbed.bench.faults import FAULTS, Fault, FaultWindow, Outcome, summarize, token_damage

REF = [[5, 6, 7, 8, 9]]


def test_token_damage_counts_lost_and_duplicated_tokens():
    assert token_damage([5, 6, 7, 8, 9], REF[0]) == (0, 0)
    assert token_damage([5, 6, 8, 9], REF[0]) == (1, 0)  # one token lost at a switch
    assert token_damage([5, 6, 7, 7, 8, 9], REF[0]) == (0, 1)  # one sent twice
    assert token_damage([5, 6], REF[0]) == (3, 0)  # a stream that stopped short
    assert token_damage([5, 1, 7, 8, 9], REF[0]) == (1, 1)  # a foreign token


def _o(started, ended, tokens=None, error="", hang=False):
    tokens = REF[0] if tokens is None else tokens
    return Outcome("pdd", "f", 0, started, ended, tokens, 200, error, hang)


def test_a_fault_that_meets_every_target():
    window = FaultWindow(started=100.0, ended=105.0)
    outcomes = [
        _o(95, 98),
        _o(99, 102, error="stream error: upstream_error"),  # clear, 2 s after the fault
        _o(106, 108),  # the first request after the fault's end: recovered in 3 s
    ]
    row = summarize(Fault("f", "a fault", lambda d, w: None), window, outcomes, REF)
    assert row["failed"] == 1 and row["slowest_error_s"] == 2.0 and row["recover_s"] == 3.0
    assert row["token_exact"] == row["completed"] == 2 and row["meets_targets"]


def test_hangs_damaged_streams_slow_errors_or_no_recovery_miss_the_targets():
    window = FaultWindow(started=100.0, ended=105.0)
    fault = Fault("f", "a fault", lambda d, w: None)
    base = [_o(106, 108)]
    assert not summarize(fault, window, base + [_o(99, 160, hang=True)], REF)["meets_targets"]
    assert not summarize(fault, window, base + [_o(99, 101, [5, 6, 6])], REF)["meets_targets"]
    assert not summarize(fault, window, base + [_o(99, 112, error="late")], REF)["meets_targets"]
    # a request after the fault that comes back wrong is no recovery
    row = summarize(fault, window, [_o(106, 108, [5, 6])], REF)
    assert row["recover_s"] is None and not row["meets_targets"]


def test_the_matrix_has_every_fault_the_issue_lists():
    names = {f.name for f in FAULTS}
    assert names == {
        "wan_cut",
        "loss_burst",
        "rate_dip",
        "kill_prefill",
        "kill_relay_decode",
        "kill_decode",
        "router_connections",
    }
