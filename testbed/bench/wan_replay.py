"""Replay a stored run's WAN transfers through the router's WAN model, offline.

The router predicts each transfer's time on the WAN (:class:`testbed.router.wan.WanLine`)
from what it has seen of the line; its prediction and the receiver's measurement go
into every record, and the report shows their error. To work on the model, or to check
a stored run's predictions, ``testbed wan-replay RUN_DIR`` feeds a fresh line, on a
clock that follows the run, the events the live router saw, in time order:

- each request whose KV crossed the WAN, routed at its ``dispatched`` time
  (``predict``, then ``start``), warm-up requests included (the router learned from
  them too), and those whose transfer ended after their record was written (not
  scored, but on the line);
- each far-site receiver's log line at its ``end`` (``settle``);
- each prefill sender's line to a far-site host at its ``end`` (``sender_end``);
- each far-site decode's pool line at its ``time`` (``mirror``; runs from before them
  have none, and the model guesses the pool).

The replay predicts for the bytes the router did (``wan_own_bytes``: what its prefix
mirror expected main decode to lack; the bytes that crossed in runs older than that
field), and delivers each log line when it was written, where the router read it at
its next request; so its predictions track the recorded ones closely but not exactly,
and both errors are shown side by side. Nothing runs: no network, no
servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from protocol.kv import LINE_SHARE_HEADROOM
from protocol.metrics import percentile
from protocol.names import Role
from protocol.records import (
    DamagedFile,
    PoolRecord,
    TransferRecord,
    from_dict,
    read_json,
    read_jsonl,
)
from testbed.router.config import RouterConfig
from testbed.router.policies import wan_line
from testbed.scenario import format_errors

ROUTED, POOL, SETTLED, SENDER = 0, 1, 2, 3  # event kinds, in this order at one instant


@dataclass(frozen=True)
class Replayed:
    """One measured WAN transfer: the replay's prediction beside the recorded one."""

    request_id: str
    measured_s: float
    recorded_s: float | None
    replayed_s: float

    @staticmethod
    def error(predicted: float | None, measured: float) -> float:
        return abs(predicted - measured) / measured if predicted is not None else math.nan


def _lines(path: Path) -> list[dict]:
    return list(read_jsonl(path)) if path.exists() else []


class NoWanModel(ValueError):
    """The system's router predicts no WAN time (not a pdd system)."""


def _with_line(config: dict, run_dir: Path) -> dict:
    """A router config from before the line knew its bottleneck queue
    (``wan_queue_bytes``), congestion control, jitter or senders' pacing gets each it
    lacks from the run's scenario, as a router now would."""
    pdd, scenario = config.get("pdd"), run_dir / "scenario.json"
    if not isinstance(pdd, dict) or not scenario.exists():
        return config  # none, or not an object: the configuration's check names it
    try:
        stored = read_json(scenario, dict)
        wan, shared = stored["network"]["wan"], stored.get("servers", {}).get("kv_line_share")
        known = {
            "wan_queue_bytes": wan["queue_packets"] * wan["mtu"],
            "wan_congestion_control": wan.get("congestion_control") or "cubic",
            "wan_jitter_s": wan.get("jitter_ms", 0.0) / 1000,
            "wan_paced_share": LINE_SHARE_HEADROOM if shared else 0.0,
        }
    except (KeyError, TypeError, AttributeError):
        raise DamagedFile(f"{scenario}: no network.wan as a bench writes it") from None
    return {**config, "pdd": {**known, **pdd}}


