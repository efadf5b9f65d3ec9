"""The capacity planner: size each design for a trace at a target load, and compare BCR.

From the roofline (capacity/roofline.py), the device and model profiles
and the scenario's SLA and prices, each design of the registry is sized to serve
``plan.target_rps`` of the scenario's trace under the SLA at the lowest hourly cost;
its BCR is then target_rps / cost (every request meets the SLA by construction), and
designs are compared with the same-site homogeneous baseline (PDD.md's cost table).

The model, stated:
- prefill batches chunks of ``chunk_tokens`` across requests; an instance serves
  chunk / (pass time) tokens per second, loaded to at most ``max_utilization``;
  a request's TTFT is its own share of passes, an M/D/1 queueing wait and, where
  the first token waits for the WAN (cross-site PD, PDD's direct P->MD), its KV's
  time on its line;
- decode runs the largest batch whose step fits the ITL bound and whose KV fits the
  memory the weights leave; instances = output tokens per second / batch throughput;
- the trace is sized back up by its generator's ``length_scale`` (a testbed runs a
  scaled-down trace; the plan is for the trace at its full size);
- WAN lines carry the uncached tokens' KV (a decode-side cache holds the rest),
  loaded to at most ``max_utilization``; a request's transfer time is its bytes at
  the line's rate over the spare share of the line;
- PDD: requests whose predicted transfer exceeds ``pdd.direct_wan_bound_s`` go
  through relay decode, which produces the eager tokens that cover the transfer;
  anomalous requests finish on relay decode and send nothing over the WAN.
Instance sizes (chips per instance) and line rates are searched; the cheapest
feasible combination wins.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capacity.roofline import Batch, Chip, TargetModel, step_time
from protocol.names import Role


class PlanSpec(BaseModel):
    """``plan:`` in a scenario."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    target_rps: float = Field(50.0, gt=0, description="Offered load every design is sized for.")
    chunk_tokens: int = Field(8192, ge=1, description="Prefill chunk batched across requests.")
    chips_per_instance: list[int] = Field(
        default_factory=lambda: [8, 16, 32], description="Instance sizes to search."
    )
    wan_lines: dict[float, float] = Field(
        default_factory=lambda: {10.0: 0.2, 25.0: 0.35, 100.0: 1.0},
        description="Line rate (Gbit/s) -> price per line-hour; the options searched.",
    )
    max_utilization: float = Field(0.8, gt=0, lt=1, description="Load cap per instance/line.")
    kv_headroom: float = Field(0.9, gt=0, le=1, description="Share of free memory for KV.")


@dataclass(frozen=True)
class Req:
    """One request at target scale: input tokens, tokens a prefix cache holds, output."""

    n_in: int
    cached: int
    n_out: int
    anomalous: bool = False

    @property
    def uncached(self) -> int:
        return max(self.n_in - self.cached, 1)


@dataclass(frozen=True)
class Device:
    name: str
    chip: Chip
    memory_gb: float
    price: float


@dataclass(frozen=True)
class Inputs:
    requests: tuple[Req, ...]
    model: TargetModel
    devices: dict[str, Device]  # by site
    ttft_s: float
    itl_s: float
    attainment: float
    spec: PlanSpec
    rtt_s: float = 0.0
    direct_wan_bound_s: float = 0.1
    anomalous_finish_on_rld: bool = True

    def device(self, name: str) -> Device:
        return next(d for d in self.devices.values() if d.name == name)

    @property
    def decode_context(self) -> float:
        """Mean context a decode step attends over (input and half the output)."""
        return float(np.mean([r.n_in + r.n_out / 2 for r in self.requests]))

    @property
    def output_tokens_per_s(self) -> float:
        return self.spec.target_rps * float(np.mean([r.n_out for r in self.requests]))


@dataclass
class Pool:
    role: str
    device: str
    instances: int
    chips: int

    @property
    def label(self) -> str:
        return f"{self.instances}x{self.chips} {self.device}"


@dataclass
class Plan:
    design: str
    feasible: bool
    pools: list[Pool] = field(default_factory=list)
    lines: int = 0
    line_gbps: float = 0.0
    cost: float = math.inf
    ttft_attained: float = 0.0
    note: str = ""

    def bcr(self, rps: float) -> float:
        return rps / self.cost if self.feasible else 0.0

    def chips(self, device: str) -> int:
        return sum(p.instances * p.chips for p in self.pools if p.device == device)


# -- building blocks -------------------------------------------------------------------
def prefill_rate(dev: Device, model: TargetModel, chips: int, chunk: int, ctx: float) -> float:
    """Tokens per second one prefill instance computes in full chunks."""
    return chunk / step_time(Batch((chunk,), (int(ctx),)), dev.chip, model, chips).seconds


