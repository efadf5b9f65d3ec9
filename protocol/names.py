"""The testbed's nouns, as values that are written to records and read from scenarios."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What an SGLang server does in a system."""

    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"  # a PD baseline's decode
    RELAY_DECODE = "relay_decode"  # PDD: site A, fed over the LAN, streams eager tokens
    MAIN_DECODE = "main_decode"  # PDD: site B, fed over the WAN, decodes to the end

    @property
    def short(self) -> str:
        """The paper's abbreviation (P, RLD, MD, ...)."""
        return _SHORT[self]

    @property
    def launched_as(self) -> Role:
        """The role SGLang itself knows: relay and main decode are decode servers."""
        return Role.DECODE if self in (Role.RELAY_DECODE, Role.MAIN_DECODE) else self


_SHORT = {
    Role.COLOCATED: "C",
    Role.PREFILL: "P",
    Role.DECODE: "D",
    Role.RELAY_DECODE: "RLD",
    Role.MAIN_DECODE: "MD",
}


class Pipeline(StrEnum):
    """The path a request took, as recorded in ``RequestRecord.pipeline``."""

    COLOCATED = "colocated"
    P_D = "P->D"
    P_MD = "P->MD"
    P_RLD_MD = "P->RLD->MD"
    RLD_ONLY = "RLD-only"


class HandoffMode(StrEnum):
    """How a relayed request reached main decode (``RequestRecord.handoff_mode``)."""

    ONE_SHOT = "one-shot"  # every eager token at once; relay decode freed at once
    CATCH_UP = "catch-up"  # batches while relay decode keeps decoding
    NONE = "none"  # relay decode finished the request (MD may settle it afterwards)
    FAILED = "failed"  # MD could not take it over; relay decode's output stands

    @property
    def ended_on_md(self) -> bool:
        return self in (HandoffMode.ONE_SHOT, HandoffMode.CATCH_UP)


class RelayStop(StrEnum):
    """Why the router stopped relay decode after the final handoff
    (``RequestRecord.relay_stop_reason``; :func:`testbed.router.switch.switch_streams`)."""

    CAUGHT_UP = "caught-up"  # main decode held the client's next token
    IN_TIME = "in-time"  # main decode, at its recent pace, would reach it before the queue ran out
    LIMIT = "limit"  # main decode decoded switch_limit_tokens: relay decode's slot is freed
