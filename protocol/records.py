"""Records written as JSON lines while a run goes, and the one writer and reader.

=====================  ========================  =====================================
record                 written by                file
=====================  ========================  =====================================
``RequestRecord``      the router                ``records.jsonl`` (→ parquet)
``TransferRecord``     each KV transfer's side   ``transfers-<server>.jsonl``
``HandoffRecord``      main decode, per handoff  ``transfers-<server>.jsonl``
``PassRecord``         the pacing hook           ``pacing-<server>.jsonl``
=====================  ========================  =====================================

Times are wall-clock seconds (``protocol.clock.now()``: anchored to the wall clock, advancing
like the monotonic one), the same clock every process on the
host uses, so router, server and transfer logs line up.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class TokenTimes:
    """TTFT, inter-token gaps and end-to-end time of a record with ``token_times``,
    measured from the attribute ``START`` names."""

    START = "arrival"
    first_token: float | None
    finish: float | None
    token_times: list[float]

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - getattr(self, self.START)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - getattr(self, self.START)


# A record's ``fallback`` says this when the router stopped before the record's KV
# transfer was joined (it waited for prefill's answer): its TTFT parts are missing.
CUT_AT_SHUTDOWN = "written at the router's shutdown, before its KV transfer was joined"


@dataclass
class RequestRecord(TokenTimes):
    """One row per request, written by the router — the only thing the report reads."""

    request_id: str
    system: str  # colocated | same_site_pd | cross_site_pd | pdd ...
    endpoint: str  # /generate | /v1/completions | /v1/chat/completions
    session_id: str | None = None
    turn: int | None = None
    pipeline: str = ""  # a protocol.names.Pipeline
    pipeline_reason: str = ""
    prefill_server: str | None = None
    decode_server: str | None = None
    room: int | None = None
    arrival: float = 0.0
    dispatched: float | None = None  # routed and sent on (after the previous turn's alignment)
    prefill_first_byte: float | None = None  # P sent its first KV byte: prefill computed
    # P had computed the whole prompt (queued its last KV chunk). Before its first byte
    # when decode asked for the KV late: a P->MD request decode held back for a prefix
    # on its way, or queued (P computes an early-start room before decode asks).
    prefill_computed: float | None = None
    kv_first_byte: float | None = None  # the first token's decoder: KV first byte received
    kv_end: float | None = None  # ... and the whole KV held
    # ... while the wire idled this long in between, P computing the prompt's later
    # chunks (a chunked prefill sends as it computes; the sender's wait, Done frame)
    kv_sender_wait_s: float | None = None
    wan_first_byte: float | None = None  # main decode's KV over the WAN: first byte received
    wan_end: float | None = None  # ... and all of it
    handoff_extended: float | None = None  # MD finished the final handoff's extend forward
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens_prefill: int | None = None  # prefix hit on P (or the colocated server)
    cached_tokens_decode: int | None = None  # prefix decode already held (decode_prefix_len)
    output_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)  # native /generate only
    eager_tokens: int = 0  # the client got from relay decode (also while MD took over)
    handoff_tokens: int = 0  # token ids sent to main decode (all batches)
    handoff_mode: str | None = None  # a protocol.names.HandoffMode
    handoff_batches: int = 0
    handoff_bytes: int = 0  # handoff frames on the wire (headers included)
    handoff_s: float | None = None  # longest client-visible gap from the final handoff until
    # the switch to main decode is complete (relay decode stopped, main decode caught up)
    handoff_sent: float | None = None  # wall time the final handoff frame left the router
    relay_stopped: float | None = None  # the router stopped relay decode for main decode
    relay_stop_reason: str | None = None  # a protocol.names.RelayStop: why then
    relay_stop_md_behind: int | None = None  # tokens main decode lacked of those the router held
    handoff_mismatch: bool = False  # main decode's echo of the eager tokens differed
    fallback: str | None = None  # why relay decode finished a request meant for MD; or
    # CUT_AT_SHUTDOWN, appended
    predicted_wan_s: float | None = None  # the routing input: the KV's predicted WAN time
    # (its first byte to its last at main decode)
    predicted_kv_span_s: float | None = None  # ... and its span: P's first KV byte out to
    # MD's last in (the first byte's way across, queueing included, then the above)
    wan_queued_bytes: int | None = None  # the prediction's backlog ahead of this transfer
    wan_own_bytes: int | None = None  # the KV bytes predicted (MD's predicted miss)
    wan_goodput_bytes_s: float | None = None  # the prediction's line goodput (bytes/s)
    wan_cwnd_bytes: int | None = None  # the window the model gave its connection
    wan_held_s: float | None = None  # predicted: MD holds it back for a prefix on its way
    wan_held_for: int | None = None  # ... for the transfer of this room
    kv_bytes: int | None = None  # KV payload moved for this request
    kv_wire_bytes: int | None = None
    kv_link: str | None = None  # lan | wan
    kv_transfer_s: float | None = None  # measured: first KV byte to last at the receiver
    kv_span_s: float | None = None  # measured: the sender's first KV byte out to the last in
    kv_cwnd_bytes: int | None = None  # the sender's congestion window at the first KV byte
    kv_retransmits: int | None = None  # segments the sender retransmitted (TransferRecord)
    status: str = "ok"  # ok | error
    error: str | None = None


COLUMNS = [f.name for f in fields(RequestRecord)]


@dataclass
class TransferRecord:
    """One KV transfer as one side saw it: what crossed the wire, when, how it ended."""

    room: int
    side: str  # "prefill" (sender) or "decode" (receiver)
    peer: str
    start: float
    end: float | None = None
    # Decode's side: when the first KV chunk and the Done frame reached its host (the
    # kernel's stamps; read times where it gives none). The sender's: its first chunk left.
    first_byte: float | None = None
    last_byte: float | None = None
    # Decode's side: when the sender's first chunk left, from the Done frame.
    sender_first_byte: float | None = None
    # Both sides: when prefill had computed the prompt (its last chunk queued; the Done
    # frame's ``sender_computed`` on decode's).
    computed: float | None = None
    status: str = "running"  # success | failed
    reason: str | None = None
    pages: int = 0
    kv_bytes: int = 0  # KV page payload
    wire_bytes: int = 0  # every frame, headers included (TCP/IP headers excluded)
    decode_prefix_len: int = 0
    page_size: int = 1
    # Between its first and last chunk, the wire idled this long while the sender waited
    # for prefill to compute (a chunked prefill; a room that offered its cached pages
    # first): the sender's count (from when all it had sent was acknowledged), or on the
    # receiver's line the larger of that and ``wire_gap_s``.
    sender_wait_s: float = 0.0
    # The receiver's own measure of those waits: before each chunk the sender flagged as
    # sent after one, from the last byte before it to its first (kernel arrival stamps).
    wire_gap_s: float = 0.0
    # The sender's TCP connection: its congestion window and slow start threshold when
    # the first chunk left (a window below the bandwidth-delay product costs slow-start
    # round trips; past the threshold, congestion avoidance's slower ones), and the
    # segments it retransmitted (each loss costs about a round trip), and its window and
    # slow start threshold at the end (the connection's next transfer starts there).
    # The decode side has them from the Done frame, so the last round trip's losses and
    # growth are not counted.
    cwnd_bytes: int = 0
    ssthresh_bytes: int = 0  # 0: none yet (in slow start); past it the window grows
    # by one segment a round trip, not doubling
    retransmits: int = 0
    cwnd_end_bytes: int = 0
    ssthresh_end_bytes: int = 0
    # The sender's: the window its Window frame told decode, which decode's pool ranks
    # the connection by; its end window above is read later, once the kernel settled.
    told_cwnd_bytes: int = 0
    # The sender's, across a shared WAN line (servers.kv_line_share): the pacing cap the
    # kernel held its connection to as its first chunk left (bytes/s; 0: none).
    paced_bytes_s: int = 0
    # The sender's, from its first KV byte to decode's Ack (protocol.tcp.Chrono, read
    # again once the Ack came): the time the kernel was sending, held back by decode's
    # receive window, or by the send buffer; the rest of that span it had nothing to
    # send (prefill, the sender's thread).
    busy_s: float = 0.0
    rwnd_limited_s: float = 0.0
    sndbuf_limited_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def wire_end(self) -> float | None:
        """When the wire's part ended: the Done frame's arrival, else the record's end."""
        return self.last_byte or self.end

    @property
    def seconds(self) -> float | None:
        """The wire's time: first KV byte to the last, less the sender's wait for prefill
        (None when no KV moved or it did not end)."""
        if self.end is None or not self.first_byte:
            return None
        return max(0.0, self.wire_end - self.first_byte - self.sender_wait_s)

    @property
    def span_s(self) -> float | None:
        """The KV's time on the line: the sender's first KV byte out (the Done frame's
        stamp) to the receiver's last in, less the sender's wait for prefill — what a
        request waits for the KV past prefill. The receiver's first-to-last time
        (``seconds``) starts at the first byte's arrival, whose delay is one draw of
        the line's jitter (hetero: ±61 ms on 0.1-0.3 s transfers); the last of many
        packets leaves an order-keeping delay line behind the largest of theirs, near
        the jitter's top (None without the sender's stamp, or no end)."""
        if self.end is None or not self.first_byte or not self.sender_first_byte:
            return None
        return max(0.0, self.wire_end - self.sender_first_byte - self.sender_wait_s)


