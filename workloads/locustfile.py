"""Replay a trace against the router with Locust, timing every streamed token.

    locust -f workloads/locustfile.py --host http://ROUTER:8000 --trace TRACE.jsonl
    locust -f workloads/locustfile.py --headless -u 4 -r 4 -t 2m --host ... --trace ... \\
        --records client.jsonl --csv out

Closed loop (default): each user replays whole sessions, turn n+1 after turn n finished
plus its think time. Open loop (``--mode open``): requests leave at their arrival
times (``--speedup`` compresses time). Each request is one Locust request
(``/generate``, type ``e2e_s``: its end-to-end time, its output tokens as the length);
its TTFT, every inter-token gap and its output tokens are logged beside it under the
types ``ttft_s``, ``itl_s`` and ``output_tokens``, so the web UI and ``--csv`` show
each, while the Aggregated row counts requests once.

Distributed (Locust's own ``--master`` and ``--worker``s): each worker replays its shard
of the sessions (by worker index; a session never spans workers) into its own records
file, ``merge_shards`` joins them afterwards.

Lifecycle: the trace is read at ``test_start`` (a missing or bad ``--trace`` stops the
run there with a clear error and exit code 1); state resets at every ``test_start``,
so the web UI can run a second test; when the trace is done the runner stops (headless:
quits).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import uuid

import gevent
from gevent.lock import Semaphore
from locust import User, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

from protocol import clock, headers
from protocol.metrics import Metric
from protocol.records import JsonlWriter
from workloads.client import generate_payload
from workloads.readers import read_trace
from workloads.replay import (
    ClientRecord,
    SessionState,
    arrival_times,
    consume_stream,
    session_order,
)
from workloads.shards import shard_path
from workloads.tokens import TokenSynth


@events.init_command_line_parser.add_listener
def _args(parser):
    parser.add_argument("--trace", default=os.environ.get("PDD_TRACE", ""), help="Trace file")
    parser.add_argument(
        "--trace-format", default="auto", help="auto, pdd, mooncake, azure, tracelab"
    )
    parser.add_argument("--mode", choices=["closed", "open"], default="closed", help="Replay mode")
    parser.add_argument("--speedup", type=float, default=1.0, help="Open loop: time compression")
    parser.add_argument(
        "--arrival",
        choices=["trace", "poisson", "constant"],
        default="trace",
        help="Open loop: the trace's arrival times, or a Poisson / constant rate",
    )
    parser.add_argument("--rate", type=float, default=1.0, help="Open loop: requests per second")
    parser.add_argument("--vocab-size", type=int, default=4096, help="Token ids are < this")
    parser.add_argument("--token-seed", type=int, default=0, help="Seed of block → token ids")
    parser.add_argument("--max-requests", type=int, default=0, help="Stop after N (0: all)")
    parser.add_argument(
        "--request-timeout", type=float, default=900.0, help="Seconds without a response byte"
    )
    parser.add_argument("--records", default="", help="Per-request client records (JSONL)")


class _Shared:
    """State every user shares: the trace, the session queue, the record sink."""

    lock = Semaphore()
    sessions = None
    synth = None
    sink = None
    sent = itertools.count()
    open_loop_started = False
    active = 0  # sessions being replayed right now
    exhausted = False

    budget = 0  # requests this process may send (0: all of its sessions')

    @classmethod
    def start(cls, options, shard: int = 0, shards: int = 1) -> None:
        """A fresh test: read the trace (this process's shard of its sessions: every
        ``shards``-th from ``shard`` on, so a session never spans processes), reset
        every counter."""
        if not options.trace:
            raise ValueError(
                "--trace is required: a trace file (pdd JSONL/parquet, mooncake, azure, tracelab)"
            )
        trace = read_trace(options.trace, options.trace_format)
        mine = [s for i, s in enumerate(session_order(trace)) if i % shards == shard]
        limit = options.max_requests
        with cls.lock:
            cls.synth = TokenSynth(options.vocab_size, trace.block_tokens, options.token_seed)
            cls.sessions = iter(mine)
            if cls.sink is None:
                cls.sink = JsonlWriter(shard_path(options.records, shard, shards) or None)
            cls.sent = itertools.count()
            cls.budget = limit // shards + (shard < limit % shards) if limit else 0
            cls.open_loop_started, cls.active, cls.exhausted = False, 0, False


PDD_TAB = "pdd"
PDD_ROWS = [  # the PDD tab's table: one row per figure of the router's /pdd/stats
    ("requests", "requests the router finished"),
    ("pipelines", "requests per pipeline"),
    ("statuses", "requests per status"),
    ("wan_kv_wire_bytes", "KV bytes over the WAN"),
    ("handoffs", "handoffs"),
    ("handoff_gap_p50_s", "handoff stream gap P50 (s)"),
    ("handoff_gap_p90_s", "handoff stream gap P90 (s)"),
    ("records_pending", "requests whose record is not yet written"),
]


@events.init.add_listener
def _pdd_tab(environment, **_) -> None:
    """A PDD tab in Locust's web UI (its extension point): the router's live pipeline
    mix, WAN bytes and handoff gaps beside Locust's own charts."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    from flask import request as flask_request

    web_ui.template_args["extendedTabs"] = [{"title": "PDD", "key": PDD_TAB}]
    web_ui.template_args["extendedTables"] = [
        {
            "key": PDD_TAB,
            "structure": [
                {"key": "figure", "title": "Figure"},
                {"key": "value", "title": "Value"},
            ],
        }
    ]

    @web_ui.app.after_request
    def _with_pdd_stats(response):
        if flask_request.path != "/stats/requests" or not environment.host:
            return response
        rows = [
            {"figure": label, "value": str(value)} for label, value in _router_stats(environment)
        ]
        data = {**response.json, "extended_stats": [{"key": PDD_TAB, "data": rows}]}
        response.set_data(json.dumps(data))
        return response


