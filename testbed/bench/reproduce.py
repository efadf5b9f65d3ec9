"""``testbed reproduce RUN_DIR``: run a stored bench again and say, figure by figure,
whether the new run reproduces it — what a reproducibility reviewer runs.

Steps: read the run's scenario (the target one under emulation, with the dilation the
run used instead of a new calibration) and its systems; check the software against the
run's manifest (SGLang, torch, transformers, Locust, pandas, the project; a difference
stops unless allowed); regenerate the trace from the same seeds and check it is the
stored one, byte for byte; run every system; compare the two summaries.

A figure is reproduced when the new value lies within ``tolerance`` (relative) of the
stored one; latency, goodput and BCR are compared, error counts must not grow.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reports.compare import summary_of
from testbed.manifest import versions
from testbed.scenario import Scenario

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
    data = json.loads((run_dir / "scenario.json").read_text())
    systems = data["systems"]
    target = run_dir / "scenario-target.json"
    if target.exists():  # emulation: the target scenario at the dilation the run used
        data = json.loads(target.read_text())
        emulated = json.loads((run_dir / "emulation.json").read_text())
        data["emulation"].update(calibrate=False, dilation=emulated["dilation"])
        data["systems"] = systems
    manifests = [run_dir / s / "manifest.json" for s in systems]
    stored_versions = next(
        (json.loads(m.read_text()).get("versions", {}) for m in manifests if m.exists()), {}
    )
    return Stored(run_dir, Scenario.model_validate(data), systems, stored_versions)


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


def table(rows: list[dict], tolerance: float) -> Table:
    t = Table(title=f"stored vs reproduced (reproduced: within {tolerance:.0%})")
    for col in ("system", "figure", "stored", "reproduced", "change", "verdict"):
        t.add_column(col, justify="left" if col in ("system", "figure") else "right")
    for r in rows:
        t.add_row(
            r["system"],
            r["figure"],
            _fmt(r["stored"]),
            _fmt(r["reproduced"]),
            "-" if r["change"] is None else f"{r['change']:+.1%}",
            "[green]reproduced[/green]" if r["reproduced_ok"] else "[red]not reproduced[/red]",
        )
    return t


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def reproduce(
    run_dir: Path, out: Path, console: Console, tolerance: float, allow_drift: bool
) -> tuple[Path, list[dict]]:
    from testbed.bench.run import run_point
    from testbed.run_dirs import new_run_dir

    stored = load_stored(run_dir)
    drift = version_drift(stored.versions)
    if drift and not allow_drift:
        raise NotReproducible(
            "the software differs from the stored run's: "
            + "; ".join(drift)
            + " (--allow-version-drift runs anyway)"
        )
    for line in drift:
        console.print(f"[yellow]version drift:[/yellow] {line}")
    if not same_trace(stored):
        raise NotReproducible(
            f"the scenario's seeds do not regenerate {stored.path / 'trace.jsonl'}: "
            "a new run would not replay the same load"
        )
    new_dir = new_run_dir(Path(out), f"reproduce-{stored.scenario.name}")
    console.print(f"reproducing {stored.path} into {new_dir}")
    run_point(stored.scenario, new_dir, stored.systems, console)
    rows = verdicts(stored.path, new_dir, tolerance)
    return new_dir, rows