@dataclass
class HandoffRecord:
    """One handoff frame main decode applied (one extend forward at most)."""

    room: int
    tokens: int  # token ids in the frame
    extend_tokens: int  # tokens the forward computed KV for
    frame_bytes: int
    forward_s: float
    next_token: int  # the forward's prediction (-1: no forward)
    expected_next: int  # the last handed-off token: what the forward should agree with
    final: bool
    extend_forwards: int  # forwards so far for this room
    received: float  # the frame arrived on MD's listener
    queued_s: float  # waiting for the scheduler thread
    extended_at: float
    side: str = "handoff"
    time: float = 0.0


@dataclass
class PoolRecord:
    """A change to decode's pool of KV connections to one prefill: a connection checked
    out for ``room``'s transfer (``cwnd_bytes`` 0: a new one) or checked in after it, and
    every connection idle after the change. The router's WAN model mirrors the pool from
    these lines (``testbed.router.wan``)."""

    room: int
    event: str  # "checkout" or "checkin"
    peer: str  # prefill's bootstrap address
    conn: str  # the connection's decode end (ip:port), as prefill's log names its peer
    cwnd_bytes: int  # its sender's window as decode ranks it (0: a new connection)
    ssthresh_bytes: int  # its slow start threshold (0: none)
    # [conn, cwnd_bytes, ssthresh_bytes, idle_s, room] of each connection idle after it
    idle: list[list] = field(default_factory=list)
    time: float = 0.0
    side: str = "pool"

    @property
    def idle_conns(self) -> list[IdleConn]:
        return [IdleConn(*entry) for entry in self.idle]


