"""Time dilation (emulation mode): servers stand for target chips running a target model.

A scenario's ``emulation:`` block names the target model; each site's servers stand for
``chips_per_server`` chips of the type ``cost.site_accelerators`` gives the site. Its
times (SLA, WAN delay, PDD's time knobs, the workload's pauses) are the target's.
Two factors turn it into what the testbed runs (``for_testbed``):

- **time dilation k**: every forward pass is paced to k x its modelled time (the CPU
  running the tiny model is slower than the chip it stands for), so every other time
  is stretched by k too: WAN delay and jitter x k, WAN rate / k, SLA bounds x k,
  think times x k. Latencies in the run are k x the target's; rates are / k.
- **KV scale**: the tiny model's KV bytes per token stand for the target's; rather
  than padding transfers, the WAN rate is multiplied by tiny/target, so a transfer
  takes the time the target's KV would. Every byte on the wire stays real and the
  userspace link emulator moves no padding (see docs/heterogeneous.md).

Both factors are recorded in ``emulation.json`` and the manifest of every run.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from capacity.pacing import Pacing
from capacity.profiles import devices, models
from protocol.env import Env

MAX_STOP_TIMEOUT_S = 600.0  # the load's end: the longest wait for requests in flight


class EmulationSpec(BaseModel):
    """``emulation:`` in a scenario."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field(..., description="Target model (profiles/models.yaml).")
    chips_per_server: int = Field(8, ge=1, description="Chips each server stands for.")
    dilation: float = Field(
        10.0, ge=1, description="Time dilation k: the testbed runs k times slower."
    )
    calibrate: bool = Field(
        False,
        description="Before the run, measure the CPU's passes under a slice of the load and "
        "choose the dilation every server's passes fit (testbed.bench.calibrate).",
    )
    calibration_requests: int = Field(12, ge=1, description="Requests in the calibration run.")
    calibration_miss_share: float = Field(
        0.025,
        gt=0,
        lt=0.5,
        allow_inf_nan=False,
        description="A calibration slice fits its k while at most this share of every "
        "server's passes of each kind ran late (half the report's 5% faithfulness bound: "
        "a slice is a small sample).",
    )
    calibration_margin: float = Field(
        1.2,
        ge=1,
        allow_inf_nan=False,
        description="A slice proposes the k at which all but calibration_miss_share of "
        "its passes fit, x this margin: where the next slice runs.",
    )
    calibration_rounds: int = Field(
        3,
        ge=1,
        le=6,
        description="At most this many calibration slices. The run uses the first k whose "
        "slice fitted (unless its proposal is clearly lower, when a smaller k is tried); a "
        "slice that did not fit is followed by one at its proposal.",
    )
    calibration_tolerance: float = Field(
        0.15,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="Relative: a proposal this much below a fitted k is worth a round; a "
        "slice that did not fit is followed by one at least this much higher.",
    )
    applied: bool = Field(
        False,
        description="Set by the bench in a run's stored scenario: its times are already "
        "dilated (testbed time). Leave false in scenario files (target time).",
    )

    def check_profiles(self, site_accelerators: dict[str, str]) -> None:
        if self.model not in models():
            raise ValueError(
                f"emulation.model {self.model!r} is not in profiles/models.yaml "
                f"(known: {', '.join(models())})"
            )
        missing = sorted(set(site_accelerators.values()) - set(devices()))
        if missing:
            raise ValueError(
                f"cost.site_accelerators name {missing}, which profiles/devices.yaml does "
                f"not describe (known: {', '.join(devices())}); emulation needs both"
            )


def kv_scale(spec: EmulationSpec, tiny_kv_bytes_per_token: int) -> float:
    """Multiplier on the WAN rate so tiny-model KV takes the target KV's time."""
    return tiny_kv_bytes_per_token / models()[spec.model].kv_bytes_per_token


def for_testbed(scenario, tiny_kv_bytes_per_token: int):
    """The scenario in testbed time; unchanged without emulation (or if applied)."""
    spec = scenario.emulation
    if spec is None or spec.applied:
        return scenario
    k, scale = spec.dilation, kv_scale(spec, tiny_kv_bytes_per_token)
    wan = scenario.network.wan
    data = scenario.model_dump()
    data["emulation"]["applied"] = True
    data["network"]["wan"].update(
        rate_mbit=wan.rate_mbit * scale / k if wan.rate_mbit else wan.rate_mbit,
        delay_ms=wan.delay_ms * k,
        jitter_ms=wan.jitter_ms * k,
    )
    for event in data["network"]["wan_schedule"]:  # its times and rates, likewise
        event.update(at_s=event["at_s"] * k, for_s=event["for_s"] * k)
        if event.get("rate_mbit") is not None:
            event["rate_mbit"] *= scale / k
    data["sla"].update(ttft_s=_times(scenario.sla.ttft_s, k), itl_s=_times(scenario.sla.itl_s, k))
    pdd = data["pdd"]
    pdd["direct_wan_bound_s"] *= k
    pdd["settle_timeout_s"] *= k
    pdd["turn_wait_s"] *= k
    pdd["rld_step_s"] *= k
    data["servers"]["kv_idle_timeout_s"] *= k
    data["servers"]["kv_late_leg_s"] *= k
    data["servers"]["handoff_park_timeout_s"] *= k
    data["servers"]["kv_pool_reuse_s"] *= k
    data["servers"]["http_keep_alive_s"] *= k
    data["workload"]["rate_rps"] /= k  # an open loop's rate, in testbed time
    data["workload"]["request_timeout_s"] *= k
    stop = data["workload"]["stop_timeout_s"]  # requests in flight at the end, likewise
    data["workload"]["stop_timeout_s"] = max(stop, min(stop * k, MAX_STOP_TIMEOUT_S))
    if scenario.workload.trace is not None:  # a trace file's arrivals and pauses
        data["workload"]["time_scale"] *= k
    else:
        generator = data["workload"]["generator"]
        generator["time_scale"] = generator.get("time_scale", 1.0) * k
    return type(scenario).model_validate(data)


def _times(value: float | None, k: float) -> float | None:
    return None if value is None else value * k


def record(scenario, tiny_kv_bytes_per_token: int) -> dict:
    """What a run stores about its emulation (empty without one)."""
    spec = scenario.emulation
    if spec is None:
        return {}
    return {
        "model": spec.model,
        "chips_per_server": spec.chips_per_server,
        "dilation": spec.dilation,
        "kv_scaling": "wan_rate",
        "kv_scale": kv_scale(spec, tiny_kv_bytes_per_token),
        "tiny_kv_bytes_per_token": tiny_kv_bytes_per_token,
        "target_kv_bytes_per_token": models()[spec.model].kv_bytes_per_token,
        "site_devices": dict(scenario.cost.site_accelerators),
        "devices": {
            name: devices()[name].model_dump()
            for name in sorted(set(scenario.cost.site_accelerators.values()))
        },
    }


def pacing_env(scenario, site: str, log_path: str) -> tuple[tuple[str, str], ...]:
    """The environment that makes one server of ``site`` pace its passes."""
    spec = scenario.emulation
    if spec is None:
        return ()
    if site not in scenario.cost.site_accelerators:
        raise ValueError(
            f"emulation: site {site!r} has servers but no cost.site_accelerators entry, "
            "so no chip to stand for"
        )
    chip = devices()[scenario.cost.site_accelerators[site]].chip()
    target = models()[spec.model].target()
    pacing = Pacing(chip, target, spec.chips_per_server, spec.dilation, log_path)
    return ((Env.PACING, pacing.to_json()),)
