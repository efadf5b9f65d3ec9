"""``workload:`` in a scenario: what the clients send, and the trace file it becomes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WorkloadError(ValueError):
    """A workload that cannot become a trace (a missing file, bad generator settings)."""


class WorkloadSpec(BaseModel):
    """What the clients send: a trace file, or the agentic generator's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    trace: Path | None = Field(None, description="A trace file (pdd, mooncake, azure, tracelab).")
    format: str = Field("auto", description="Trace format, or auto.")
    generator: dict = Field(default_factory=dict, description="AgenticConfig overrides.")
    mode: str = Field("closed", pattern="^(closed|open)$", description="closed or open loop.")
    users: int = Field(4, ge=1, description="Concurrent Locust users (closed loop: sessions).")
    workers: int = Field(
        0,
        ge=0,
        le=16,
        description="Locust workers (its distributed mode: a master and this many workers, "
        "each replaying its shard of the sessions); 0: one process.",
    )
    duration_s: float = Field(300, gt=0, description="Upper bound on the load's run time.")
    stop_timeout_s: float = Field(
        30,
        ge=0,
        allow_inf_nan=False,
        description="At the load's end, how long requests in flight may finish (dilated "
        "under emulation, at most 600 s in testbed time); those cut are client_cancelled.",
    )
    request_timeout_s: float = Field(
        900,
        gt=0,
        allow_inf_nan=False,
        description="A request fails once this long passes without a byte of its response "
        "(the client's read timeout; dilated under emulation, as every time is).",
    )
    max_requests: int = Field(0, ge=0, description="Stop after this many requests (0: all).")
    first_request: int = Field(
        0,
        ge=0,
        description="Trace file: replay from this request on (the file's order; with "
        "max_requests, a window; a session begun before it is left out whole). Its hits "
        "are what the window's requests share among themselves (workloads.scaling.window).",
    )
    speedup: float = Field(1.0, gt=0, description="Open loop: arrival-time compression.")
    arrival: str = Field(
        "trace",
        pattern="^(trace|poisson|constant)$",
        description="Open loop: the trace's arrival times, or a Poisson or constant rate.",
    )
    rate_rps: float = Field(
        1.0, gt=0, description="Open loop, poisson/constant: requests per second."
    )
    vocab_size: int = Field(4096, gt=11, description="Synthesized token ids stay below this.")
    # A trace file's scaling (workloads.scaling; the generator has its own):
    length_scale: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="Trace file: scale prompt lengths (blocks)."
    )
    output_scale: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Trace file: scale outputs (default: length)."
    )
    time_scale: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="Trace file: scale arrivals and think times."
    )
    max_context_tokens: int | None = Field(
        None, ge=1, description="Trace file: cap prompts (after scaling) at this many tokens."
    )

    @model_validator(mode="after")
    def _window_of_a_file(self) -> WorkloadSpec:
        if self.first_request and self.trace is None:
            raise ValueError("first_request takes a window of a trace file; no trace is given")
        return self

    @property
    def scaling(self):
        from workloads.scaling import Scaling

        return Scaling(
            self.length_scale, self.output_scale, self.time_scale, self.max_context_tokens
        )

    def materialize(self, run_dir: Path) -> Path:
        """The trace file to replay, in the testbed's own format: the given one, or a
        copy in ``run_dir`` where it is another format (Mooncake, Azure, TraceLab) or the
        scenario scales it or takes a window; or a generated one in ``run_dir``."""
        if self.trace is not None:
            if not self.trace.exists():
                raise WorkloadError(f"workload.trace {self.trace} does not exist")
            from workloads.readers import guess_format, read_trace
            from workloads.scaling import scale_trace, window

            try:
                fmt = guess_format(self.trace) if self.format == "auto" else self.format
                if fmt == "pdd" and self.scaling.identity and not self.first_request:
                    return self.trace
                trace = window(read_trace(self.trace, fmt), self.first_request)
                scaled = scale_trace(trace, self.scaling)
            except ValueError as exc:
                raise WorkloadError(f"workload: {exc}") from exc
            path = Path(run_dir) / "trace.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            scaled.to_jsonl(path)
            return path
        from workloads.generator import AgenticConfig, generate

        try:
            config = AgenticConfig(**self.generator)
        except (TypeError, ValueError) as exc:
            raise WorkloadError(f"workload.generator: {exc}") from exc
        path = Path(run_dir) / "trace.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        generate(config).to_jsonl(path)
        return path
