"""Choose the time dilation k at which every paced pass fits, before a paced run.

A paced pass is faithful only if the CPU computes it within k x its modelled time on
the chips it stands for; otherwise it runs late (a *miss*) and the system decodes or
prefills slower than the chips. The report calls a system faithful while at most 5%
of every server's passes of every kind miss (``reports.hetero.MAX_MISS_SHARE``).
Calibration runs a short slice of the scenario's own load on one system (pdd where the
scenario has it: all three roles, contending for their cores as in the run) at a k,
reads every server's pacing log (the load's passes, not the warm-up's: a server's first
passes of a shape are slow once) and finds, per server and kind of pass:

- the share that missed at that k: the slice *fits* k while no kind's share is above
  ``calibration_miss_share`` (half the report's bound: a slice is a small sample);
- the k at which all but that share would fit (the ``1 - calibration_miss_share``
  quantile of real / modelled time); the largest times ``calibration_margin``, rounded
  up, is the slice's proposal.

Why the slice's own misses decide, not its proposal: the tail of a pass kind is not
compute but the core's other tenants (a decoder beside another decoder, the router, the
link emulators), and on hetero it grew with k (main decode's 98th percentile at k =
100, 127, 176: 96, 120, 225 x its modelled time), so a proposal chased from round to
round ran away (100 -> 127 -> 176 -> 590) while every one of those slices missed 2-3.5%
of main decode's passes. A slice at too small a k saturates the cores and misses many;
its proposal is where to measure next. So calibration goes in rounds (:func:`settle`)::

    slice at k ──fits, and its proposal is not clearly lower──▶ the run uses k
        │ fits, proposal clearly lower (a smaller k may fit): slice at the proposal
        │ misses too many: slice at the proposal (at least k x (1 + tolerance))
        │ (either way at least halfway between the largest k that missed below the
        │ smallest that fitted, and that one; not worth a round within tolerance of it)
    no round left ──▶ the smallest k whose slice fitted, else the k whose slice missed
                      least (the report then says whether the run was faithful)

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


def needed(pacing: pd.DataFrame, miss_share: float) -> pd.DataFrame:
    """Per server and kind of pass: passes, the share that missed at the slice's k, and
    the k at which all but ``miss_share`` of them fit."""
    frame = pacing[pacing["modelled_s"] > 0]
    ratio = frame["real_s"] / frame["modelled_s"]
    keys = [frame["server"], frame["mode"]]
    return pd.DataFrame(
        {
            "passes": ratio.groupby(keys).size(),
            "miss_share": frame["miss"].astype(float).groupby(keys).mean(),
            "needed_k": ratio.groupby(keys).quantile(1 - miss_share),
        }
    )


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
    next_k: float | None = None  # where the next round's slice runs (while k is None)


def settle(rounds: list[dict], tolerance: float, max_rounds: int, miss_share: float) -> Decision:
    """What these rounds (each ``{"tried", "proposal", "miss_share"}``: the k a slice
    ran at, what it proposed, and its worst pass kind's share of misses) decide."""
    last, k = rounds[-1], rounds[-1]["tried"]
    fitted = sorted((r for r in rounds if r["miss_share"] <= miss_share), key=lambda r: r["tried"])
    fit_k = fitted[0]["tried"] if fitted else None
    if last in fitted:
        next_k, why = last["proposal"], f"k = {k:g} fitted; a smaller one may: another round"
    else:
        next_k = max(last["proposal"], math.ceil(k * (1 + tolerance)))
        why = f"k = {k:g}: {last['miss_share']:.1%} of a pass kind late, another round"
    # Below the smallest k that fitted, at least halfway up from the largest that did
    # not: a proposal measured where the cores had room does not see where they
    # saturate (hetero: k = 199 fitted and proposed 112; 100 and 112 missed 17-25%).
    missed = [
        r["tried"] for r in rounds if r not in fitted and (fit_k is None or r["tried"] < fit_k)
    ]
    if missed and fit_k is not None:
        next_k = max(next_k, math.ceil((max(missed) + fit_k) / 2))
    worth = fit_k is None or next_k < (1 - tolerance) * fit_k  # clearly below what fitted
    tried = any(r["tried"] == next_k for r in rounds)
    if len(rounds) < max_rounds and worth and not tried:
        return Decision(None, None, why, next_k)
    if fitted:
        best = fitted[0]
        why = f"k = {best['tried']:g} fitted (at most {best['miss_share']:.1%} of a pass kind late)"
        if len(rounds) > 1:
            why += f"; the smallest k that fitted in {len(rounds)} rounds"
        return Decision(best["tried"], best, why)
    best = min(rounds, key=lambda r: (r["miss_share"], r["tried"]))
    why = f"none of {len(rounds)} rounds fitted: the k whose slice had fewest late passes"
    return Decision(best["tried"], best, why)


def calibrate(target, tiny_kv: int, run_dir: Path, console, run_system) -> dict:
    """Run calibration slices until one fits (or rounds run out); returns what they
    found and the dilation to use."""
    spec = target.emulation
    rounds: list[dict] = []
    k: float = spec.dilation
    while True:
        out = Path(run_dir) / "calibration" / f"round-{len(rounds) + 1}"
        found = calibration_slice(with_dilation(target, k), tiny_kv, out, console, run_system)
        rounds.append(found)
        decision = settle(
            rounds, spec.calibration_tolerance, spec.calibration_rounds, spec.calibration_miss_share
        )
        console.print(f"calibration: {decision.why}")
        if decision.k is not None:
            break
        k = decision.next_k
    return {
        **{key: decision.round[key] for key in ("system", "needed", "miss_share", "by_pass")},
        "tried": spec.dilation,
        "margin": spec.calibration_margin,
        "max_miss_share": spec.calibration_miss_share,
        "dilation": decision.k,
        "decision": decision.why,
        "rounds": [
            {key: r[key] for key in ("tried", "needed", "miss_share", "proposal")} for r in rounds
        ],
    }


def calibration_slice(target, tiny_kv: int, out: Path, console, run_system) -> dict:
    """One slice of the load at the target's k: what its passes missed and need."""
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
    table = needed(pd.DataFrame(rows), spec.calibration_miss_share)
    need, missed = float(table["needed_k"].max()), float(table["miss_share"].max())
    k = proposal(need, spec.calibration_margin)
    console.print(
        f"calibration: at most {missed:.1%} of a pass kind late; passes need k = {need:.1f}; "
        f"proposed k = {k}"
    )
    return {
        "system": system,
        "tried": spec.dilation,
        "needed": need,
        "miss_share": missed,
        "proposal": k,
        "by_pass": [
            {"server": server, "pass": mode, **values}
            for (server, mode), values in table.to_dict("index").items()
        ],
    }


def with_dilation(target, k: float):
    """The target scenario with its emulation run at dilation ``k``. The load's
    duration (testbed seconds, sized for the scenario's own k) stretches with it: at
    k = 199 hetero's 400 s ended colocated's load after 43 of its 49 requests."""
    spec = target.emulation.model_copy(update={"dilation": float(k)})
    stretch = float(k) / target.emulation.dilation
    workload = target.workload.model_copy(
        update={"duration_s": target.workload.duration_s * stretch}
    )
    return target.model_copy(update={"emulation": spec, "workload": workload})
