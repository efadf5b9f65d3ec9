"""What the kernel knows about a KV connection: its options, its congestion state, when
it last carried data, and when a segment reached this host.

Stateless helpers over a connected TCP socket (``struct tcp_info`` and socket options,
Linux). Each degrades to "unknown" (0, None) where the kernel does not say, so a
transfer never fails for want of a measurement.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios
import time
from typing import NamedTuple

from protocol import clock

# struct tcp_info (linux/tcp.h) through tcpi_min_rtt: eight u8s, 24 u32s up to
# tcpi_total_retrans, four u64s (pacing rates, bytes acked and received), four u32s.
_TCP_INFO = struct.Struct("8B24I4Q4I")
# ... then data segments in and out, the delivery rate, and the times (us) the kernel
# had data to send: busy (sending), held back by the receiver's window, by the send
# buffer (Linux 4.10+). Time with nothing queued (the application slower than the wire)
# is in none of them.
_TCP_CHRONO = struct.Struct("8B24I4Q4I2I4Q")
_NO_SSTHRESH = 0x7FFFFFFF  # TCP_INFINITE_SSTHRESH: slow start has not ended yet
_INFO_FIELDS = 8 + 24 + 4 + 4  # fields of _TCP_INFO; _TCP_CHRONO has more
_LAST_DATA_SENT, _LAST_ACK_RECV, _MIN_RTT = 8 + 9, 8 + 12, _INFO_FIELDS - 1  # indices into it
_LAST_DATA_RECV = 8 + 11


class Chrono(NamedTuple):
    """Where a sender's time went so far (see ``_TCP_CHRONO``)."""

    busy_s: float = 0.0
    rwnd_limited_s: float = 0.0
    sndbuf_limited_s: float = 0.0

    def since(self, start: Chrono) -> Chrono:
        return Chrono(*(a - b for a, b in zip(self, start, strict=True)))


class TcpState(NamedTuple):
    cwnd_bytes: int = 0  # congestion window: snd_cwnd x snd_mss
    ssthresh_bytes: int = 0  # slow start threshold; 0 while it has none (no loss yet)
    retransmits: int = 0  # segments retransmitted over the connection's life
    chrono: Chrono = Chrono()  # all 0 where the kernel does not say


def _info(sock: socket.socket) -> tuple | None:
    """tcp_info through the chrono times where the kernel has them, else through
    tcpi_min_rtt; None where it says nothing."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_CHRONO.size)
    except OSError:
        return None
    for layout in (_TCP_CHRONO, _TCP_INFO):
        if len(raw) >= layout.size:
            return layout.unpack(raw[: layout.size])
    return None


def idle_since(sock: socket.socket) -> float | None:
    """Seconds the wire has been idle, as the peer sees it, once everything the
    connection sent has been acknowledged; None while some of it is queued or on the
    wire, or where the kernel does not say.

    Seen from the peer, the wire idles from when the last byte reached it until the
    next one will (a one-way delay after it is sent). The last byte reached the peer
    about a one-way delay before its ack came back, so the idle began a round trip
    before that ack (the minimum round trip: the ack's own way has no queue) -- or when
    the last byte left, if that was later. Counting from the last send alone took the
    time those bytes then waited in the line's bottleneck queue off the transfer."""
    try:
        queued = struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0]
    except OSError:
        return None
    info = _info(sock)
    if queued or info is None:
        return None
    sent_ago = info[_LAST_DATA_SENT] / 1000
    acked_ago = info[_LAST_ACK_RECV] / 1000 + info[_MIN_RTT] / 1e6
    return min(sent_ago, acked_ago)


SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent


def unsent_bytes(sock: socket.socket) -> int | None:
    """Bytes given to the connection that the kernel has not sent yet (held by the
    congestion window or its pacing); None where the kernel does not say."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock, SIOCOUTQNSD, b"\0" * 4))[0]
    except OSError:
        return None


def quiet_for(sock: socket.socket) -> float | None:
    """Seconds since data last reached this end of the connection (the kernel's count,
    whatever the application has read of it); None where the kernel does not say."""
    info = _info(sock)
    return None if info is None else info[_LAST_DATA_RECV] / 1000


def wire_idle_from(sock: socket.socket) -> float | None:
    """When (``time.monotonic``) the wire went idle (:func:`idle_since`), if it is."""
    since = idle_since(sock)
    return None if since is None else time.monotonic() - since


def tcp_state(sock: socket.socket) -> TcpState:
    """A connection's congestion state; all 0 where the kernel does not say."""
    info = _info(sock)
    if info is None:
        return TcpState()
    times = Chrono(*(us / 1e6 for us in info[-3:])) if len(info) > _INFO_FIELDS else Chrono()
    info = info[8:]  # the u32 fields after eight u8s
    mss, ssthresh, cwnd, retransmits = info[2], info[17], info[18], info[23]
    ssthresh_bytes = 0 if ssthresh >= _NO_SSTHRESH else min(ssthresh * mss, 2**32 - 1)
    return TcpState(min(cwnd * mss, 2**32 - 1), ssthresh_bytes, retransmits, times)


