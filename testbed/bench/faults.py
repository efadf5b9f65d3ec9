"""``make bench-faults``: a fault matrix on pdd and the baselines.

Per system: deployment up → warm-up → for each fault that applies to it: a closed-loop
load of ``streams`` greedy requests (prompts from a seeded pool, each a fresh session)
for the fault's window; the fault starts ``at_s`` into the window and ends ``for_s``
later — a killed server is restarted, and its fault ends once it is healthy again —
then ``recover_s`` more of load → deployment down. Every request's outcome is kept
(tokens, error, times) in ``requests.jsonl``.

Per fault the table says: requests, failed (each error in the JSON), hangs (no answer
within ``hang_s``), completed streams token-exact against a colocated server's greedy
output, tokens lost or duplicated in completed streams, the slowest clear error after
its fault (target ≤ 5 s) and the time to recover (the first request started after the
fault's end that completes token-exact, counted from the fault's end; target ≤ 10 s).

Lifecycle: ``run(scenario, out, console)`` → the colocated reference server up, the
pool's references computed, down → per system: Deployment up → faults in turn, each
fault undone before the next → down → ``faults.json``, ``faults.csv``,
``faults.html``. A fault that cannot be injected stops the run with the reason.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import pandas as pd
from rich.console import Console
from rich.table import Table

from protocol import headers
from protocol.names import Role
from protocol.records import write_atomic
from protocol.stream import Chunk
from testbed.deployment import Deployment
from testbed.run_dirs import new_run_dir
from testbed.scenario import Scenario
from testbed.server import ServerSpec, SGLangServer
from topologies.schedule import WanEvent, WanSchedule
from workloads.client import generate_payload

NET_NAME = "faults"
ERROR_WITHIN_S = 5.0  # targets (issue: the fault matrix)
RECOVER_WITHIN_S = 10.0


@dataclass(frozen=True)
class Fault:
    """One row of the matrix: what breaks, for how long, on which systems."""

    name: str
    what: str
    inject: Callable[[Deployment, FaultWindow], None]
    for_s: float = 0.0  # WAN faults: how long; kills: until the restart is healthy
    systems: tuple[str, ...] = ()  # empty: every system


@dataclass
class FaultWindow:
    """When a fault started and ended (wall clock), filled in by its injector."""

    started: float = 0.0
    ended: float = 0.0
    note: str = ""


def _wan(event: dict) -> Callable[[Deployment, FaultWindow], None]:
    def inject(d: Deployment, w: FaultWindow) -> None:
        wan = d.scenario.network.wan
        params = dict(event)
        if "rate_share" in params:  # a dip to a share of the scenario's own rate
            params["rate_mbit"] = wan.rate_mbit * params.pop("rate_share")
        e = WanEvent(at_s=0, **params)
        sched = WanSchedule(d.net, [e], d.run_dir / "fault_wan.jsonl")
        w.started = time.time()
        sched.start()
        time.sleep(e.for_s)
        sched.stop()
        if sched.errors:
            raise FaultError("; ".join(sched.errors))
        w.ended = time.time()

    return inject


def _kill(*roles: Role) -> Callable[[Deployment, FaultWindow], None]:
    def inject(d: Deployment, w: FaultWindow) -> None:
        targets = [s for s in d.servers if s.role in roles]
        if not targets:
            raise FaultError(f"{d.system.name} has no {' or '.join(roles)} server")
        s = targets[0]
        w.started = time.time()
        os.killpg(s.server.pid, signal.SIGKILL)  # the host crashes: every process at once
        s.server.stop(grace=5)  # reap it
        s.server.start()
        s.server.wait_healthy(d.scenario.servers.startup_timeout_s)
        w.ended = time.time()
        w.note = f"{s.name} killed and restarted in {w.ended - w.started:.1f} s"

    return inject


def _cut_router_connections(d: Deployment, w: FaultWindow) -> None:
    """Every TCP connection from the router to the servers (HTTP streams, handoff
    channels) is aborted (``ss -K``), as a stateful middlebox dropping them would."""
    w.started = time.time()
    for s in d.servers:
        argv = ["ss", "-K", "dst", s.spec.host]
        out = d.net.run(d.router_host, argv, check=False)
        if out.returncode != 0:
            raise FaultError(f"ss -K in the router's host failed: {out.stderr.strip()[:200]}")
    w.ended = time.time()


FAULTS: tuple[Fault, ...] = (
    Fault("wan_cut", "WAN cut for 5 s (mid-transfer)", _wan({"for_s": 5, "cut": True})),
    Fault("loss_burst", "WAN loss 5% for 10 s", _wan({"for_s": 10, "loss_pct": 5})),
    Fault("rate_dip", "WAN rate to 10% for 20 s", _wan({"for_s": 20, "rate_share": 0.1})),
    Fault("kill_prefill", "kill -9 of prefill", _kill(Role.PREFILL)),
    Fault(
        "kill_relay_decode", "kill -9 of relay decode", _kill(Role.RELAY_DECODE), systems=("pdd",)
    ),
    Fault("kill_decode", "kill -9 of main decode / decode", _kill(Role.MAIN_DECODE, Role.DECODE)),
    Fault("router_connections", "router's upstream connections aborted", _cut_router_connections),
)


class FaultError(RuntimeError):
    """A fault could not be injected as described: the matrix would claim a fault that
    did not happen."""


@dataclass
class Outcome:
    """One request of the load, as the client saw it."""

    system: str
    fault: str
    prompt: int
    started: float
    ended: float = 0.0
    tokens: list[int] = field(default_factory=list)
    status: int | None = None
    error: str = ""
    hang: bool = False

    @property
    def ok(self) -> bool:
        return not self.error and not self.hang


class Driver:
    """``streams`` client threads, each sending one greedy streamed request after the
    other until stopped; every outcome is appended to ``outcomes``."""

    def __init__(self, url: str, pool: list[list[int]], cfg: FaultsConfig, system: str) -> None:
        self.url, self.pool, self.cfg, self.system = url, pool, cfg, system
        self.fault = ""
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random(cfg.seed)
        self._lock = threading.Lock()

    def start(self, fault: str) -> None:
        self.fault = fault
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True)
            for i in range(self.cfg.streams)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.cfg.hang_s + 5)

    def _loop(self, worker: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(self.cfg.hang_s, connect=5)) as client:
            while not self._stop.is_set():
                with self._lock:
                    i = self._rng.randrange(len(self.pool))
                    n = len(self.outcomes)
                out = Outcome(self.system, self.fault, i, time.time())
                self._one(client, out, f"{self.system}-{self.fault}-{worker}-{n}")
                with self._lock:
                    self.outcomes.append(out)
                if not out.ok:
                    time.sleep(0.5)  # a client backs off after a failure

    def _one(self, client: httpx.Client, out: Outcome, session: str) -> None:
        payload = generate_payload(self.pool[out.prompt], self.cfg.output_tokens, True)
        hdrs = {headers.SESSION: session, headers.TURN: "0"}
        deadline = out.started + self.cfg.hang_s
        try:
            with client.stream("POST", f"{self.url}/generate", json=payload, headers=hdrs) as r:
                out.status = r.status_code
                if r.status_code != 200:
                    out.error = f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}"
                    return
                for line in r.iter_lines():
                    chunk = Chunk.parse(line)
                    if chunk.done:
                        break
                    if chunk.error:
                        out.error = f"stream error: {chunk.error}"[:300]
                        return
                    if chunk.data is not None:
                        out.tokens += chunk.new_ids(len(out.tokens))
                    if time.time() > deadline:
                        out.hang = True
                        return
        except httpx.ReadTimeout:
            out.hang = True
        except httpx.HTTPError as exc:
            out.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            out.ended = time.time()


@dataclass(frozen=True)
class FaultsConfig:
    streams: int = 3
    output_tokens: int = 48
    prompts: int = 12
    prompt_tokens: tuple[int, int] = (200, 1400)
    at_s: float = 5.0
    recover_s: float = 15.0
    hang_s: float = 60.0
    seed: int = 0


def prompt_pool(cfg: FaultsConfig, vocab: int = 4000) -> list[list[int]]:
    rng = random.Random(cfg.seed)
    return [
        [rng.randrange(10, vocab) for _ in range(rng.randint(*cfg.prompt_tokens))]
        for _ in range(cfg.prompts)
    ]


def references(scenario: Scenario, pool: list[list[int]], cfg: FaultsConfig, out: Path):
    """Each prompt's greedy output from a colocated server on this host."""
    spec = ServerSpec(model_path=scenario.model.resolve(), port=30411)
    with SGLangServer(spec, out / "server-colocated-reference.log") as server:
        server.wait_healthy(scenario.servers.startup_timeout_s)
        refs = []
        for prompt in pool:
            body = generate_payload(prompt, cfg.output_tokens, False)
            r = httpx.post(f"{spec.url}/generate", json=body, timeout=300)
            r.raise_for_status()
            refs.append(r.json()["output_ids"])
    return refs


