"""Replay a trace against the router with Locust, timing every streamed token.

    locust -f workloads/locustfile.py --host http://ROUTER:8000 --trace TRACE.jsonl
    locust -f workloads/locustfile.py --headless -u 4 -r 4 -t 2m --host ... --trace ... \\
        --records client.jsonl --csv out

Closed loop (default): each user replays whole sessions, turn n+1 after turn n finished
plus its think time. Open loop (``--mode open``): requests leave at their arrival
times (``--speedup`` compresses time). TTFT, inter-token latency, end-to-end latency
and output tokens reach Locust as request events under separate names (``ttft_s``,
``itl_s``, ``e2e_s``, ``output_tokens``), so the web UI and ``--csv`` show each.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid

import gevent
from gevent.lock import Semaphore
from locust import User, events, task
from locust.exception import StopUser

from protocol import headers
from protocol.metrics import Metric
from protocol.records import JsonlWriter
from workloads.client import generate_payload
from workloads.readers import read_trace
from workloads.replay import ClientRecord, SessionState, consume_stream, session_order
from workloads.tokens import TokenSynth


@events.init_command_line_parser.add_listener
def _args(parser):
    parser.add_argument("--trace", default=os.environ.get("PDD_TRACE", ""), help="Trace file")
    parser.add_argument(
        "--trace-format", default="auto", help="auto, pdd, mooncake, azure, tracelab"
    )
    parser.add_argument("--mode", choices=["closed", "open"], default="closed", help="Replay mode")
    parser.add_argument("--speedup", type=float, default=1.0, help="Open loop: time compression")
    parser.add_argument("--vocab-size", type=int, default=4096, help="Token ids are < this")
    parser.add_argument("--token-seed", type=int, default=0, help="Seed of block → token ids")
    parser.add_argument("--max-requests", type=int, default=0, help="Stop after N (0: all)")
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

    @classmethod
    def init(cls, options) -> None:
        with cls.lock:
            if cls.sessions is not None:
                return
            if not options.trace:
                raise ValueError("--trace is required")
            trace = read_trace(options.trace, options.trace_format)
            cls.synth = TokenSynth(options.vocab_size, trace.block_tokens, options.token_seed)
            cls.sessions = iter(session_order(trace))
            cls.sink = JsonlWriter(options.records or None)


def _fire(name: str, metric: Metric, value: float, length: int = 0, exc=None) -> None:
    events.request.fire(
        request_type=metric.value,
        name=name,
        response_time=value * 1000.0,
        response_length=length,
        exception=exc,
        context={},
    )


class TraceUser(User):
    """A client replaying sessions through the router's streaming /generate."""

    def on_start(self) -> None:
        _Shared.init(self.environment.parsed_options)
        import requests

        self.http = requests.Session()
        self.base = self.host.rstrip("/")

    def _budget_left(self) -> bool:
        limit = self.environment.parsed_options.max_requests
        return not limit or next(_Shared.sent) < limit

    def send(self, req, prompt: list[int]) -> tuple[ClientRecord, list[int]]:
        record = ClientRecord(
            request_id=f"{req.request_id}-{uuid.uuid4().hex[:6]}",
            session_id=req.session_id,
            turn=req.turn,
            sent=time.time(),
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
                timeout=900,
            ) as resp:
                if resp.status_code != 200:
                    record.status, record.error = (
                        "error",
                        f"HTTP {resp.status_code}: {resp.text[:300]}",
                    )
                    record.finish = time.time()
                else:
                    output = consume_stream(resp.iter_lines(decode_unicode=True), record)
        except Exception as exc:  # a dead connection is an error row, not a crash
            record.status, record.error, record.finish = "error", repr(exc)[:300], time.time()
        self._report(record)
        _Shared.sink.write(record)
        return record, output

    def _report(self, r: ClientRecord) -> None:
        name = "/generate"
        if r.status != "ok":
            _fire(name, Metric.E2E, (r.finish or time.time()) - r.sent, 0, RuntimeError(r.error))
            return
        _fire(name, Metric.TTFT, r.ttft)
        if r.itls:
            _fire(name, Metric.ITL, sum(r.itls) / len(r.itls))
        _fire(name, Metric.E2E, r.e2e, r.output_tokens)
        _fire(name, Metric.OUTPUT_TOKENS, 0.0, r.output_tokens)

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
        if _Shared.exhausted and _Shared.active == 0 and self.environment.runner is not None:
            # Locust writes --csv stats every second; quitting sooner could drop the
            # last requests from the files.
            gevent.spawn_later(2.5, self.environment.runner.quit)

    def _open_loop(self, options) -> None:
        with _Shared.lock:
            if _Shared.open_loop_started:
                raise StopUser()  # one user drives the open loop
            _Shared.open_loop_started = True
        requests = sorted(
            (r for s in _Shared.sessions for r in s), key=lambda r: r.arrival_s or 0.0
        )
        start = time.time()
        pool = []
        for req in requests:
            if not self._budget_left():
                break
            delay = (req.arrival_s or 0.0) / options.speedup - (time.time() - start)
            if delay > 0:
                gevent.sleep(delay)
            prompt = _Shared.synth.tokens(req.hash_ids, req.input_length)
            pool.append(gevent.spawn(self.send, req, prompt))
        gevent.joinall(pool)
        _Shared.exhausted = True
        self._finish_if_done()
        raise StopUser()
