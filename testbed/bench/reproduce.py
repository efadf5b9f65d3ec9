"""``testbed reproduce RUN_DIR``: run a stored bench again and say, figure by figure,
whether the new run reproduces it — what a reproducibility reviewer runs.

Steps: read the run's scenario (the target one under emulation, with the dilation the
run used instead of a new calibration) and its systems; check the software against the
run's manifest (SGLang, torch, transformers, Locust, pandas, the project; a difference
stops unless allowed); regenerate the trace from the same seeds and check it is the
stored one, byte for byte; run every system; compare the two summaries.

A figure is reproduced when the new value lies within ``tolerance`` (relative) of the
stored one; latency, goodput and BCR are compared, error counts must not grow.

A repeated run (``bench --seeds N``, a sweep over the workload seed alone) is reproduced
seed by seed, every point checked before any runs. Its verdict uses the 95% intervals
instead of the tolerance: a figure is reproduced when the two runs' means differ by no
more than the interval of their difference (the half-widths combined in quadrature);
errors, summed over the seeds, must not grow. A sweep over anything else is refused:
reproduce one of its points.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from protocol.records import DamagedFile, read_json, write_atomic
from reports.compare import summary_of
from reports.render import SEED_FIELD, write_sweep_report
from reports.sweeps import confidence
from testbed.manifest import versions
from testbed.scenario import Scenario, format_errors

FIGURES = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_p50_s",
    "e2e_p50_s",
    "sla_goodput_rps",
    "bcr",
)


class NotReproducible(RuntimeError):
    """The stored run cannot be run again as it was (software or trace differ)."""


@dataclass(frozen=True)
class Stored:
    path: Path
    scenario: Scenario
    systems: list[str]
    versions: dict[str, str]


def load_stored(run_dir: Path) -> Stored:
    run_dir = Path(run_dir)
    if not (run_dir / "scenario.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a bench run directory (no scenario.json)")
    if (run_dir / "sweep.json").exists():
        raise NotReproducible(f"{run_dir} is a sweep: reproduce one of its points")
    if (run_dir.parent / "sweep.json").exists() and not (run_dir / "summary.json").exists():
        raise NotReproducible(f"{run_dir} is a sweep point that never completed")
    path = run_dir / "scenario.json"
    data = read_json(path, dict)
    systems = data.get("systems")
    if not isinstance(systems, list):
        raise DamagedFile(f"{path}: names no systems (not the scenario a bench writes)")
    target = run_dir / "scenario-target.json"
    if target.exists():  # emulation: the target scenario at the dilation the run used
        path, data = target, read_json(target, dict)
        emulated = read_json(run_dir / "emulation.json", dict)
        if not isinstance(data.get("emulation"), dict) or "dilation" not in emulated:
            raise DamagedFile(f"{target} or emulation.json: no emulation and its dilation")
        data["emulation"].update(calibrate=False, dilation=emulated["dilation"])
        data["systems"] = systems
    manifests = [run_dir / s / "manifest.json" for s in systems]
    stored_versions = next(
        (read_json(m, dict).get("versions", {}) for m in manifests if m.exists()), {}
    )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise DamagedFile(f"{path}: not a valid scenario here\n{format_errors(exc)}") from None
    return Stored(run_dir, scenario, systems, stored_versions)


def version_drift(stored: dict[str, str]) -> list[str]:
    now = versions()
    return [
        f"{name}: stored {was}, here {now.get(name, 'not installed')}"
        for name, was in stored.items()
        if now.get(name) != was
    ]


def same_trace(stored: Stored) -> bool:
    """Whether the scenario's seeds regenerate the stored trace, byte for byte."""
    import tempfile

    from testbed import dilation
    from testbed.model import describe

    scenario = stored.scenario
    if scenario.emulation is not None:  # the trace is in testbed time
        tiny_kv = describe(scenario.model.resolve())["kv_bytes_per_token"]
        scenario = dilation.for_testbed(scenario, tiny_kv)
    kept = stored.path / "trace.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        again = scenario.workload.materialize(Path(tmp))
        if not kept.exists():  # the run replayed a trace file as it was: that file
            return Path(again).exists()
        return _digest(again) == _digest(kept)


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def verdicts(stored_run: Path, new_run: Path, tolerance: float) -> list[dict]:
    """Per system and figure: stored, reproduced, relative change, reproduced or not."""
    old = {r["system"]: r for r in summary_of(stored_run)["systems"]}
    new = {r["system"]: r for r in summary_of(new_run)["systems"]}
    rows = []
    for system, before in old.items():
        after = new.get(system, {})
        for figure in FIGURES:
            a, b = before.get(figure), after.get(figure)
            change = (b - a) / abs(a) if a not in (None, 0) and b is not None else None
            ok = change is not None and abs(change) <= tolerance
            rows.append(
                {
                    "system": system,
                    "figure": figure,
                    "stored": a,
                    "reproduced": b,
                    "change": change,
                    "reproduced_ok": ok,
                }  # fmt: skip
            )
        errors_before = sum(before.get("errors", {}).values())
        errors_after = sum(after.get("errors", {}).values()) if after else None
        rows.append(
            {
                "system": system,
                "figure": "errors",
                "stored": errors_before,
                "reproduced": errors_after,
                "change": None,
                "reproduced_ok": errors_after is not None and errors_after <= errors_before,
            }  # fmt: skip
        )
    return rows


