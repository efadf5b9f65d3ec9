"""The capacity planner and the bathtub model: hand-checked small cases and shapes."""

from __future__ import annotations

import numpy as np
import pytest

from capacity import plan
from capacity.bathtub import bathtub
from capacity.roofline import Chip, TargetModel
from testbed import planning
from testbed.scenario import Scenario
from workloads.generator import AgenticConfig, generate

# A dense 10B model with negligible attention on a round chip: a prefill pass of 1,000
# tokens is compute-bound at 2 x 10e9 x 1000 / 1e15 = 20 ms (weights: 10 GB / 1 TB/s
# = 10 ms), so one instance of one chip prefills 50,000 tokens/s.
MODEL = TargetModel(10, 10, layers=1, hidden_size=1, kv_bytes_per_token=1000)
CHIP = Chip(peak_tflops=1000, memory_bandwidth_tbps=1, mfu=1, mbu=1)


def inputs(**spec) -> plan.Inputs:
    a = plan.Device("A", CHIP, memory_gb=100, price=1.0)
    b = plan.Device("B", CHIP, memory_gb=100, price=2.0)
    return plan.Inputs(
        requests=(plan.Req(n_in=1000, cached=0, n_out=10),) * 10,
        model=MODEL,
        devices={"A": a, "B": b},
        ttft_s=10.0,
        itl_s=0.1,
        attainment=0.9,
        spec=plan.PlanSpec(
            **{"target_rps": 100, "chunk_tokens": 1000, "chips_per_instance": [1], **spec}
        ),
    )


def test_prefill_instances_follow_the_roofline_by_hand():
    x = inputs()
    assert plan.prefill_rate(x.devices["A"], MODEL, 1, 1000, 500) == pytest.approx(50_000, rel=1e-3)
    # 100 req/s x 1,000 uncached tokens = 100,000 tokens/s; at most 80% of 50,000 per
    # instance: ceil(100,000 / 40,000) = 3 instances.
    n, met = plan.size_prefill(x, x.devices["A"], 1, np.zeros(10))
    assert (n, met) == (3, 1.0)


def test_the_cheapest_wan_lines_that_carry_the_load_are_chosen():
    # Uncached KV: 100 req/s x 1,000 tokens x 1,000 B x 8 = 0.8 Gbit/s. Two 0.5 Gbit/s
    # lines (load 80%) at 1 each beat one 10 Gbit/s line at 5.
    x = inputs(wan_lines={0.5: 1.0, 10.0: 5.0})
    best = plan.plan_cross_site(x)
    assert best.feasible and (best.lines, best.line_gbps) == (2, 0.5)
    decode = next(p for p in best.pools if p.role == "decode")
    assert best.cost == pytest.approx(3 * 1.0 + decode.instances * 2.0 + 2 * 1.0)


def test_a_bound_no_instance_can_meet_is_reported_infeasible():
    x = inputs()
    tight = plan.Inputs(**{**x.__dict__, "ttft_s": 0.001})  # below one prefill pass
    p = plan.plan_same_site(tight)
    assert not p.feasible and p.bcr(100) == 0.0 and "SLA" in p.note
    rows = plan.rows([p], 100)
    assert rows[0]["bcr_vs_baseline"] is None


def test_weights_that_do_not_fit_rule_an_instance_size_out():
    big = TargetModel(1000, 32, layers=61, hidden_size=7168, kv_bytes_per_token=50_000)
    a = plan.Device("A", CHIP, memory_gb=80, price=1.0)
    assert not plan.holds_weights(a, big, 8)  # 1 TB of weights in 640 GB
    assert plan.holds_weights(a, big, 16)
    assert plan.decode_batch(a, big, 8, 4000, 0.1, 0.9) == (0, float("inf"))


def test_hetero_scenario_plans_pdd_cheaper_than_the_homogeneous_baseline():
    sc = Scenario.load("hetero")
    trace = generate(AgenticConfig(**sc.workload.generator))
    rows = {r["design"]: r for r in plan.rows(plan.plan_all(planning.inputs(sc, trace)), 300)}
    assert rows["same_site_pd"]["bcr_vs_baseline"] == 0
    assert rows["pdd"]["feasible"] and rows["pdd"]["bcr_vs_baseline"] > 0
    assert "GPU-B" in rows["pdd"]["main_decode"] and "GPU-A" in rows["pdd"]["prefill"]


