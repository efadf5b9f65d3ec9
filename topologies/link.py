"""LinkSpec: what a link is supposed to be — validated before anything is built."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

CONGESTION_CONTROLS = ("cubic", "bbr", "reno")
# Congestion controls whose every rule counts round trips and bytes, not seconds, so a
# time-dilated WAN (testbed.dilation) runs them as the target would. Cubic's not: its
# window grows with wall-clock time (C t^3), and HyStart leaves slow start when the RTT
# rises 4-16 ms, which a dilated jitter always does (measured at hetero's k = 173: it
# left slow start at 28 segments, where reno doubled on to the pipe).
DILATION_SAFE = ("reno",)


class LinkSpec(BaseModel):
    """One emulated link, the same in both directions.

    ``rate_mbit`` None means unshaped (an RDMA-class LAN: veth through a bridge);
    delay, jitter and loss apply per direction (RTT = 2 × delay).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rate_mbit: float | None = Field(
        None, gt=0, description="Rate limit per direction (Mbit/s); none = unshaped."
    )
    delay_ms: float = Field(0.0, ge=0, description="One-way delay (ms).")
    jitter_ms: float = Field(0.0, ge=0, description="Uniform jitter ± (ms), at most delay_ms.")
    loss_pct: float = Field(0.0, ge=0, le=100, description="Random loss per direction (%).")
    mtu: int = Field(1500, ge=576, le=65535, description="MTU of the link's interfaces.")
    queue_packets: int = Field(1000, ge=1, description="Queue limit at the rate limiter (packets).")
    congestion_control: str = Field(
        "cubic",
        description=f"TCP congestion control on the hosts: one of {CONGESTION_CONTROLS}. "
        "Set explicitly: BBR (some kernels' default) ignores random loss.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> LinkSpec:
        if self.jitter_ms > self.delay_ms:
            raise ValueError(
                f"jitter_ms ({self.jitter_ms}) cannot exceed delay_ms ({self.delay_ms})"
            )
        if self.congestion_control not in CONGESTION_CONTROLS:
            raise ValueError(
                f"congestion_control must be one of {CONGESTION_CONTROLS}, "
                f"got {self.congestion_control!r}"
            )
        return self

    @property
    def impaired(self) -> bool:
        """Whether anything must be emulated on this link."""
        return bool(self.rate_mbit or self.delay_ms or self.loss_pct)

    @property
    def rtt_ms(self) -> float:
        return 2 * self.delay_ms

    @property
    def expected_rtt_mdev_ms(self) -> float:
        """Std-dev of RTT with independent uniform ±j jitter each way: j·√(2/3)."""
        return self.jitter_ms * math.sqrt(2 / 3)

    @property
    def expected_rtt_iqr_ms(self) -> float:
        """Interquartile range of RTT with that jitter: the sum of two uniform ±j is
        triangular on ±2j, whose quartiles lie 2j·(1 − 1/√2) from its centre."""
        return 4 * self.jitter_ms * (1 - 1 / math.sqrt(2))

    def mininet_params(self) -> dict:
        """The same link for Mininet (used by ``mn --custom`` runs): a shaped link is a
        ``TCLink`` of its own (``cls``), so it is shaped without ``--link tc``."""
        params: dict = {}
        if self.rate_mbit:
            params["bw"] = self.rate_mbit
        if self.delay_ms:
            params["delay"] = f"{self.delay_ms}ms"
        if self.jitter_ms:
            params["jitter"] = f"{self.jitter_ms}ms"
        if self.loss_pct:
            params["loss"] = self.loss_pct
        if self.rate_mbit:
            params["max_queue_size"] = self.queue_packets
        if params:
            from mininet.link import TCLink

            params["cls"] = TCLink
        return params