def seed_points(run_dir: Path) -> list[str] | None:
    """A repeated run's point directories (one per seed); None for a single run."""
    path = Path(run_dir) / "sweep.json"
    if not path.exists():
        return None
    sweep = read_json(path, dict)
    if not isinstance(sweep.get("sweep"), dict):
        raise DamagedFile(f"{path}: no sweep as a bench writes it")
    if list(sweep["sweep"]) != [SEED_FIELD]:
        raise NotReproducible(
            f"{run_dir} is a sweep over {', '.join(sweep['sweep'])}: reproduce one of its "
            "points (only a repeated run, bench --seeds, is reproduced whole)"
        )
    if not isinstance(sweep.get("points"), list):
        raise DamagedFile(f"{path}: no points as a bench writes them")
    return sweep["points"]


def _repeated(run_dir: Path, points: list[str]) -> pd.DataFrame:
    """One row per seed and system: the figures of each point's summary."""
    rows = []
    for point in points:
        for r in summary_of(Path(run_dir) / point)["systems"]:
            errors = sum(r.get("errors", {}).values())
            rows.append({"system": r["system"], **{f: r.get(f) for f in FIGURES}, "errors": errors})
    return pd.DataFrame(rows)


def interval_verdicts(stored_run: Path, new_run: Path, points: list[str]) -> list[dict]:
    """Per system and figure of a repeated run: stored and reproduced means with their
    95% half-widths; reproduced when the means differ by at most the difference's interval."""
    before, after = _repeated(stored_run, points), _repeated(new_run, points)
    old, new = confidence(before, FIGURES), confidence(after, FIGURES)
    rows = []
    for _, o in old.iterrows():
        n = new[new["system"] == o["system"]]
        for figure in FIGURES:
            a, ha = o[f"{figure}_mean"], o[f"{figure}_ci95"]
            b = float(n[f"{figure}_mean"].iloc[0]) if not n.empty else math.nan
            hb = float(n[f"{figure}_ci95"].iloc[0]) if not n.empty else math.nan
            bound = math.hypot(ha, hb)
            ok = not math.isnan(b) and (a == b or abs(b - a) <= bound)
            rows.append(
                {
                    "system": o["system"],
                    "figure": figure,
                    "stored": _nan_none(a),
                    "stored_ci95": _nan_none(ha),
                    "reproduced": _nan_none(b),
                    "reproduced_ci95": _nan_none(hb),
                    "change": (b - a) / abs(a) if a and not math.isnan(a + b) else None,
                    "reproduced_ok": ok,
                }  # fmt: skip
            )
        stored_errors = int(before[before["system"] == o["system"]]["errors"].sum())
        new_errors = int(after[after["system"] == o["system"]]["errors"].sum())
        rows.append(
            {
                "system": o["system"],
                "figure": "errors",
                "stored": stored_errors,
                "reproduced": new_errors if not n.empty else None,
                "change": None,
                "reproduced_ok": not n.empty and new_errors <= stored_errors,
            }  # fmt: skip
        )
    return rows


def _nan_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def table(rows: list[dict], tolerance: float) -> Table:
    repeated = any("stored_ci95" in r for r in rows)
    rule = "means within the 95% interval of their difference" if repeated else None
    t = Table(title=f"stored vs reproduced (reproduced: {rule or f'within {tolerance:.0%}'})")
    for col in ("system", "figure", "stored", "reproduced", "change", "verdict"):
        t.add_column(col, justify="left" if col in ("system", "figure") else "right")
    for r in rows:
        t.add_row(
            r["system"],
            r["figure"],
            _fmt(r["stored"], r.get("stored_ci95")),
            _fmt(r["reproduced"], r.get("reproduced_ci95")),
            "-" if r["change"] is None else f"{r['change']:+.1%}",
            "[green]reproduced[/green]" if r["reproduced_ok"] else "[red]not reproduced[/red]",
        )
    return t


def _fmt(value, ci95: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text + (f" ± {ci95:.2g}" if ci95 is not None else "")


def reproduce(
    run_dir: Path, out: Path, console: Console, tolerance: float, allow_drift: bool
) -> tuple[Path, list[dict]]:
    from testbed.bench.run import run_point
    from testbed.run_dirs import new_run_dir

    run_dir = Path(run_dir)
    points = seed_points(run_dir)
    # Every point is checked before anything runs.
    stored = [load_stored(run_dir / p) for p in points] if points else [load_stored(run_dir)]
    drift = version_drift(stored[0].versions)
    if drift and not allow_drift:
        raise NotReproducible(
            "the software differs from the stored run's: "
            + "; ".join(drift)
            + " (--allow-version-drift runs anyway)"
        )
    for line in drift:
        console.print(f"[yellow]version drift:[/yellow] {line}")
    for point in stored:
        if not same_trace(point):
            raise NotReproducible(
                f"the scenario's seeds do not regenerate {point.path / 'trace.jsonl'}: "
                "a new run would not replay the same load"
            )
    new_dir = new_run_dir(Path(out), f"reproduce-{stored[0].scenario.name}")
    console.print(f"reproducing {run_dir} into {new_dir}")
    if not points:
        run_point(stored[0].scenario, new_dir, stored[0].systems, console)
        return new_dir, verdicts(run_dir, new_dir, tolerance)
    new_dir.mkdir(parents=True, exist_ok=True)
    for name in ("sweep.json", "scenario.json"):
        write_atomic(new_dir / name, (run_dir / name).read_text())
    for i, (label, point) in enumerate(zip(points, stored, strict=True)):
        console.rule(f"seed {i + 1}/{len(points)}: {label}")
        run_point(point.scenario, new_dir / label, point.systems, console)
    write_sweep_report(new_dir)
    return new_dir, interval_verdicts(run_dir, new_dir, points)