def test_bathtub_model_has_tail_chunk_dips_and_a_valley():
    sc = Scenario.load("hetero")
    x = planning.inputs(sc, generate(AgenticConfig(**sc.workload.generator)))
    hits = np.round(np.arange(0, 1.0, 0.01), 2)
    curve = bathtub(x, 65536, 256, hits)
    thr = np.array([c["throughput_per_cost"] for c in curve])
    benefit = np.array([c["benefit_per_cost"] for c in curve])
    # Overall, throughput climbs with hits, but not monotonically: some step up in hit
    # lowers it (a small tail chunk costs a whole pass).
    assert thr[-1] > 3 * thr[0]
    dips = [c["hit"] for c, d in zip(curve[1:], np.diff(thr), strict=True) if d < 0]
    assert dips and all(c["tail_tokens"] > 0 for c in curve if c["hit"] in dips)
    # Benefit: high at both ends, lower in the middle.
    middle = benefit[(hits > 0.3) & (hits < 0.8)].min()
    assert middle < benefit[0] and middle < benefit[-1]


def test_plan_command_prints_the_table_and_refuses_bad_input(tmp_path):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "testbed.cli", "plan", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={"COLUMNS": "160", "PATH": ""},
        )

    done = run("hetero", "--rps", "100", "--sensitivity")
    assert done.returncode == 0, done.stderr[-2000:]
    for word in ("same_site_pd", "cross_site_pd", "pdd", "baseline", "GPU-B", "Gbit/s"):
        assert word in done.stdout, word
    for word in ("sensitivity: one at a time", "memory bandwidth", "reaching paper"):
        assert word in done.stdout, word
    bad = tmp_path / "one_site.yaml"
    bad.write_text("cost: {site_accelerators: {A: GPU-A}}\n")
    done = run(str(bad))
    assert done.returncode != 0 and "sites A and B" in done.stdout + done.stderr


def test_moving_the_mean_hit_keeps_each_requests_order_and_reaches_the_target():
    reqs = tuple(plan.Req(1000, cached, 10) for cached in (0, 200, 500, 900))  # mean 40%
    for target in (0.1, 0.4, 0.8, 0.95):
        moved = planning.with_mean_hit(reqs, target)
        hits = [r.cached / r.n_in for r in moved]
        assert np.mean(hits) == pytest.approx(target, abs=0.002)
        assert hits == sorted(hits) and all(0 <= h <= 1 for h in hits)
        assert [(r.n_in, r.n_out) for r in moved] == [(r.n_in, r.n_out) for r in reqs]


def test_the_sensitivity_table_says_which_assumptions_reach_the_papers_gain(tmp_path):
    """hetero's planner: a cheaper GPU-B or a higher mean hit raise pdd's BCR gain; the
    scenario's own row is the plan table's; and the lowest hit reaching +37.5% at each
    price is the first of the list that does. The bench writes it; the report reads it."""
    sc = Scenario.load("hetero")
    trace_path = sc.workload.materialize(tmp_path)
    from workloads.trace import Trace

    trace = Trace.load(trace_path)
    table = planning.sensitivity(sc, trace)
    rows = table["one_at_a_time"]
    plan_gain = {r["design"]: r["bcr_vs_baseline"] for r in planning.plan_rows(sc, trace)}
    own = [r for r in rows if r["scenario's"]]
    marked = {r["assumption"] for r in own}
    assert marked >= {"none: the scenario's", "GPU-B price", "GPU-B memory bandwidth"}
    for r in own:
        if r["assumption"] != "mean prefix hit":  # the trace's own hit is 88%, not listed
            assert r["pdd_bcr_vs_same_site"] == pytest.approx(plan_gain["pdd"])
    by_price = [r["pdd_bcr_vs_same_site"] for r in rows if r["assumption"] == "GPU-B price"]
    assert by_price == sorted(by_price, reverse=True) and by_price[0] > by_price[-1]
    by_hit = [r["pdd_bcr_vs_same_site"] for r in rows if r["assumption"] == "mean prefix hit"]
    assert by_hit == sorted(by_hit) and by_hit[-1] > by_hit[0]
    assert all(r["reaches_paper"] == (r["pdd_bcr_vs_same_site"] >= 0.375) for r in rows)
    reaching = table["reaching_paper"]
    assert [r["GPU-B price"] for r in reaching] == list(planning.B_PRICES)
    assert any(r["lowest mean hit reaching +37.5%"] is not None for r in reaching)
    x = planning.inputs(sc, trace)
    for r in reaching:
        hit = r["lowest mean hit reaching +37.5%"]
        if hit is None:
            continue
        assert r["pdd_bcr_vs_same_site"] >= 0.375
        lower = [h for h in planning.REACHING_HITS if h < hit]
        if lower:  # the hit just below does not reach it
            priced = planning._priced(x, r["GPU-B price"])
            gain = planning._gains(planning._hit(priced, max(lower)), sc.plan.target_rps)["pdd"]
            assert gain < 0.375
    # the bench's file, as the report reads it
    planning.write_tables(sc, trace_path, tmp_path)
    from types import SimpleNamespace

    from reports import hetero

    frames = hetero.sensitivity(SimpleNamespace(path=tmp_path))
    assert len(frames["one_at_a_time"]) == len(rows)
    assert list(frames["reaching_paper"]["GPU-B price"]) == list(planning.B_PRICES)
