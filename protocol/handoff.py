"""Bodies of the token-ID handoff frames (framing: :mod:`protocol.frames`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from protocol.frames import frame_size

FINAL = 0x01
PARK_TIMEOUT_S = 120.0  # a parked request waits this long for its handoff


@dataclass(frozen=True)
class Handoff:
    """Token ids MD lacks, in order; ``final``: MD takes the request over after them."""

    tokens: tuple[int, ...]
    final: bool

    def encode(self) -> bytes:
        ids = np.asarray(self.tokens, dtype=">u4")
        return bytes([FINAL if self.final else 0]) + ids.tobytes()

    @classmethod
    def decode(cls, body: bytes) -> Handoff:
        if not body or (len(body) - 1) % 4 or body[0] & ~FINAL:
            raise ValueError(f"a handoff body of {len(body)} bytes is not flag + 4-byte ids")
        ids = np.frombuffer(body, dtype=">u4", offset=1)
        return cls(tuple(int(t) for t in ids), bool(body[0] & FINAL))

    @staticmethod
    def wire_bytes(n_tokens: int) -> int:
        """A handoff frame's size: fixed header and flag, then 4 bytes per token."""
        return frame_size(1 + 4 * n_tokens)


@dataclass(frozen=True)
class Ready:
    prompt_tokens: int
    decode_prefix_len: int  # prompt tokens MD already held before the transfer

    _FIXED = struct.Struct("!II")

    def encode(self) -> bytes:
        return self._FIXED.pack(self.prompt_tokens, self.decode_prefix_len)

    @classmethod
    def decode(cls, body: bytes) -> Ready:
        return cls(*cls._FIXED.unpack(body))


@dataclass(frozen=True)
class Extended:
    tokens: int  # ids received in the handoff
    extend_tokens: int  # tokens the extend forward computed KV for
    next_token: int  # the forward's own prediction after them (-1: no forward)
    forward_s: float
    final: bool

    _FIXED = struct.Struct("!IIifB")

    def encode(self) -> bytes:
        return self._FIXED.pack(
            self.tokens, self.extend_tokens, self.next_token, self.forward_s, self.final
        )

    @classmethod
    def decode(cls, body: bytes) -> Extended:
        n, ext, nxt, fs, final = cls._FIXED.unpack(body)
        return cls(n, ext, nxt, fs, bool(final))
