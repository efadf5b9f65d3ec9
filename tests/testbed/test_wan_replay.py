"""``testbed wan-replay``: a stored run's WAN transfers predicted again, offline (no
servers, no network). The run directory is written here the way the bench writes one,
its predictions made by a WAN line driven as the live router drives it, so the replay
must give them back exactly."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from protocol.kv import LINE_SHARE_HEADROOM
from protocol.records import TransferRecord
from testbed.bench.wan_replay import replay, replay_run
from testbed.cli import app
from testbed.router.config import PddConfig, RouterConfig, ServerEntry
from testbed.router.policies import wan_line

MB = 1_000_000
FAR = "10.0.2.10"  # main decode's address: the sender's peer on the WAN
ONE_WAY = 0.01


def transfer(room: int, side: str, nbytes: int, first: float, end: float, **tcp) -> dict:
    peer = f"{FAR}:4000" if side == "prefill" else "10.0.1.10:8998"
    return asdict(
        TransferRecord(
            room=room, side=side, peer=peer, start=first - 0.05, first_byte=first, end=end,
            status="success", kv_bytes=nbytes, wire_bytes=nbytes, **tcp,
        )
    )  # fmt: skip


def write_run(
    system_dir: Path, bad_prediction: bool = False, joined_late: bool = False
) -> list[float]:
    """One pdd system's directory: a warm-up transfer, then three measured ones (the
    third routed while the second is on the line). ``joined_late``: the second's record
    has no transfer (relay decode finished its request before the KV reached main
    decode, which went on receiving it for its cache). Returns the measured errors."""
    system_dir.mkdir(parents=True)
    servers = [
        ServerEntry(name="p", url="http://10.0.1.10:1", role="prefill", site="A",
                    host="10.0.1.10", transfer_log=Path("/elsewhere/transfers-p.jsonl")),
        ServerEntry(name="md", url=f"http://{FAR}:1", role="main_decode", site="B",
                    host=FAR, transfer_log=Path("/elsewhere/transfers-md.jsonl")),
    ]  # fmt: skip
    pdd = PddConfig(wan_rate_mbit=100, wan_one_way_s=ONE_WAY, wan_loss_pct=0)
    config = RouterConfig(
        system="pdd", policy="pdd", servers=servers, records=Path("records.jsonl"), pdd=pdd
    )
    (system_dir / "router.json").write_text(config.model_dump_json())
    now = [1000.0]
    line = wan_line(pdd, clock=lambda: now[0])  # the router's starts with the run
    # (routed, bytes, first byte, end, measured) per request; room = index
    plan = [
        (1000.0, 2 * MB, 1000.1, 1000.35, 0.25),  # the warm-up: teaches, is not scored
        (1001.0, 5 * MB, 1001.1, 1001.6, 0.5),
        (1002.0, 5 * MB, 1002.1, 1002.9, 0.8),
        (1002.3, 2 * MB, 1002.4, 1002.8, 0.4),  # shares the line with what is left of it
    ]
    received, sent, records = [], [], []
    events = []
    for room, (routed, _, _, end, _) in enumerate(plan):
        events += [(routed, 0, room), (end, 1, room), (end + 0.02, 2, room)]
    errors = []
    for at, kind, room in sorted(events):
        now[0] = at
        routed, nbytes, first, end, measured = plan[room]
        span = measured + ONE_WAY  # the sender's first byte left one way before
        if kind == 0:
            predicted = line.predict(nbytes)
            line.start(room, nbytes)
            record = {
                "request_id": f"r{room}", "room": room, "dispatched": routed,
                "kv_link": "wan", "kv_transfer_s": measured, "kv_span_s": span,
                "wan_own_bytes": nbytes, "predicted_wan_s": predicted.seconds,
                "predicted_kv_span_s": predicted.span_s * (3 if bad_prediction else 1),
            }  # fmt: skip
            if joined_late and room == 2:
                record.update(kv_link=None, kv_transfer_s=None, kv_span_s=None)
            records.append(record)
            if room and record["kv_transfer_s"]:
                errors.append(abs(record["predicted_kv_span_s"] - span) / span)
        elif kind == 1:
            sender_first = {"sender_first_byte": first - ONE_WAY}
            received.append(transfer(room, "decode", nbytes, first, end, **sender_first))
            line.settle(room, TransferRecord(**received[-1]))
        else:
            # the sender's window as its connection ended: below the pipe, past the slow
            # start threshold (the model's own guess from the bytes carried is the pipe)
            window = {"cwnd_end_bytes": 30_000, "ssthresh_end_bytes": 30_000}
            sent.append(transfer(room, "prefill", nbytes, first, end + 0.02, **window))
            line.sender_end(room, TransferRecord(**sent[-1]))
    lines = {
        "warmup-records.jsonl": records[:1],
        "records.jsonl": records[1:],
        "transfers-md.jsonl": received + [{"room": 1, "side": "handoff", "tokens": 3}],
        "transfers-p.jsonl": sent,
    }
    for name, rows in lines.items():
        (system_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return errors


def test_the_replay_gives_back_the_predictions_the_router_made(tmp_path):
    errors = write_run(tmp_path / "run" / "pdd")
    rows = replay(tmp_path / "run" / "pdd")
    assert [r.request_id for r in rows] == ["r1", "r2", "r3"]  # the warm-up only taught
    for r in rows:
        assert r.replayed_s == pytest.approx(r.recorded_s, rel=1e-9)
    # the third shared the line with the second: predicted slower than alone
    assert rows[2].replayed_s > 2 * MB / (100e6 / 8) + ONE_WAY
    summary = replay_run(tmp_path / "run")["pdd"]
    assert summary["transfers"] == 3
    assert summary["replayed_p50"] == pytest.approx(sorted(errors)[1])
    assert summary["recorded_p50"] == pytest.approx(summary["replayed_p50"])


def test_a_transfer_the_record_did_not_join_still_shares_the_line(tmp_path):
    """Its request's record was written before its transfer ended (hetero run 111130:
    two 10-12 MB transfers to main decode's cache, 110 s on the line in the opening
    burst), so it is not scored, but the router had its bytes on the line: left out, the
    replay learned from the others as if each had the line alone, and predicted the
    next ones 2-10x what the router had."""
    write_run(tmp_path / "run" / "pdd", joined_late=True)
    rows = replay(tmp_path / "run" / "pdd")
    assert [r.request_id for r in rows] == ["r1", "r3"]
    for r in rows:
        assert r.replayed_s == pytest.approx(r.recorded_s, rel=1e-9)


def test_the_command_shows_a_recorded_error_the_replay_does_not_reproduce(tmp_path):
    write_run(tmp_path / "run" / "pdd", bad_prediction=True)  # as if recorded by another model
    result = CliRunner().invoke(app, ["wan-replay", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if "pdd" in line]
    cells = [c.strip() for c in row.split("│") if c.strip()]
    replayed, recorded = float(cells[2].rstrip("%")), float(cells[4].rstrip("%"))
    assert cells[1] == "3" and recorded > replayed + 50


def test_a_run_without_wan_predictions_is_refused_with_a_reason(tmp_path):
    (tmp_path / "same_site_pd").mkdir()
    result = CliRunner().invoke(app, ["wan-replay", str(tmp_path)])
    said = " ".join(result.output.split())  # as wrapped to the terminal's width
    assert result.exit_code == 2 and "no system whose router predicted WAN times" in said


def test_a_run_from_before_the_line_knew_its_queue_is_replayed_with_its_scenarios(tmp_path):
    """Routers before ``wan_queue_bytes`` stored no queue (nor, later, a congestion
    control, jitter or senders' pacing): the replay takes the run's from its scenario
    (queue_packets x MTU; servers.kv_line_share), as a router now would; one stored wins."""
    from testbed.bench.wan_replay import _with_line

    wan = {"queue_packets": 1000, "mtu": 1500, "congestion_control": "reno", "jitter_ms": 2.0}
    (tmp_path / "scenario.json").write_text(json.dumps({"network": {"wan": wan}}))
    old = {"system": "pdd", "pdd": {"wan_rate_mbit": 100.0}}
    filled = _with_line(old, tmp_path)["pdd"]
    assert filled["wan_queue_bytes"] == 1_500_000 and filled["wan_congestion_control"] == "reno"
    assert filled["wan_jitter_s"] == 0.002 and filled["wan_paced_share"] == 0.0
    shared = {"network": {"wan": wan}, "servers": {"kv_line_share": True}}
    (tmp_path / "scenario.json").write_text(json.dumps(shared))
    assert _with_line(old, tmp_path)["pdd"]["wan_paced_share"] == LINE_SHARE_HEADROOM
    (tmp_path / "scenario.json").write_text(json.dumps({"network": {"wan": wan}}))
    # field by field: each stored one wins, each missing one comes from the scenario
    partial = {"system": "pdd", "pdd": {"wan_queue_bytes": 3000, "wan_jitter_s": 0.0}}
    filled = _with_line(partial, tmp_path)["pdd"]
    assert filled == {**partial["pdd"], "wan_congestion_control": "reno", "wan_paced_share": 0.0}
    stored_queue = {"system": "pdd", "pdd": {"wan_queue_bytes": 3000}}
    assert _with_line(stored_queue, tmp_path)["pdd"]["wan_queue_bytes"] == 3000
    assert _with_line({"system": "same_site_pd", "pdd": None}, tmp_path)["pdd"] is None


@pytest.mark.parametrize(
    "router, scenario, said",
    [
        ("{}", None, "router.json: not the router configuration a run writes - system: Field"),
        ("[]", None, "router.json: not the JSON a run writes (an object expected)"),
        ("{", None, "router.json: not the JSON a run writes"),
        ('{"system": "pdd", "pdd": 3}', None, "router.json: not the router configuration"),
        (None, '{"network": {}}', "scenario.json: no network.wan as a bench writes it"),
    ],
)
def test_a_stored_runs_damaged_file_is_named(tmp_path, router, scenario, said):
    write_run(tmp_path / "run" / "pdd")
    if router is not None:
        (tmp_path / "run" / "pdd" / "router.json").write_text(router)
    if scenario is not None:
        (tmp_path / "run" / "scenario.json").write_text(scenario)
    result = CliRunner().invoke(app, ["wan-replay", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert said in " ".join(result.output.split())


def test_a_system_with_no_measured_transfer_shows_none_not_nan(tmp_path):
    write_run(tmp_path / "run" / "pdd")
    (tmp_path / "run" / "pdd" / "records.jsonl").write_text("")  # no request joined one
    result = CliRunner().invoke(app, ["wan-replay", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if "pdd" in line]
    assert [c.strip() for c in row.split("│") if c.strip()] == ["pdd", "0", "-", "-", "-", "-"]
