"""The report's heterogeneous-chip sections (issue 8): pacing fidelity, the capacity
planner's BCR table, and the modelled bathtub — all from a run directory's files."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.run_data import RunData

BATHTUB_HITS = np.round(np.arange(0.0, 0.995, 0.01), 2)
HIT_PRICE = 0.1  # cached input billed at this share of a miss (PDD.md: 10-25%)


def pacing(run: RunData) -> pd.DataFrame:
    """Per system, server and kind of pass: how closely passes followed the profile."""
    rows = []
    for name, s in run.systems.items():
        if s.pacing.empty:
            continue
        for (server, mode), g in s.pacing.groupby(["server", "mode"]):
            rows.append({
                "system": name, "server": server, "pass": mode, "passes": len(g),
                "mean new tokens": g["new_tokens"].mean(),
                "modelled ms (target)": 1e3 * g["modelled_s"].mean(),
                "paced ms": 1e3 * g["paced_s"].mean(),
                "real CPU ms": 1e3 * g["real_s"].mean(),
                "misses": int(g["miss"].sum()),
                "miss share": g["miss"].mean(),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _target_scenario(run: RunData):
    from testbed.scenario import Scenario

    data = dict(run.target_scenario or run.scenario)
    data.pop("systems", None)
    data["systems"] = ["colocated"]  # the planner does not use them
    data.pop("sweep", None)
    return Scenario.model_validate(data)


def _trace(run: RunData):
    from workloads.trace import Trace

    path = run.path / "trace.jsonl"
    return Trace.load(path) if path.exists() else None


def plan(run: RunData) -> pd.DataFrame:
    """The planner's table for this run's scenario (target time) and trace."""
    from testbed import plan as planner

    trace = _trace(run)
    if trace is None:
        return pd.DataFrame()
    scenario = _target_scenario(run)
    rows = planner.rows(planner.plan_all(planner.inputs(scenario, trace)), scenario.plan.target_rps)
    frame = pd.DataFrame(rows)
    frame["pools"] = frame.apply(
        lambda r: ", ".join(
            f"{role} {r[role]}" for role in ("prefill", "relay_decode", "decode", "main_decode")
            if r[role]
        ),
        axis=1,
    )  # fmt: skip
    return frame[["design", "pools", "wan", "cost_per_hour", "bcr", "bcr_vs_baseline", "note"]]


def bathtub(run: RunData, shape: tuple[int, int] | None = None) -> pd.DataFrame:
    """The modelled bathtub on this run's profiles for one request shape (input,
    output tokens at full size): the trace's own for a fixed-hit trace, else PDD.md's
    64K input and 256 output tokens."""
    from testbed import plan as planner
    from testbed.bathtub import bathtub as model

    trace = _trace(run)
    if trace is None:
        return pd.DataFrame()
    x = planner.inputs(_target_scenario(run), trace)
    if shape is None:
        shape = (65536, 256)
        if trace.metadata.get("generator") == "fixed_hit":
            first = max(x.requests, key=lambda r: r.n_in)
            shape = (first.n_in, int(np.mean([r.n_out for r in x.requests])))
    frame = pd.DataFrame(model(x, *shape, BATHTUB_HITS, HIT_PRICE))
    for col in ("throughput_per_cost", "benefit_per_cost"):
        frame[col] = frame[col] / frame[col].iloc[0]  # relative to no hit
    return frame


def measured_bathtub(points: dict[str, RunData]) -> pd.DataFrame:
    """Per sweep point and system: the measured hit ratio, throughput and benefit per
    unit cost (cached input billed at a tenth of a miss), relative to the point with
    the lowest hit."""
    from reports.cost import CostTable
    from reports.tables import system_cost

    rows = []
    for label, run in points.items():
        table = CostTable(**run.scenario["cost"]["table"])
        for name, s in run.systems.items():
            ok = s.records[s.records["status"] == "ok"]
            if ok.empty:
                continue
            span = ok["finish"].max() - ok["arrival"].min()
            cached = ok["cached_tokens_prefill"].fillna(0)
            revenue = (
                ok["prompt_tokens"] - cached + HIT_PRICE * cached + ok["output_tokens"]
            ).sum()
            cost = system_cost(s, table)
            rows.append({
                "point": label, "system": name, "requests": len(ok),
                "hit": float((cached / ok["prompt_tokens"]).mean()),
                "throughput_rps": len(ok) / span, "throughput_per_cost": len(ok) / span / cost,
                "benefit_per_cost": revenue / span / cost,
            })  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.sort_values(["system", "hit"]).reset_index(drop=True)
    for col in ("throughput_per_cost", "benefit_per_cost"):
        frame[col] = frame[col] / frame.groupby("system")[col].transform("first")
    return frame
