"""Choose the time dilation k at which every paced pass fits, before a paced run.

A paced pass is faithful only if the CPU computes it within k x its modelled time on
the chips it stands for; otherwise it runs late (a *miss*) and the system decodes or
prefills slower than the chips. Calibration runs a short slice of the scenario's own
load on one system (pdd where the scenario has it: all three roles, contending for
their cores as in the run) at the configured k, reads every server's pacing log, and
takes, per server and kind of pass, the 99th percentile of real / modelled time over
the load's passes (not the warm-up's: a server's first passes of a shape are slow
once, and a handful of them would set k): the k that pass kind needs. The largest of
these times a margin, rounded up, is the slice's proposal.

A slice measures passes at the k it ran at, and the cores' contention depends on that
k: at too small a k they saturate, every pass queues behind the others and the slice
proposes far more than it would measure at its own proposal. So calibration goes in
rounds (:func:`settle`)::

    slice at k ──proposal within tolerance of k──▶ the run uses the proposal
        │ otherwise (and rounds left)
        └──▶ slice at the proposal
    no round left ──▶ the smallest k whose own slice fitted it (proposal <= k),
                      else the largest proposal

Recorded in ``emulation.json`` (``calibration``, with every round); round n's slice in
``calibration/round-n/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from protocol.records import read_jsonl
from testbed import dilation

QUANTILE = 0.99


def needed(pacing: pd.DataFrame) -> pd.DataFrame:
    """Per server and kind of pass: passes, and the k that 99% of them need."""
    frame = pacing[pacing["modelled_s"] > 0]
    ratio = frame["real_s"] / frame["modelled_s"]
    grouped = ratio.groupby([frame["server"], frame["mode"]])
    return pd.DataFrame({"passes": grouped.size(), "needed_k": grouped.quantile(QUANTILE)})


def load_start(system_dir: Path) -> float:
    """When the calibration's load began: its first request's arrival (the warm-up
    requests' records are kept apart); minus infinity if there is no record."""
    path = system_dir / "records.jsonl"
    arrivals = [r["arrival"] for r in read_jsonl(path) if "arrival" in r] if path.exists() else []
    return min(arrivals, default=float("-inf"))


def proposal(needed_k: float, margin: float) -> int:
    return max(1, math.ceil(needed_k * margin))


@dataclass(frozen=True)
class Decision:
    k: float | None  # the dilation to run at; None while another round should run
    round: dict | None  # the slice whose passes justify k (its measurements are recorded)
    why: str


def settle(rounds: list[dict], tolerance: float, max_rounds: int) -> Decision:
    """What these rounds (each ``{"tried", "proposal"}``) decide."""
    last = rounds[-1]
    if abs(last["proposal"] - last["tried"]) <= tolerance * last["tried"]:
        why = f"settled: k = {last['tried']:g} proposed {last['proposal']}"
        return Decision(last["proposal"], last, why)
    if len(rounds) < max_rounds:
        why = f"k = {last['tried']:g} proposed {last['proposal']}: another round"
        return Decision(None, None, why)
    fitted = [r for r in rounds if r["proposal"] <= r["tried"]]
    if fitted:
        best = min(fitted, key=lambda r: r["tried"])
        why = f"unsettled after {len(rounds)} rounds: the smallest k that fitted"
        return Decision(best["tried"], best, why)
    best = max(rounds, key=lambda r: r["proposal"])
    why = f"unsettled after {len(rounds)} rounds and none fitted: the largest proposal"
    return Decision(best["proposal"], best, why)


def calibrate(target, tiny_kv: int, run_dir: Path, console, run_system) -> dict:
    """Run calibration slices until the proposed k settles; returns what they found and
    the dilation to use."""
    spec = target.emulation
    rounds: list[dict] = []
    k: float = spec.dilation
    while True:
        out = Path(run_dir) / "calibration" / f"round-{len(rounds) + 1}"
        found = calibration_slice(with_dilation(target, k), tiny_kv, out, console, run_system)
        rounds.append(found)
        decision = settle(rounds, spec.calibration_tolerance, spec.calibration_rounds)
        console.print(f"calibration: {decision.why}")
        if decision.k is not None:
            break
        k = found["proposal"]
    return {
        **{key: decision.round[key] for key in ("system", "needed", "by_pass")},
        "tried": spec.dilation,
        "margin": spec.calibration_margin,
        "dilation": decision.k,
        "decision": decision.why,
        "rounds": [{key: r[key] for key in ("tried", "needed", "proposal")} for r in rounds],
    }


def calibration_slice(target, tiny_kv: int, out: Path, console, run_system) -> dict:
    """One slice of the load at the target's k: what its passes need."""
    spec = target.emulation
    system = "pdd" if "pdd" in target.systems else target.systems[0]
    scenario = dilation.for_testbed(target, tiny_kv)
    workload = scenario.workload.model_copy(update={"max_requests": spec.calibration_requests})
    scenario = scenario.model_copy(update={"workload": workload})
    trace = scenario.workload.materialize(out)
    console.print(
        f"calibration: {spec.calibration_requests} requests on {system} at k = {spec.dilation:g}"
    )
    run_system(scenario, system, trace, out, console)
    start = load_start(out / system)
    rows = [
        {**data, "server": p.stem.removeprefix("pacing-")}
        for p in sorted((out / system).glob("pacing-*.jsonl"))
        for data in read_jsonl(p)
        if data.get("time", start) >= start
    ]
    if not rows:
        raise RuntimeError(f"calibration: no paced passes logged in {out / system}")
    table = needed(pd.DataFrame(rows))
    need = float(table["needed_k"].max())
    k = proposal(need, spec.calibration_margin)
    console.print(f"calibration: passes need k = {need:.1f}; proposed k = {k}")
    return {
        "system": system,
        "tried": spec.dilation,
        "needed": need,
        "proposal": k,
        "by_pass": [
            {"server": server, "pass": mode, **values}
            for (server, mode), values in table.to_dict("index").items()
        ],
    }


def with_dilation(target, k: float):
    """The target scenario with its emulation run at dilation ``k``."""
    spec = target.emulation.model_copy(update={"dilation": float(k)})
    return target.model_copy(update={"emulation": spec})
