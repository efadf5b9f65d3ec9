"""Hardware cost and BCR (benefit-cost ratio) = SLA goodput / hardware cost.

Prices are per hour (any currency, the same throughout a table); a deployment counts
accelerators per type and WAN lines. PDD's comparison: 88 × GPU-A in one site against
43 × GPU-A + 32 × GPU-B + one cross-site line.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CostTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    accelerators: dict[str, float] = Field(..., description="Price per accelerator-hour by type.")
    wan_line: float = Field(0.0, ge=0, description="Price per hour of one cross-site line.")

    @model_validator(mode="after")
    def _positive(self) -> CostTable:
        bad = {k: v for k, v in self.accelerators.items() if v <= 0}
        if bad:
            raise ValueError(f"accelerator prices must be positive: {bad}")
        return self


class Hardware(BaseModel):
    """What a system costs: accelerators per type, and WAN lines."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    accelerators: dict[str, int]
    wan_lines: int = 0

    def cost(self, table: CostTable) -> float:
        unknown = set(self.accelerators) - set(table.accelerators)
        if unknown:
            raise ValueError(f"no price for accelerator types {sorted(unknown)}")
        return (
            sum(n * table.accelerators[t] for t, n in self.accelerators.items())
            + self.wan_lines * table.wan_line
        )


def bcr(goodput_rps: float, cost_per_hour: float) -> float:
    """SLA goodput (requests/s) per unit of hourly hardware cost."""
    if cost_per_hour <= 0:
        raise ValueError("cost must be positive")
    return goodput_rps / cost_per_hour


def relative_change(value: float, baseline: float) -> float:
    """(value − baseline) / baseline: +0.375 is PDD's "+37.5%"."""
    if baseline == 0:
        raise ValueError("baseline is zero")
    return (value - baseline) / baseline