def _router_stats(environment) -> list[tuple[str, object]]:
    import requests

    try:
        stats = requests.get(environment.host.rstrip("/") + "/pdd/stats", timeout=1).json()
    except (requests.RequestException, ValueError) as exc:
        return [("router", f"unreachable: {exc!r}"[:200])]
    return [(label, stats.get(key)) for key, label in PDD_ROWS]


@events.test_start.add_listener
def _start(environment, **_) -> None:
    options, runner = environment.parsed_options, environment.runner
    if isinstance(runner, MasterRunner):
        return  # users run on the workers
    shard, shards = 0, 1
    if isinstance(runner, WorkerRunner):  # distributed: this worker's share of sessions
        shard, shards = runner.worker_index, max(1, int(options.expect_workers or 1))
    try:
        _Shared.start(options, shard, shards)
    except (OSError, ValueError) as exc:
        logging.getLogger("pdd.locust").error("cannot start: %s", exc)
        environment.process_exit_code = 1
        if environment.runner is not None:
            gevent.spawn_later(0, environment.runner.quit)


def _fire(name: str, metric: Metric, value: float, length: int = 0, exc=None) -> None:
    events.request.fire(
        request_type=metric.value,
        name=name,
        response_time=value * 1000.0,
        response_length=length,
        exception=exc,
        context={},
    )


def _log_beside(environment, name: str, metric: Metric, value: float, length: int = 0) -> None:
    """A sample in its own statistics row, outside the Aggregated row (which counts
    requests, each once)."""
    environment.stats.get(name, metric.value).log(value * 1000.0, length)


