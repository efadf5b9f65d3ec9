"""Scenario: one validated file saying what to run — network now; servers, workload,
SLA and costs as the testbed grows. Validated before anything starts."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topologies.spec import NetworkSpec

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


class ScenarioError(ValueError):
    """An invalid or missing scenario; the message lists every problem by field."""


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., description="Short name, used for run directories.")
    description: str = Field("", description="What the scenario shows.")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Topology and links.")

    @classmethod
    def load(cls, ref: str | Path) -> Scenario:
        """From a YAML path, or a name in ``scenarios/``."""
        path = resolve(ref)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: expected a mapping at the top level")
        data.setdefault("name", path.stem)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ScenarioError(f"{path}: invalid scenario\n{format_errors(exc)}") from exc


def resolve(ref: str | Path) -> Path:
    path = Path(ref)
    if path.is_file():
        return path
    named = SCENARIO_DIR / f"{ref}.yaml"
    if named.is_file():
        return named
    known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
    raise ScenarioError(f"no scenario {str(ref)!r}: not a file, and not one of: {known}")


def format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  - {where}: {err['msg']}")
    return "\n".join(lines)
