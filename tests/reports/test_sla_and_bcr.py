"""Goodput and BCR arithmetic on hand-made records and PDD's own cost table."""

from __future__ import annotations

import pytest

from protocol.records import RequestRecord
from reports.cost import CostTable, Hardware, bcr, relative_change
from reports.sla import SLA, attainment, sla_goodput, span_s


def rec(arrival, ttft, gaps, status="ok"):
    first = arrival + ttft
    times = [first]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestRecord(
        request_id=f"r{arrival}",
        system="x",
        endpoint="/generate",
        arrival=arrival,
        first_token=first,
        finish=times[-1],
        token_times=times,
        output_tokens=len(times),
        status=status,
    )


SLA_ = SLA(ttft_s=1.0, itl_s=0.1, itl_percentile=90)


def test_sla_checks_ttft_itl_and_status():
    assert SLA_.met(rec(0, 0.5, [0.05] * 10))
    assert not SLA_.met(rec(0, 1.5, [0.05] * 10))  # TTFT too slow
    assert not SLA_.met(rec(0, 0.5, [0.05] * 5 + [0.3] * 5))  # P90 gap too slow
    assert SLA_.met(rec(0, 0.5, [0.05] * 19 + [0.3]))  # one slow gap is within P90
    assert not SLA_.met(rec(0, 0.5, [0.05], status="error"))


def test_goodput_counts_met_requests_over_the_span():
    records = [rec(0, 0.5, [0.05] * 9), rec(1, 2.0, [0.05] * 9), rec(2, 0.2, [0.05] * 9)]
    assert span_s(records) == pytest.approx(1 + 2.0 + 0.45)  # r1 finishes last
    assert sla_goodput(records, SLA_) == pytest.approx(2 / 3.45)
    assert attainment(records, SLA_) == pytest.approx(2 / 3)
    assert sla_goodput([], SLA_) == 0.0


def test_pdd_cost_table_shape():
    # PDD: GPU-B priced 20-30% above GPU-A → PDD's hardware is 3.5-7.1% cheaper; both
    # ends follow with one line costing about a third of a GPU-A.
    same_site = Hardware(accelerators={"A": 88})
    for b_price, saving in ((1.2, 0.071), (1.3, 0.035)):
        table = CostTable(accelerators={"A": 1.0, "B": b_price}, wan_line=0.35)
        pdd = Hardware(accelerators={"A": 43, "B": 32}, wan_lines=1)
        change = relative_change(pdd.cost(table), same_site.cost(table))
        assert change == pytest.approx(-saving, abs=0.002)


def test_bcr_and_its_gain():
    table = CostTable(accelerators={"A": 2.0, "B": 2.5}, wan_line=1.0)
    base = bcr(10.0, Hardware(accelerators={"A": 4}).cost(table))
    pdd = bcr(12.0, Hardware(accelerators={"A": 2, "B": 1}, wan_lines=1).cost(table))
    assert base == pytest.approx(10 / 8) and pdd == pytest.approx(12 / 7.5)
    assert relative_change(pdd, base) == pytest.approx(0.28)


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="positive"):
        CostTable(accelerators={"A": 0.0})
    with pytest.raises(ValueError, match="no price"):
        Hardware(accelerators={"C": 1}).cost(CostTable(accelerators={"A": 1.0}))
