"""Device and target-model profiles (``profiles/*.yaml``), validated, by name."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from capacity.roofline import Chip, TargetModel

PROFILE_DIR = Path(__file__).resolve().parent / "data"  # package data; profiles/ links here


class DeviceProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    peak_tflops: float = Field(..., gt=0, description="Dense BF16 peak per chip.")
    memory_gb: float = Field(..., gt=0)
    memory_bandwidth_tbps: float = Field(..., gt=0)
    interconnect_gbps: float = Field(..., gt=0, description="Chip-to-chip, GB/s.")
    price_per_hour: float = Field(..., gt=0, description="Relative price per chip-hour.")
    mfu: float = Field(0.5, gt=0, le=1, description="Achieved share of peak compute.")
    mbu: float = Field(0.7, gt=0, le=1, description="Achieved share of peak bandwidth.")

    def chip(self) -> Chip:
        return Chip(self.peak_tflops, self.memory_bandwidth_tbps, self.mfu, self.mbu)


class ModelProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    parameters_b: float = Field(..., gt=0)
    active_parameters_b: float = Field(..., gt=0)
    layers: int = Field(..., gt=0)
    hidden_size: int = Field(..., gt=0)
    kv_bytes_per_token: int = Field(..., gt=0)
    weight_bytes_per_parameter: float = Field(1.0, gt=0)

    def target(self) -> TargetModel:
        return TargetModel(**self.model_dump())


@cache
def devices() -> dict[str, DeviceProfile]:
    data = yaml.safe_load((PROFILE_DIR / "devices.yaml").read_text())
    return {name: DeviceProfile(**v) for name, v in data.items()}


@cache
def models() -> dict[str, ModelProfile]:
    data = yaml.safe_load((PROFILE_DIR / "models.yaml").read_text())
    return {name: ModelProfile(**v) for name, v in data.items()}
