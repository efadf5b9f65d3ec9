"""A sweep's run directory, built from hand-made records (standing in for two bench
points): the per-point table, the sweep page, and regeneration from files alone."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from protocol.records import RequestRecord
from reports.render import write_reports
from testbed.scenario import Scenario


def write_point(point_dir, scenario: Scenario, ttft_by_system: dict[str, float]) -> None:
    data = scenario.model_dump(mode="json")
    data["systems"] = list(ttft_by_system)
    point_dir.mkdir(parents=True)
    (point_dir / "scenario.json").write_text(json.dumps(data))
    for system, ttft in ttft_by_system.items():
        d = point_dir / system
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"kv_bytes_per_token": 8192}))
        (d / "COMPLETE").write_text("")
        (d / "cost.json").write_text(json.dumps({"accelerators": {"GPU-A": 2}, "wan_lines": 0}))
        with open(d / "records.jsonl", "w") as f:
            for i in range(10):
                t = float(i)
                r = RequestRecord(
                    request_id=f"{system}{i}",
                    system=system,
                    endpoint="/generate",
                    arrival=t,
                    first_token=t + ttft,
                    finish=t + ttft + 0.05,
                    token_times=[t + ttft, t + ttft + 0.05],
                    output_tokens=2,
                    prompt_tokens=100,
                )
                f.write(json.dumps(asdict(r)) + "\n")


def test_sweep_page_tabulates_every_point_and_regenerates(tmp_path):
    scenario = Scenario(name="s", sweep={"network.wan.rate_mbit": [25, 100]})
    points = scenario.points()
    assert [label for label, _ in points] == ["rate_mbit-25", "rate_mbit-100"]
    (tmp_path / "scenario.json").write_text(scenario.model_dump_json())
    sweep = {"sweep": scenario.sweep, "points": [label for label, _ in points]}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    # The slow WAN point has the slower cross-site TTFT; same-site does not move.
    write_point(tmp_path / "rate_mbit-25", points[0][1], {"same_site_pd": 0.2, "cross": 2.0})
    write_point(tmp_path / "rate_mbit-100", points[1][1], {"same_site_pd": 0.2, "cross": 0.5})

    page = write_reports(tmp_path)

    html = page.read_text()
    assert page.name == "sweep.html" and 'id="sweep-table"' in html and "<img" in html
    for p in sweep["points"]:
        assert (tmp_path / p / "report.html").exists() and f'href="{p}/report.html"' in html
    from reports.run_data import load_run
    from reports.tables import sweep_table

    table = sweep_table({p: load_run(tmp_path / p) for p in sweep["points"]}, sweep["sweep"])
    cross = table[table["system"] == "cross"].set_index("rate_mbit")
    assert cross.loc[25.0, "ttft_p90_s"] == pytest.approx(2.0)
    assert cross.loc[100.0, "ttft_p90_s"] == pytest.approx(0.5)
    assert len(table) == 4 and (table["requests"] == 10).all()


def test_a_sweep_over_a_field_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="'network.wan.speed' is not a scenario field"):
        Scenario(name="s", sweep={"network.wan.speed": [1]})
    with pytest.raises(ValueError, match="sweep point"):
        Scenario(name="s", sweep={"network.wan.loss_pct": [0.1, 150]})