def holds_weights(dev: Device, model: TargetModel, chips: int, headroom: float = 0.9) -> bool:
    weights = model.parameters_b * 1e9 * model.weight_bytes_per_parameter
    return weights <= headroom * chips * dev.memory_gb * 1e9


@functools.lru_cache(maxsize=1024)
def decode_batch(
    dev: Device, model: TargetModel, chips: int, ctx: float, itl_s: float, headroom: float
) -> tuple[int, float]:
    """(largest batch meeting the ITL bound and fitting in memory, its step time).
    Cached: each design's search asks for the same few (a bisection over batches of up
    to a few hundred thousand sequences, each a roofline pass summed per sequence)."""
    free = chips * dev.memory_gb * 1e9 - model.parameters_b * 1e9 * model.weight_bytes_per_parameter
    by_memory = int(free * headroom / (ctx * model.kv_bytes_per_token)) if free > 0 else 0

    def step(b: int) -> float:
        return step_time(Batch((1,) * b, (int(ctx),) * b), dev.chip, model, chips).seconds

    if by_memory < 1 or step(1) > itl_s:
        return 0, math.inf
    lo, hi = 1, by_memory  # the step grows with the batch: bisect the ITL bound
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step(mid) <= itl_s else (lo, mid - 1)
    return lo, step(lo)


def size_prefill(x: Inputs, dev: Device, chips: int, wan_s: np.ndarray) -> tuple[int, float]:
    """(instances, share of requests meeting the TTFT bound) for the cheapest count."""
    reqs, spec = x.requests, x.spec
    if not holds_weights(dev, x.model, chips):
        return 0, 0.0
    ctx = float(np.mean([r.cached + r.uncached / 2 for r in reqs]))
    rate = prefill_rate(dev, x.model, chips, spec.chunk_tokens, ctx)
    uncached = np.array([r.uncached for r in reqs], dtype=float)
    demand = x.spec.target_rps * uncached.mean()
    own = uncached / rate  # each request's share of passes
    least = max(1, math.ceil(demand / (rate * spec.max_utilization)))
    met = 0.0
    for n in range(least, 4 * least + 1):  # more instances: less queueing
        rho = demand / (rate * n)
        wait = rho * own.mean() / (2 * (1 - rho))  # M/D/1 mean wait
        met = float(np.mean(wait + own + wan_s <= x.ttft_s))
        if met >= x.attainment:
            return n, met
    return 0, met


def size_decode(x: Inputs, dev: Device, chips: int, tokens_per_s: float, ctx: float) -> int:
    if tokens_per_s <= 0:
        return 0
    b, t = decode_batch(dev, x.model, chips, ctx, x.itl_s, x.spec.kv_headroom)
    if b == 0:
        return -1
    return max(1, math.ceil(tokens_per_s / (b / t * x.spec.max_utilization)))


def wan_load(x: Inputs, gbps: float, crossing: np.ndarray) -> tuple[int, np.ndarray]:
    """(lines, per-request transfer seconds) for the KV of the requests that cross."""
    bits = np.array([r.uncached for r in x.requests]) * x.model.kv_bytes_per_token * 8.0
    bits = np.where(crossing, bits, 0.0)
    demand = x.spec.target_rps * bits.mean()
    lines = max(1, math.ceil(demand / (gbps * 1e9 * x.spec.max_utilization)))
    rho = demand / (gbps * 1e9 * lines)
    seconds = np.where(crossing, x.rtt_s + bits / (gbps * 1e9 * (1 - rho)), 0.0)
    return lines, seconds


# -- designs ---------------------------------------------------------------------------
def _cheapest(plans: list[Plan], design: str, why: str) -> Plan:
    feasible = [p for p in plans if p.feasible]
    return min(feasible, key=lambda p: p.cost) if feasible else Plan(design, False, note=why)


def _cost(x: Inputs, pools: list[Pool], lines: int, gbps: float) -> float:
    chips = sum(p.instances * p.chips * x.device(p.device).price for p in pools)
    return chips + (lines * x.spec.wan_lines[gbps] if lines else 0.0)


def plan_same_site(x: Inputs) -> Plan:
    """Same-site homogeneous PD: prefill and decode both on site A's chips."""
    a = x.devices["A"]
    out_tps, ctx = x.output_tokens_per_s, x.decode_context
    plans = []
    for cp in x.spec.chips_per_instance:
        n_p, met = size_prefill(x, a, cp, np.zeros(len(x.requests)))
        for cd in x.spec.chips_per_instance:
            n_d = size_decode(x, a, cd, out_tps, ctx)
            if n_p and n_d > 0:
                pools = [Pool(Role.PREFILL, a.name, n_p, cp), Pool(Role.DECODE, a.name, n_d, cd)]
                plans.append(
                    Plan("same_site_pd", True, pools, cost=_cost(x, pools, 0, 0), ttft_attained=met)
                )
    return _cheapest(plans, "same_site_pd", "no instance size meets the SLA")


