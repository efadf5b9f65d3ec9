"""What one paced server emulates: ``chips`` x ``chip`` running ``model``, k x slower.

The testbed hands a :class:`Pacing` to a server as JSON in ``Env.PACING``; the pacing
hook (``engine_patches.pacing.hook``) reads it and makes every forward pass take
``dilation`` x its roofline time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from capacity.roofline import Batch, Chip, TargetModel, step_time


@dataclass(frozen=True)
class Pacing:
    chip: Chip
    model: TargetModel
    chips: int = 1
    dilation: float = 1.0
    log_path: str = ""

    def __post_init__(self) -> None:
        if self.chips < 1 or self.dilation <= 0:
            raise ValueError("pacing needs chips >= 1 and dilation > 0")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Pacing:
        data = json.loads(text)
        chip, model = Chip(**data.pop("chip")), TargetModel(**data.pop("model"))
        return cls(chip, model, **data)

    def modelled_seconds(self, batch: Batch) -> float:
        """The pass's time on the target chips."""
        return step_time(batch, self.chip, self.model, self.chips).seconds

    def paced_seconds(self, batch: Batch) -> float:
        """How long the pass is made to take on the testbed."""
        return self.dilation * self.modelled_seconds(batch)