@dataclass(frozen=True)
class IdleConn:
    """One idle connection of a :class:`PoolRecord`."""

    conn: str
    cwnd_bytes: int
    ssthresh_bytes: int
    idle_s: float  # idle this long when the line was written
    room: int  # the transfer that returned it

    def entry(self) -> list:
        return [self.conn, self.cwnd_bytes, self.ssthresh_bytes, self.idle_s, self.room]


@dataclass
class PassRecord:
    """One paced forward pass of a server (the pacing hook's log)."""

    time: float
    mode: str  # prefill | extend | decode | mixed
    seqs: int
    new_tokens: int
    context: int
    modelled_s: float  # the target chips' time
    paced_s: float  # k x modelled: how long the pass was made to take
    real_s: float  # how long the CPU took
    miss: bool  # real_s > paced_s: the pass ran late


# Which record a line of a server's transfer log is, by its ``side``.
TRANSFER_LOG_SIDES = {
    "prefill": TransferRecord,
    "decode": TransferRecord,
    "handoff": HandoffRecord,
    "pool": PoolRecord,
}


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a result file whole or not at all: a temporary file beside it, renamed
    over it (a reader never sees half a file, a crash leaves no truncated one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


class JsonlWriter:
    """Appends records (dataclasses or dicts) as JSON lines; safe from several threads
    or tasks. With no path, writes nothing."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record) -> None:
        if self.path is None:
            return
        data = asdict(record) if is_dataclass(record) else record
        line = json.dumps(data, separators=(",", ":"))
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Every complete line of a JSON-lines file, parsed. A last line cut short (its
    writer is still at it, or was killed) is skipped quietly; a bad line elsewhere is
    skipped with a warning naming the file and line (the rest of the file still
    counts, and the warning says what did not)."""
    lines = Path(path).read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number != len(lines):
                warnings.warn(f"{path}:{number}: skipped, not a JSON line ({exc})", stacklevel=2)
            continue
        if not isinstance(data, dict):
            warnings.warn(f"{path}:{number}: skipped, not a JSON object", stacklevel=2)
            continue
        yield data


class DamagedFile(ValueError):
    """A stored run's file that cannot be read as what the run wrote (cut short,
    overwritten, edited by hand): named, with what is wrong with it."""


def read_json(path: str | Path, kind: type = object):
    """A JSON file a run wrote, parsed; ``kind`` (dict, list) what it must hold."""
    try:
        data = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(f"{path}: not the JSON a run writes ({exc})") from None
    if not isinstance(data, kind):
        what = {dict: "an object", list: "an array"}.get(kind, kind.__name__)
        raise DamagedFile(f"{path}: not the JSON a run writes ({what} expected)")
    return data


def from_dict(cls: type[T], data: dict) -> T:
    """A record from one parsed line; fields it does not know are left out."""
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def read_records(path: str | Path, cls: type[T] = RequestRecord) -> list[T]:
    return [from_dict(cls, data) for data in read_jsonl(path)]
