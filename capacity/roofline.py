"""The modelled time of one forward pass of a target model on a target chip.

A roofline per batch: the pass takes the longer of its compute (FLOPs over the
chips' achieved peak) and its memory traffic (bytes over the chips' achieved
bandwidth). Prefill (many new tokens, little context) comes out compute-bound,
decode (one new token per sequence over a long context) memory-bound, and an extend
(tens of tokens over a long context, PDD's handoff) in between.

Simplifications, stated: FLOPs are 2 per active parameter per token plus attention
(4 x layers x hidden per token per context position); weights are read once per
pass, and for a mixture of experts a batch of n tokens touches the share
1 - (1 - active/total)^n of all weights (each token picks experts independently);
KV is read for every context position and written for every new token; no overlap
or kernel-launch costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    peak_tflops: float
    memory_bandwidth_tbps: float
    mfu: float = 0.5  # achieved share of peak compute
    mbu: float = 0.7  # achieved share of peak bandwidth


@dataclass(frozen=True)
class TargetModel:
    parameters_b: float
    active_parameters_b: float
    layers: int
    hidden_size: int
    kv_bytes_per_token: int
    weight_bytes_per_parameter: float = 1.0


@dataclass(frozen=True)
class Batch:
    """One forward pass: per sequence, the tokens computed now and the context its KV
    already holds (0 for a fresh prefill, the prefix for an extend)."""

    new_tokens: tuple[int, ...]
    context: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.new_tokens) != len(self.context) or not self.new_tokens:
            raise ValueError("a batch needs new_tokens and context for each sequence")


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def step_time(batch: Batch, chip: Chip, model: TargetModel, chips: int = 1) -> StepTime:
    tokens, positions = sum(batch.new_tokens), sum(batch.new_tokens) + sum(batch.context)
    flops = 2 * model.active_parameters_b * 1e9 * tokens
    for n, c in zip(batch.new_tokens, batch.context, strict=True):
        flops += 4 * model.layers * model.hidden_size * n * (c + (n + 1) / 2)
    touched = 1 - (1 - model.active_parameters_b / model.parameters_b) ** tokens
    weight_bytes = model.parameters_b * 1e9 * touched * model.weight_bytes_per_parameter
    kv_bytes = model.kv_bytes_per_token * positions  # context read, new tokens written
    compute_s = flops / (chips * chip.peak_tflops * 1e12 * chip.mfu)
    memory_s = (weight_bytes + kv_bytes) / (chips * chip.memory_bandwidth_tbps * 1e12 * chip.mbu)
    return StepTime(compute_s, memory_s)