class TraceUser(User):
    """A client replaying sessions through the router's streaming /generate."""

    def on_start(self) -> None:
        if _Shared.sessions is None:  # the trace could not be read: nothing to do
            raise StopUser()
        import requests

        self.http = requests.Session()
        self.base = self.host.rstrip("/")

    def _budget_left(self) -> bool:
        return not _Shared.budget or next(_Shared.sent) < _Shared.budget

    def send(self, req, prompt: list[int]) -> tuple[ClientRecord, list[int]]:
        record = ClientRecord(
            request_id=f"{req.request_id}-{uuid.uuid4().hex[:6]}",
            session_id=req.session_id,
            turn=req.turn,
            sent=clock.now(),
            prompt_tokens=len(prompt),
            expected_output_tokens=req.output_length,
        )
        sent_headers = {
            headers.SESSION: req.session_id,
            headers.TURN: str(req.turn),
            headers.REQUEST_ID: record.request_id,
        }
        output: list[int] = []
        try:
            with self.http.post(
                f"{self.base}/generate",
                json=generate_payload(prompt, req.output_length, stream=True),
                headers=sent_headers,
                stream=True,
                timeout=self.environment.parsed_options.request_timeout,
            ) as resp:
                if resp.status_code != 200:
                    record.status, record.error = (
                        "error",
                        f"HTTP {resp.status_code}: {resp.text[:300]}",
                    )
                    record.finish = clock.now()
                else:
                    output = consume_stream(resp.iter_lines(decode_unicode=True), record)
        except Exception as exc:  # a dead connection is an error row, not a crash
            record.status, record.error, record.finish = "error", repr(exc)[:300], clock.now()
        self._report(record)
        _Shared.sink.write(record)
        return record, output

    def _report(self, r: ClientRecord) -> None:
        name, env = "/generate", self.environment
        if r.status != "ok":
            _fire(name, Metric.E2E, (r.finish or clock.now()) - r.sent, 0, RuntimeError(r.error))
            return
        _fire(name, Metric.E2E, r.e2e, r.output_tokens)
        _log_beside(env, name, Metric.TTFT, r.ttft)
        for gap in r.itls:  # every inter-token gap: Locust's percentiles are per token
            _log_beside(env, name, Metric.ITL, gap)
        _log_beside(env, name, Metric.OUTPUT_TOKENS, 0.0, r.output_tokens)

    @task
    def replay(self) -> None:
        options = self.environment.parsed_options
        if options.mode == "open":
            self._open_loop(options)
            return
        with _Shared.lock:
            session = next(_Shared.sessions, None)
            if session is None:
                _Shared.exhausted = True
            else:
                _Shared.active += 1
        if session is None:
            self._finish_if_done()
            raise StopUser()
        try:
            self._replay_session(session)
        finally:
            with _Shared.lock:
                _Shared.active -= 1

    def _replay_session(self, session) -> None:
        state = SessionState(_Shared.synth)
        for req in session:
            if not self._budget_left():
                _Shared.exhausted = True
                return
            if req.turn and req.think_time_s:
                gevent.sleep(req.think_time_s)
            prompt = state.prompt_for(req)
            record, output = self.send(req, prompt)
            if record.status != "ok":
                break  # the session cannot go on without this turn's output
            state.done(req, prompt, output)

    def _finish_if_done(self) -> None:
        """The whole trace has been replayed: end the run instead of idling until -t."""
        runner = self.environment.runner
        if _Shared.exhausted and _Shared.active == 0 and runner is not None:
            # Locust writes --csv stats every second; ending sooner could drop the
            # last requests from the files. The web UI's runner stops (another test
            # can follow); a headless one quits.
            options = self.environment.parsed_options
            headless = getattr(options, "headless", False)
            autoquit = getattr(options, "autoquit", -1) != -1  # a bench's web UI: it ends
            done = headless or autoquit or isinstance(runner, WorkerRunner)  # or a shard
            gevent.spawn_later(2.5, runner.quit if done else runner.stop)

    def _open_loop(self, options) -> None:
        with _Shared.lock:
            if _Shared.open_loop_started:
                raise StopUser()  # one user drives the open loop
            _Shared.open_loop_started = True
        requests = sorted(
            (r for s in _Shared.sessions for r in s), key=lambda r: r.arrival_s or 0.0
        )
        times = arrival_times(requests, options.arrival, options.rate, options.token_seed)
        start = clock.now()
        pool = []
        for req, at in zip(requests, times, strict=True):
            if not self._budget_left():
                break
            delay = at / options.speedup - (clock.now() - start)
            if delay > 0:
                gevent.sleep(delay)
            prompt = _Shared.synth.tokens(req.hash_ids, req.input_length)
            pool.append(gevent.spawn(self.send, req, prompt))
        gevent.joinall(pool)
        _Shared.exhausted = True
        self._finish_if_done()
        raise StopUser()