_CA_STATE, _UNACKED, _BYTES_ACKED = 1, 8 + 4, 8 + 24 + 2  # indices into tcp_info
_CA_OPEN = 0  # TCP_CA_Open: no recovery under way
BUSY_BYTES = 4096  # acknowledged since: more than control frames, a new transfer's data


def settled_state(
    sock: socket.socket, within_s: float | None = None, poll_s: float = 0.02
) -> TcpState:
    """The connection's congestion state once it has had ``within_s`` to settle after a
    transfer, while it carries nothing new: the kernel undoes a window cut it finds
    spurious (a retransmission the receiver reports as a duplicate, a segment the line
    reordered) only when the reports come back. Read at the transfer's end, 40% of
    default's connections then started their next transfer with a larger window and a
    higher threshold than they had reported (195 KB / 186 KB at the end, 267 KB and no
    threshold 0.2 s later). The last reading while the connection is idle and out of
    recovery; the first, if it carries new data at once (a new transfer's state is not
    the old one's end). ``within_s`` by default: eight of its minimum round trips, at
    least 0.2 s and at most 2 s."""
    first = _info(sock)
    state = tcp_state(sock)
    if first is None:
        return state
    if within_s is None:
        within_s = min(2.0, max(0.2, 8 * first[_MIN_RTT] / 1e6))
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        info = _info(sock)
        if info is None or info[_BYTES_ACKED] - first[_BYTES_ACKED] > BUSY_BYTES:
            break  # closed, or a new transfer's data
        if info[_UNACKED]:
            continue  # something in flight: its acks may still move the window
        if info[_CA_STATE] == _CA_OPEN:
            state = tcp_state(sock)
    return state


def configure_socket(sock: socket.socket, idle_timeout: float) -> None:
    """No Nagle; and a dead path (a cut WAN) is detected within ~``idle_timeout``,
    whether data is in flight (TCP_USER_TIMEOUT) or the connection is idle (keepalive)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(idle_timeout / 3)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(idle_timeout / 6)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(idle_timeout * 1000))


SO_MAX_PACING_RATE = 47  # Linux's, not in Python's socket module


def enable_pacing(sock: socket.socket) -> None:
    """Have the kernel pace this TCP socket's sends (its internal pacing, at about twice
    cwnd / srtt in slow start and 1.2x in congestion avoidance) instead of sending each
    window as a burst. Any finite ``SO_MAX_PACING_RATE`` turns it on; this one caps
    nothing. Pacing follows the measured round trip, so it dilates with the link."""
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("=Q", 2**63))


def cap_pacing(sock: socket.socket, rate_bytes_s: float) -> None:
    """Pace this TCP socket's sends at no more than ``rate_bytes_s`` (the kernel's
    internal pacing; it takes effect on the bytes not yet sent, mid-transfer too)."""
    rate = max(1, min(int(rate_bytes_s), 2**63))
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("=Q", rate))


def pacing_cap(sock: socket.socket) -> int:
    """The socket's ``SO_MAX_PACING_RATE`` (bytes per second; ~2**64: none; 0 where the
    kernel does not say)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8)
    except OSError:
        return 0
    return struct.unpack("=Q", raw.ljust(8, b"\0"))[0]


# -- when bytes arrived ----------------------------------------------------------------

SO_TIMESTAMPNS = 35  # Linux's (its control messages are SCM_TIMESTAMPNS, the same number)
_TIMESPEC = struct.Struct("=qq")
ARRIVAL_CMSG_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)


def stamp_arrivals(sock: socket.socket) -> None:
    """Have the kernel stamp each segment as it reaches this host, so a reader learns
    when bytes arrived, not when its thread got round to reading them (a decode server's
    receiving thread waits for the interpreter's lock behind the forward pass). The
    kernel turns stamping on in deferred work: segments in the first moments after may
    come unstamped (their readers fall back to the time they read them)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def arrival(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """When (on the records' clock) the bytes a ``recvmsg`` returned reached this host:
    the kernel's stamp of the last segment it read them from (segments that queued
    unread may have been merged, which stamps them with the later one's arrival); None
    without a stamp."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return clock.now() - max(0.0, time.time() - (sec + nsec / 1e9))
    return None
