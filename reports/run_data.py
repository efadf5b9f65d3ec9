"""A benchmark run directory, read back: scenario, and per system its records,
manifest, link check and KV transfer logs. Files only — no live process needed.

Layout written by ``testbed bench``::

    RUN_DIR/scenario.json, trace.jsonl, report.html
            emulation.json, scenario-target.json (emulation mode only)
    RUN_DIR/<system>/records.parquet (or records.jsonl), manifest.json, link_check.json,
                     transfers-*.jsonl, pacing-*.jsonl, locust_stats.csv, server-*.log,
                     router.log, client.jsonl (Locust's own timing), cpu.json
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from protocol.records import COLUMNS, DamagedFile, read_json, read_jsonl, read_records


@dataclass
class SystemRun:
    name: str
    records: pd.DataFrame
    manifest: dict
    link_check: list[dict] = field(default_factory=list)
    transfers: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost: dict = field(default_factory=dict)
    pacing: pd.DataFrame = field(default_factory=pd.DataFrame)
    cpu: list[dict] = field(default_factory=list)  # cpu.json: CPU share per process
    client: pd.DataFrame = field(default_factory=pd.DataFrame)  # client.jsonl: Locust's view


@dataclass
class RunData:
    path: Path
    scenario: dict
    systems: dict[str, SystemRun]
    emulation: dict = field(default_factory=dict)  # emulation.json; empty: none
    target_scenario: dict = field(default_factory=dict)  # in target time (emulation)
    left_out: dict[str, str] = field(default_factory=dict)  # scenario's systems not here: why


RENAMED = {"wan_goodput_bps": "wan_goodput_bytes_s"}  # columns of older runs


def records_frame(system_dir: Path) -> pd.DataFrame:
    """The records of a system, with this version's columns (a stored run's renamed
    columns under their new names, columns no longer recorded dropped)."""
    parquet = system_dir / "records.parquet"
    if parquet.exists():
        try:
            frame = pd.read_parquet(parquet).rename(columns=RENAMED)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise DamagedFile(f"{parquet}: not a readable Parquet file ({exc})") from None
        return frame[[c for c in frame.columns if c in COLUMNS]]
    jsonl = system_dir / "records.jsonl"
    rows = [r.__dict__ for r in read_records(jsonl)] if jsonl.exists() else []
    return pd.DataFrame(rows, columns=COLUMNS)


def write_parquet(system_dir: Path) -> Path:
    """records.jsonl → records.parquet (the raw per-request data a report reads)."""
    frame = records_frame(system_dir)
    path = system_dir / "records.parquet"
    tmp = path.with_name(".records.parquet.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)  # whole or not at all
    return path


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    scenario_file = run_dir / "scenario.json"
    if not scenario_file.exists():
        raise FileNotFoundError(f"{run_dir} is not a bench run directory (no scenario.json)")
    scenario = read_json(scenario_file, dict)
    systems, left_out = {}, {}
    for name in scenario.get("systems", []):
        d = run_dir / name
        if not (d / "COMPLETE").exists() or (d / "INCOMPLETE").exists():
            left_out[name] = _why_left_out(d)
            continue
        transfers, pacing = _server_logs(d, "transfers"), _server_logs(d, "pacing")
        systems[name] = SystemRun(
            name=name,
            records=records_frame(d),
            manifest=read_json(d / "manifest.json", dict),
            link_check=_json_rows(d / "link_check.json"),
            transfers=pd.DataFrame(transfers),
            cost=_json(d / "cost.json"),
            pacing=pd.DataFrame(pacing),
            cpu=[r for f in ("cpu.json", "locust_cpu.json") for r in _json_rows(d / f)],
            client=pd.DataFrame(read_jsonl(d / "client.jsonl"))
            if (d / "client.jsonl").exists()
            else pd.DataFrame(),
        )
    return RunData(
        run_dir,
        scenario,
        systems,
        _json(run_dir / "emulation.json"),
        _json(run_dir / "scenario-target.json"),
        left_out,
    )


def _why_left_out(system_dir: Path) -> str:
    """Why a system of the scenario has no results: its run failed or was cut short
    (``INCOMPLETE`` says how), or it never finished (no ``COMPLETE``)."""
    incomplete = system_dir / "INCOMPLETE"
    if incomplete.exists():
        return incomplete.read_text(errors="replace").strip()[:300] or "its run did not complete"
    if not system_dir.is_dir():
        return "it did not run"
    return "its run did not finish (no COMPLETE marker)"


def _json_rows(path: Path) -> list[dict]:
    return read_json(path, list) if path.exists() else []


def _json(path: Path) -> dict:
    return read_json(path, dict) if path.exists() else {}


def _server_logs(system_dir: Path, kind: str) -> list[dict]:
    """Every line of the servers' ``<kind>-<server>.jsonl`` logs, tagged with the server."""
    return [
        {**data, "server": p.stem.removeprefix(f"{kind}-")}
        for p in sorted(system_dir.glob(f"{kind}-*.jsonl"))
        for data in read_jsonl(p)
    ]
