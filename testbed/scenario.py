"""Scenario: one validated file saying what to run — network now; servers, workload,
SLA and costs as the testbed grows. Validated before anything starts."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from capacity.plan import PlanSpec
from reports.cost import CostTable
from reports.sla import SLA
from testbed.dilation import EmulationSpec
from testbed.inventory import InventorySpec
from testbed.router.config import PddConfig
from testbed.servers_spec import ServersSpec
from topologies.link import DILATION_SAFE
from topologies.spec import NetworkSpec
from workloads.spec import WorkloadSpec

# Shipped as package data (the checkout's scenarios/ links here); a relative trace path
# in a scenario is read from the project's root, the checkout's top directory.
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# "testbed": the router, Locust and (unless "link" names others) the link emulators


class ScenarioError(ValueError):
    """An invalid or missing scenario; the message lists every problem by field."""


class ModelSpec(BaseModel):
    """Either a model directory, or the shape of a tiny model to build."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    path: Path | None = Field(None, description="A Hugging Face model directory.")
    shape: dict = Field(default_factory=dict, description="ModelShape overrides (tiny model).")

    def resolve(self) -> Path:
        from testbed import model as model_mod

        if self.path is not None:
            if not (self.path / "config.json").exists():
                raise ScenarioError(f"model.path {self.path} has no config.json")
            return self.path
        return model_mod.build(model_mod.ModelShape(**self.shape))