def plan_cross_site(x: Inputs) -> Plan:
    """Cross-site PD: decode on site B; the first token waits for the KV on the WAN."""
    a, b = x.devices["A"], x.devices["B"]
    out_tps, ctx = x.output_tokens_per_s, x.decode_context
    plans = []
    for gbps in x.spec.wan_lines:
        lines, wan_s = wan_load(x, gbps, np.ones(len(x.requests), dtype=bool))
        for cp in x.spec.chips_per_instance:
            n_p, met = size_prefill(x, a, cp, wan_s)
            for cd in x.spec.chips_per_instance:
                n_d = size_decode(x, b, cd, out_tps, ctx)
                if n_p and n_d > 0:
                    pools = [
                        Pool(Role.PREFILL, a.name, n_p, cp),
                        Pool(Role.DECODE, b.name, n_d, cd),
                    ]
                    cost = _cost(x, pools, lines, gbps)
                    plans.append(Plan("cross_site_pd", True, pools, lines, gbps, cost, met))
    return _cheapest(plans, "cross_site_pd", "TTFT bound not met with the KV on the WAN")


def plan_pdd(x: Inputs) -> Plan:
    """PDD: P and RLD on site A, MD on site B; RLD masks the WAN with eager tokens."""
    a, b = x.devices["A"], x.devices["B"]
    reqs = x.requests
    anomalous = np.array([r.anomalous and x.anomalous_finish_on_rld for r in reqs])
    n_out = np.array([r.n_out for r in reqs], dtype=float)
    ctx = x.decode_context
    plans = []
    for gbps in x.spec.wan_lines:
        lines, wan_s = wan_load(x, gbps, ~anomalous)
        relayed = wan_s > x.direct_wan_bound_s
        direct_wait = np.where(relayed, 0.0, wan_s)  # P->MD: the first token waits
        eager = np.where(relayed, np.minimum(n_out, np.ceil(wan_s / x.itl_s)), 0.0)
        eager = np.where(anomalous, n_out, eager)
        rld_tps = x.spec.target_rps * eager.mean()
        md_tps = x.spec.target_rps * (n_out - eager).mean()
        for cp in x.spec.chips_per_instance:
            n_p, met = size_prefill(x, a, cp, direct_wait)
            for cr in x.spec.chips_per_instance:
                n_r = size_decode(x, a, cr, rld_tps, ctx)
                for cd in x.spec.chips_per_instance:
                    n_d = size_decode(x, b, cd, md_tps, ctx)
                    if not n_p or n_r < 0 or n_d < 0:
                        continue
                    pools = [
                        Pool(Role.PREFILL, a.name, n_p, cp),
                        Pool(Role.RELAY_DECODE, a.name, max(n_r, 1), cr),
                        Pool(Role.MAIN_DECODE, b.name, max(n_d, 1), cd),
                    ]
                    cost, note = (
                        _cost(x, pools, lines, gbps),
                        f"{relayed.mean():.0%} via relay decode",
                    )
                    plans.append(Plan("pdd", True, pools, lines, gbps, cost, met, note))
    return _cheapest(plans, "pdd", "no combination meets the SLA")


DESIGNS: dict[str, Callable[[Inputs], Plan]] = {
    "same_site_pd": plan_same_site,
    "cross_site_pd": plan_cross_site,
    "pdd": plan_pdd,
}
BASELINE = "same_site_pd"
# The pools a design may have, in the order tables show them.
POOL_ROLES = (Role.PREFILL, Role.RELAY_DECODE, Role.DECODE, Role.MAIN_DECODE)


def plan_all(x: Inputs) -> list[Plan]:
    return [design(x) for design in DESIGNS.values()]


DEFAULT_MODEL = "1T-moe"  # a scenario without emulation: PDD.md's flagship


def rows(plans: list[Plan], rps: float) -> list[dict]:
    """One row per design, BCR relative to the baseline (PDD.md's cost table)."""
    base = next((p for p in plans if p.design == BASELINE and p.feasible), None)
    out = []
    for p in plans:
        row = {"design": p.design, "feasible": p.feasible}
        for role in POOL_ROLES:
            pool = next((q for q in p.pools if q.role == role), None)
            row[role.value] = pool.label if pool else ""
        row["wan"] = f"{p.lines} x {p.line_gbps:g} Gbit/s" if p.lines else ""
        row["cost_per_hour"] = p.cost if p.feasible else None
        row["ttft_attained"] = p.ttft_attained
        row["bcr"] = p.bcr(rps)
        row["bcr_vs_baseline"] = (
            p.bcr(rps) / base.bcr(rps) - 1 if base is not None and p.feasible else None
        )
        row["note"] = p.note
        out.append(row)
    return out