def token_damage(got: list[int], ref: list[int]) -> tuple[int, int]:
    """(tokens lost, tokens duplicated or foreign) of a completed stream against its
    reference: what a diff must delete from the reference and insert into it."""
    lost = extra = 0
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(a=ref, b=got, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            lost += a1 - a0
        if op in ("insert", "replace"):
            extra += b1 - b0
    return lost, extra


def summarize(fault: Fault, window: FaultWindow, outcomes: list[Outcome], refs) -> dict:
    done = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if o.error]
    hangs = [o for o in outcomes if o.hang]
    damage = [token_damage(o.tokens, refs[o.prompt]) for o in done]
    exact = sum(1 for lost, extra in damage if lost == extra == 0)
    # An error's delay: from the fault's start (or the request's, if it came later).
    error_delays = [o.ended - max(o.started, window.started) for o in failed]
    after = sorted(
        (o for o in done if o.started >= window.ended and o.tokens == refs[o.prompt]),
        key=lambda o: o.ended,
    )
    recover = after[0].ended - window.ended if after else None
    row = {
        "system": outcomes[0].system if outcomes else "",
        "fault": fault.name,
        "what": fault.what,
        "fault_s": round(window.ended - window.started, 2),
        "requests": len(outcomes),
        "completed": len(done),
        "token_exact": exact,
        "tokens_lost": sum(lost for lost, _ in damage),
        "tokens_duplicated": sum(extra for _, extra in damage),
        "failed": len(failed),
        "hangs": len(hangs),
        "slowest_error_s": round(max(error_delays), 2) if error_delays else None,
        "recover_s": round(recover, 2) if recover is not None else None,
        "errors": sorted({o.error for o in failed})[:10],
        "note": window.note,
    }
    row["meets_targets"] = (
        not hangs
        and row["tokens_lost"] == row["tokens_duplicated"] == 0
        and exact == len(done)
        and (not error_delays or max(error_delays) <= ERROR_WITHIN_S)
        and recover is not None
        and recover <= RECOVER_WITHIN_S
    )
    return row