class CostSpec(BaseModel):
    """Prices, and which accelerator each site's servers stand for."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    table: CostTable = Field(
        default_factory=lambda: CostTable(
            accelerators={"GPU-A": 1.0, "GPU-B": 1.25}, wan_line=0.35
        ),
        description="Price per accelerator-hour by type, and per WAN line-hour.",
    )
    site_accelerators: dict[str, str] = Field(
        default_factory=lambda: {"A": "GPU-A", "B": "GPU-B"},
        description="The accelerator type every server of a site counts as.",
    )

    @model_validator(mode="after")
    def _every_site_priced(self) -> CostSpec:
        unpriced = sorted(set(self.site_accelerators.values()) - set(self.table.accelerators))
        if unpriced:
            raise ValueError(
                f"site_accelerators name {unpriced}, which cost.table.accelerators does not "
                f"price (priced: {', '.join(sorted(self.table.accelerators))})"
            )
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(..., description="Short name, used for run directories.")
    description: str = Field("", description="What the scenario shows.")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Topology and links.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="What the servers serve.")
    servers: ServersSpec = Field(default_factory=ServersSpec, description="Server settings.")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="What clients send.")
    sla: SLA = Field(
        default_factory=lambda: SLA(ttft_s=2.0, itl_s=0.1),
        description="TTFT and inter-token bounds, attainment.",
    )
    cost: CostSpec = Field(default_factory=CostSpec, description="Cost table for BCR.")
    pdd: PddConfig = Field(
        default_factory=PddConfig,
        description="PDD's routing and handoff knobs (the WAN rate and KV bytes per token "
        "are taken from the network and the model).",
    )
    systems: list[str] = Field(
        default_factory=lambda: ["colocated", "same_site_pd", "cross_site_pd"],
        description="Systems to compare (see testbed.systems).",
    )
    emulation: EmulationSpec | None = Field(
        None,
        description="Stand for target chips running a target model: paced forward passes "
        "and a dilated network (see testbed.emulation); times here are then the target's.",
    )
    plan: PlanSpec = Field(
        default_factory=PlanSpec, description="The capacity planner's search (testbed plan)."
    )
    inventory: InventorySpec | None = Field(
        None,
        description="Run against servers already running on these hosts (each started "
        "with `testbed serve`) instead of launching them on the emulated network.",
    )
    sweep: dict[str, list] = Field(
        default_factory=dict,
        description="Bench every combination of these values: dotted scenario field → "
        "values, e.g. network.wan.rate_mbit: [25, 100]. Each point is a full scenario.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_path_part(cls, v: str) -> str:
        from testbed.run_dirs import check_name

        return check_name(v, "name")

    @model_validator(mode="after")
    def _ports_distinct(self) -> Scenario:
        ports = {
            "servers.port": self.servers.port,
            "servers.bootstrap_port": self.servers.bootstrap_port,
            "servers.router_port": self.servers.router_port,
            "pdd.handoff_port": self.pdd.handoff_port,
        }
        seen: dict[int, str] = {}
        for field_name, port in ports.items():
            if port in seen:
                raise ValueError(f"{field_name} and {seen[port]} are both port {port}")
            seen[port] = field_name
        return self

    @model_validator(mode="after")
    def _inventory_runs_what_it_can(self) -> Scenario:
        if self.inventory is not None:
            self.inventory.check_scenario(self)
        return self

    @model_validator(mode="after")
    def _network_hosts_every_system(self) -> Scenario:
        """Each system's servers, the router and the client have a host: else the bench
        ran the systems before the one lacking its host, then failed."""
        if self.inventory is not None:
            return self  # its hosts are checked against the systems (check_scenario)
        from testbed.systems import SYSTEMS

        topo = self.network.topo()
        have = {topo.nodeInfo(h).get("role") for h in topo.hosts()}
        for name in self.systems:
            needs = {net_role for _, net_role in SYSTEMS[name].servers} | {"router", "client"}
            if needs - have:
                raise ValueError(
                    f"system {name} needs a host of role {', '.join(sorted(needs - have))}: "
                    f"network.hosts (topology {self.network.topology}) gives none"
                )
        return self

    @model_validator(mode="after")
    def _emulation_profiles_exist(self) -> Scenario:
        if self.emulation is not None:
            self.emulation.check_profiles(self.cost.site_accelerators)
        return self

    @model_validator(mode="after")
    def _emulated_tcp_dilates(self) -> Scenario:
        cc = self.network.wan.congestion_control
        if self.emulation is not None and cc not in DILATION_SAFE:
            raise ValueError(
                f"network.wan.congestion_control {cc!r} does not dilate: under emulation "
                "every time is stretched k times, but cubic's growth and HyStart's delay "
                "thresholds (and BBR's timers) are wall-clock constants, so the WAN would "
                f"carry KV unlike the target's. Use one of {DILATION_SAFE} (per round trip)."
            )
        return self

    @model_validator(mode="after")
    def _sweep_points_valid(self) -> Scenario:
        self.points()  # every combination is a valid scenario, before anything starts
        return self

    def points(self) -> list[tuple[str, Scenario]]:
        """(label, scenario) per sweep point; one unlabelled point without a sweep."""
        if not self.sweep:
            return [("", self)]
        base = self.model_dump(exclude={"sweep"})
        out = []
        for values in itertools.product(*self.sweep.values()):
            data, label = copy.deepcopy(base), []
            for dotted, value in zip(self.sweep, values, strict=True):
                *parents, leaf = dotted.split(".")
                node = data
                for key in parents:
                    if not isinstance(node.get(key), dict):
                        raise ValueError(f"sweep: {dotted!r} is not a scenario field")
                    node = node[key]
                if leaf not in node:
                    raise ValueError(f"sweep: {dotted!r} is not a scenario field")
                node[leaf] = value
                label.append(f"{leaf}-{value}")
            try:
                out.append(("_".join(label), Scenario.model_validate(data)))
            except ValidationError as exc:
                raise ValueError(f"sweep point {label}:\n{format_errors(exc)}") from None
        return out

    @field_validator("systems")
    @classmethod
    def _known_systems(cls, v: list[str]) -> list[str]:
        from testbed.systems import SYSTEMS

        unknown = [s for s in v if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
        return v

    @classmethod
    def load(cls, ref: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
        """From a YAML path, or a name in ``scenarios/``; ``overrides`` are
        ``dotted.field=value`` (the value read as YAML), applied before validation."""
        path = resolve(ref)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: expected a mapping at the top level")
        data.setdefault("name", path.stem)
        for override in overrides:
            apply_override(data, override)
        workload = data.get("workload")
        if isinstance(workload, dict) and isinstance(workload.get("trace"), str):
            trace = Path(workload["trace"])  # relative: to the project's root
            workload["trace"] = str(trace if trace.is_absolute() else PROJECT_ROOT / trace)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ScenarioError(f"{path}: invalid scenario\n{format_errors(exc)}") from exc


def apply_override(data: dict, override: str) -> None:
    """``a.b.c=value`` into a scenario's raw data (``value`` as YAML: 25, true, [1, 2]).
    Intermediate sections are created; the result is validated with the rest."""
    dotted, sep, raw = override.partition("=")
    keys = dotted.strip().split(".")
    if not sep or not all(keys):
        raise ScenarioError(f"--set {override!r}: expected dotted.field=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--set {override!r}: the value is not valid YAML: {exc}") from exc
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {override!r}: {key} is not a section")
        node = child
    node[keys[-1]] = value


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
