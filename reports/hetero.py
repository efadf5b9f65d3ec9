"""The report's heterogeneous-chip sections: pacing fidelity, the capacity planner's
BCR table and the modelled bathtub, from a run directory's files (the bench wrote the
planner's and the bathtub's tables there; a report never re-runs a model)."""

from __future__ import annotations

import json

import pandas as pd

from capacity.bathtub import HIT_PRICE
from reports.run_data import RunData


def pacing(run: RunData) -> pd.DataFrame:
    """Per system, server and kind of pass: how closely passes followed the profile."""
    rows = []
    for name, s in run.systems.items():
        if s.pacing.empty:
            continue
        for (server, mode), g in s.pacing.groupby(["server", "mode"]):
            rows.append(
                {
                    "system": name,
                    "server": server,
                    "pass": mode,
                    "passes": len(g),
                    "mean new tokens": g["new_tokens"].mean(),
                    "modelled ms (target)": 1e3 * g["modelled_s"].mean(),
                    "paced ms": 1e3 * g["paced_s"].mean(),
                    "real CPU ms": 1e3 * g["real_s"].mean(),
                    "misses": int(g["miss"].sum()),
                    "miss share": g["miss"].mean(),
                }
            )
    return pd.DataFrame(rows)


MAX_MISS_SHARE = 0.05  # more late passes of any kind: the system is not faithful


def faithful(run: RunData) -> dict[str, bool]:
    """Per paced system: whether at most 5% of every server's passes of every kind ran
    late (the CPU kept the chips' pace); a system that did not is not compared."""
    table = pacing(run)
    if table.empty:
        return {}
    worst = table.groupby("system")["miss share"].max()
    return {name: bool(share <= MAX_MISS_SHARE) for name, share in worst.items()}


def cpu_shares(run: RunData) -> pd.DataFrame:
    """Per system, each process's share of a CPU during the load (over its life in
    runs stored before the load's share was recorded, and for Locust), by host and
    kind."""
    rows = [
        {
            "system": name,
            "host": r["host"],
            "process": r["process"],
            "cpus": ",".join(map(str, r["cpus"])),
            "share": r.get("load_share", r["share"]),
        }
        for name, s in run.systems.items()
        for r in s.cpu
    ]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    keys = ["system", "host", "process", "cpus"]
    return frame.groupby(keys, as_index=False)["share"].sum().sort_values(["system", "cpus"])


def plan(run: RunData) -> pd.DataFrame:
    """The planner's table the bench wrote for this run's scenario (target time)."""
    frame = pd.DataFrame(_rows(run, "plan.json"))
    if frame.empty:
        return frame
    return frame[["design", "pools", "wan", "cost_per_hour", "bcr", "bcr_vs_baseline", "note"]]


def sensitivity(run: RunData) -> dict[str, pd.DataFrame]:
    """The planner's sensitivity tables the bench wrote (``testbed.planning.sensitivity``):
    ``one_at_a_time`` and ``reaching_paper``; empty frames for a run without them."""
    path = run.path / "sensitivity.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    return {key: pd.DataFrame(data.get(key, [])) for key in ("one_at_a_time", "reaching_paper")}


def bathtub(run: RunData) -> pd.DataFrame:
    """The modelled bathtub the bench wrote for this run (relative to no hit)."""
    return pd.DataFrame(_rows(run, "bathtub.json"))


def _rows(run: RunData, name: str) -> list[dict]:
    path = run.path / name
    return json.loads(path.read_text()) if path.exists() else []


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
            rows.append(
                {
                    "point": label,
                    "system": name,
                    "requests": len(ok),
                    "hit": float((cached / ok["prompt_tokens"]).mean()),
                    "throughput_rps": len(ok) / span,
                    "throughput_per_cost": len(ok) / span / cost,
                    "benefit_per_cost": revenue / span / cost,
                }
            )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.sort_values(["system", "hit"]).reset_index(drop=True)
    for col in ("throughput_per_cost", "benefit_per_cost"):
        frame[col] = frame[col] / frame.groupby("system")[col].transform("first")
    return frame