def replay(system_dir: Path) -> list[Replayed]:
    """The WAN transfers of one system's run directory, predicted again."""
    config_path = system_dir / "router.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{system_dir}: no router.json (not a system's run directory)")
    stored = read_json(config_path, dict)
    try:
        config = RouterConfig.model_validate(_with_line(stored, system_dir.parent))
    except ValidationError as exc:  # fields of the wrong kind
        what = "not the router configuration a run writes"
        raise DamagedFile(f"{config_path}: {what}\n{format_errors(exc)}") from None
    if config.pdd is None:
        raise NoWanModel(f"{system_dir}: system {config.system!r} predicts no WAN time")
    near = {s.site for s in config.with_role(Role.PREFILL)}
    far = [s for s in config.servers if s.site not in near]
    far_hosts = {s.host for s in far}

    read: dict[str, list[dict]] = {}  # each log read once: decode's has two sides

    def logs(servers, side: str, kind=TransferRecord) -> list:
        """One side's lines in these servers' logs (transfers: the ended ones)."""
        found = []
        for s in servers:
            if s.transfer_log:  # written where the bench ran: found by name here
                name = Path(s.transfer_log).name
                if name not in read:
                    read[name] = _lines(system_dir / name)
                lines = read[name]
                found += [from_dict(kind, d) for d in lines if d.get("side") == side]
        return [t for t in found if kind is not TransferRecord or t.end is not None]

    received = {t.room: t for t in logs(far, "decode")}
    prefill = config.with_role(Role.PREFILL)
    sent = [t for t in logs(prefill, "prefill") if t.peer.rsplit(":", 1)[0] in far_hosts]
    load = _lines(system_dir / "records.jsonl")
    scored = {id(r) for r in load}  # the warm-up's requests teach the line, unscored
    records = _lines(system_dir / "warmup-records.jsonl") + load
    # what the router put on the line: its bytes where recorded, also for a request
    # whose record was written before its transfer ended (no kv_link then: relay decode
    # finished it, and main decode went on receiving the KV for its cache)
    routed = [
        r
        for r in records
        if r.get("room") in received and (r.get("wan_own_bytes") or r.get("kv_link") == "wan")
    ]
    events = sorted(
        [(r["dispatched"], ROUTED, r) for r in routed]
        + [(t.end, SETTLED, t) for t in received.values()]
        + [(t.end, SENDER, t) for t in sent]
        + [(t.time, POOL, t) for t in logs(far, "pool", PoolRecord)],
        key=lambda e: (e[0], e[1]),
    )
    # the line's clock follows the run from its first event (on the wall clock, the
    # model stood at the replay's own time, after the whole run: it drained nothing
    # and learned no lag, and predicted hetero's opening burst 2-10x the router's)
    now = [events[0][0] if events else 0.0]
    line = wan_line(config.pdd, clock=lambda: now[0])
    out = []
    for at, kind, item in events:
        now[0] = at
        if kind == ROUTED:
            # the bytes the router predicted for (its prefix mirror's), where recorded
            nbytes = item.get("wan_own_bytes") or received[item["room"]].kv_bytes
            after = item.get("wan_held_for")  # MD held it back for that transfer
            predicted = line.predict(nbytes, after).span_s
            line.start(item["room"], nbytes, after)
            # the KV's span on the line, as the report scores it (its receiver's line
            # has the sender's first byte); the record's, for runs older than the span
            measured = item.get("kv_span_s") or (
                item.get("kv_transfer_s") and received[item["room"]].span_s
            )
            if measured and id(item) in scored:
                recorded = item.get("predicted_kv_span_s")
                out.append(Replayed(item["request_id"], measured, recorded, predicted))
        elif kind == POOL:
            line.mirror(item)
        elif kind == SETTLED:
            line.settle(item.room, item)
        else:
            line.sender_end(item.room, item)
    return out


def summary(rows: list[Replayed]) -> dict[str, float]:
    """P50 and P95 of |predicted - measured| / measured, replayed and recorded."""
    out: dict[str, float] = {"transfers": len(rows)}
    for name in ("replayed", "recorded"):
        errors = [Replayed.error(getattr(r, f"{name}_s"), r.measured_s) for r in rows]
        errors = [e for e in errors if not math.isnan(e)]
        for q in (50, 95):
            out[f"{name}_p{q}"] = percentile(errors, q)
    return out


def replay_run(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per system of a run directory (or one system's) that predicted WAN times: its
    :func:`summary`."""
    dirs = [run_dir] if (run_dir / "router.json").exists() else sorted(run_dir.iterdir())
    out = {}
    for d in dirs:
        try:
            out[d.name] = summary(replay(d))
        except (FileNotFoundError, NoWanModel):
            continue  # not a system's directory, or a system without a WAN model
    if not out:
        raise FileNotFoundError(f"{run_dir}: no system whose router predicted WAN times")
    return out