def run_system(
    scenario: Scenario, system: str, out: Path, pool, refs, cfg: FaultsConfig, console
) -> list[dict]:
    rows = []
    with Deployment(scenario, system, out / system, NET_NAME) as d:
        driver = Driver(d.router_url, pool, cfg, system)
        for fault in FAULTS:
            if fault.systems and system not in fault.systems:
                continue
            console.print(f"{system}: {fault.what}")
            window = FaultWindow()
            driver.start(fault.name)
            time.sleep(cfg.at_s)
            try:
                fault.inject(d, window)
                time.sleep(cfg.recover_s)
            finally:
                driver.stop()
            if d.problems():
                raise FaultError(f"{system} after {fault.name}: " + "; ".join(d.problems()))
            mine = [o for o in driver.outcomes if o.fault == fault.name]
            rows.append(summarize(fault, window, mine, refs))
        lines = "".join(json.dumps(asdict(o)) + "\n" for o in driver.outcomes)
        write_atomic(out / system / "requests.jsonl", lines)
    return rows


COLUMNS = {  # summary key → short heading, so the table fits a terminal
    "system": "system",
    "fault": "fault",
    "requests": "req",
    "completed": "done",
    "token_exact": "exact",
    "tokens_lost": "lost",
    "tokens_duplicated": "dup",
    "failed": "failed",
    "hangs": "hangs",
    "slowest_error_s": "err s",
    "recover_s": "recover s",
    "meets_targets": "ok",
}


def table(rows: list[dict]) -> Table:
    t = Table(
        title="fault matrix (targets: 0 hangs, 0 tokens lost or duplicated, errors "
        f"within {ERROR_WITHIN_S:g} s, recovery within {RECOVER_WITHIN_S:g} s)"
    )
    for heading in COLUMNS.values():
        t.add_column(heading, no_wrap=True)
    for r in rows:
        t.add_row(*("-" if r[c] is None else str(r[c]) for c in COLUMNS))
    return t


def run(
    scenario: Scenario, out: Path, console: Console, cfg: FaultsConfig | None = None
) -> list[dict]:
    cfg = cfg or FaultsConfig()
    run_dir = new_run_dir(out, f"faults-{scenario.name}")
    pool = prompt_pool(cfg)
    with console.status("greedy references from a colocated server"):
        refs = references(scenario, pool, cfg, run_dir)
    rows: list[dict] = []
    for system in scenario.systems:
        rows += run_system(scenario, system, run_dir, pool, refs, cfg, console)
        write_atomic(run_dir / "faults.json", json.dumps(rows, indent=2))
    frame = pd.DataFrame(rows)
    write_atomic(run_dir / "faults.csv", frame.drop(columns=["errors"]).to_csv(index=False))
    write_atomic(run_dir / "faults.html", frame.to_html(index=False))
    write_atomic(run_dir / "COMPLETE", "")
    console.print(table(rows))
    console.print(f"fault matrix: {run_dir}")
    return rows


__all__ = ["FAULTS", "Fault", "FaultsConfig", "run", "summarize", "token_damage"]
