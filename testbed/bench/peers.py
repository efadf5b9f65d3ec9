"""``make bench-peers``: a peer's load tool, SGLang's own ``bench_serving``, against each
PD design of a scenario, side by side on one network: the inter-token latency and the
TTFT its client measures, not what the router records.

Per system (same_site_pd, cross_site_pd, pdd, where the scenario has them): deployment
up → link check → warm-up (as ``make bench``) → ``python -m sglang.bench_serving`` from
the client host, unchanged: its shared-prefix dataset as token ids (groups of prompts
behind one system prompt, so later prompts of a group hit the caches), Poisson arrivals
at a fixed rate → deployment down. Its result line goes to
``RUN/SYSTEM/bench_serving.jsonl``, its output to ``bench_serving.log``, the router's
records of the same requests to ``records.jsonl``; the table, each system's figures
over same_site_pd's, to ``RUN/peers.csv``. A system whose tool failed or did not
complete every request is marked ``INCOMPLETE`` and left out of the table.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from protocol.records import read_records, write_atomic
from testbed.bench.records_wait import wait_for_records
from testbed.bench.run import COMPLETE, INCOMPLETE, NET_NAME, bring_up
from testbed.cpu_share import harness_priority
from testbed.deployment import Deployment
from testbed.run_dirs import new_run_dir
from testbed.scenario import Scenario, ScenarioError

SYSTEMS = ("same_site_pd", "cross_site_pd", "pdd")
BASELINE = "same_site_pd"
# The targets for pdd's stream, as a client sees it (over same_site_pd's).
ITL_P50_MAX, ITL_P99_MAX = 1.2, 2.0
FIGURES = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms")


@dataclass(frozen=True)
class PeerLoad:
    """bench_serving's shared-prefix load: ``groups`` x ``per_group`` prompts."""

    groups: int = 4
    per_group: int = 8
    system_prompt_len: int = 1024
    question_len: int = 128
    output_len: int = 32
    rate: float = 1.0  # requests per second (Poisson)
    seed: int = 0

    @property
    def prompts(self) -> int:
        return self.groups * self.per_group


def bench_serving_argv(router_url: str, tokenizer: Path, load: PeerLoad, out: Path) -> list[str]:
    """The tool as its users run it, against the router."""
    return [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
        "--base-url", router_url, "--tokenizer", str(tokenizer),
        "--dataset-name", "generated-shared-prefix", "--tokenize-prompt",
        "--gsp-num-groups", str(load.groups), "--gsp-prompts-per-group", str(load.per_group),
        "--gsp-system-prompt-len", str(load.system_prompt_len),
        "--gsp-question-len", str(load.question_len), "--gsp-output-len", str(load.output_len),
        "--num-prompts", str(load.prompts), "--request-rate", str(load.rate),
        "--seed", str(load.seed), "--disable-tqdm", "--output-file", str(out),
    ]  # fmt: skip


def run_peers(
    scenario: Scenario,
    out: Path,
    console: Console,
    load: PeerLoad = PeerLoad(),
    systems: list[str] | None = None,
) -> Path:
    if scenario.emulation is not None:
        raise ScenarioError(
            f"scenario {scenario.name} emulates chips with time dilation: a peer's tool "
            "measures wall-clock time, k times the chips'. Run bench-peers on an "
            "undilated scenario (e.g. default)."
        )
    systems = systems or [s for s in SYSTEMS if s in scenario.systems]
    if not systems:
        raise ScenarioError(f"scenario {scenario.name} has none of {', '.join(SYSTEMS)}")
    run_dir = new_run_dir(out, f"peers-{scenario.name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"bench-peers {scenario.name}: {', '.join(systems)}; run directory {run_dir}")
    write_atomic(run_dir / "scenario.json", scenario.model_dump_json(indent=2))
    write_atomic(run_dir / "peer_load.json", json.dumps(asdict(load), indent=2))
    rows = []
    for system in systems:
        try:
            rows.append(run_system(scenario, system, run_dir / system, console, load))
        except BaseException as exc:  # never passed off as complete
            (run_dir / system).mkdir(parents=True, exist_ok=True)
            (run_dir / system / INCOMPLETE).write_text(f"{type(exc).__name__}: {exc}\n")
            if not isinstance(exc, RuntimeError):
                raise
            console.print(f"[red]{system}: {exc}[/red]")
    rows = with_ratios(rows)
    write_csv(run_dir / "peers.csv", rows)
    console.print(table(rows))
    if len(rows) < len(systems):
        raise RuntimeError(f"{len(systems) - len(rows)} system(s) incomplete; see {run_dir}")
    return run_dir


def run_system(scenario: Scenario, system: str, out: Path, console: Console, load: PeerLoad):
    deployment = Deployment(scenario, system, out, NET_NAME)
    try:
        bring_up(deployment, scenario, out, console)
        deployment.mark_cpu()  # cpu.json: each process's share during the tool's load
        row = measure(deployment, out, load, console)
    finally:
        deployment.down()
    write_atomic(out / COMPLETE, f"{load.prompts} requests\n")
    console.print(f"{system}: {row}")
    return row


def measure(deployment: Deployment, out: Path, load: PeerLoad, console: Console) -> dict:
    """bench_serving from the deployment's client host against its router: the tool's
    figures, and the pipelines the router's records of the same requests took."""
    system = deployment.system.name
    result_path = out / "bench_serving.jsonl"
    result_path.unlink(missing_ok=True)
    client = deployment.net.hosts_with_role("client")[0]
    argv = bench_serving_argv(
        deployment.router_url, deployment.scenario.model.resolve(), load, result_path
    )
    started = time.time()
    limit = 120 + 4 * load.prompts / load.rate  # bounded: the tool never hangs the run
    status = f"[bold]{system}[/bold]: bench_serving, {load.prompts} prompts"
    try:
        with console.status(status), open(out / "bench_serving.log", "w") as log:
            done = subprocess.run(
                deployment.net.exec_argv(client, [*harness_priority(), *argv]),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=limit,
            )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{system}: bench_serving ran past {exc.timeout:.0f} s") from None
    wait_for_records(deployment.router_url)  # a relayed one's waits for its WAN leg
    if problems := deployment.problems():
        raise RuntimeError(f"{system}: " + "; ".join(problems))
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(
            f"{system}: bench_serving exited {done.returncode}; see {out}/bench_serving.log"
        )
    result = json.loads(result_path.read_text().splitlines()[-1])
    if result.get("completed") != load.prompts:
        raise RuntimeError(
            f"{system}: bench_serving completed {result.get('completed')} of {load.prompts}"
        )
    records = [r for r in read_records(deployment.records_path) if r.arrival >= started]
    pipelines = Counter(r.pipeline for r in records if r.status == "ok")
    row = {"system": system, "completed": result["completed"], "records": len(records)}
    row |= {k: round(float(result[k]), 1) for k in FIGURES}
    row["pipelines"] = " ".join(f"{p}:{n}" for p, n in sorted(pipelines.items()))
    return row


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each system's ITL and TTFT over the baseline's (when it ran)."""
    base = next((r for r in rows if r["system"] == BASELINE), None)
    for row in rows:
        for k in ("median_itl_ms", "p99_itl_ms", "p99_ttft_ms"):
            ok = base is not None and base[k] > 0
            row[f"{k}_x"] = round(row[k] / base[k], 2) if ok else None
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def table(rows: list[dict]) -> Table:
    t = Table(title=f"bench_serving against each system (x: over {BASELINE})")
    for col in ("system", "TTFT P50", "TTFT P99", "ITL P50", "ITL P90", "ITL P99", "pipelines"):
        t.add_column(col)
    for r in rows:
        pdd = r["system"] == "pdd"  # the targets are pdd's
        t.add_row(
            r["system"],
            f"{r['median_ttft_ms']:.0f} ms",
            f"{r['p99_ttft_ms']:.0f} ms" + _x(r["p99_ttft_ms_x"]),
            f"{r['median_itl_ms']:.0f} ms" + _x(r["median_itl_ms_x"], pdd and ITL_P50_MAX),
            f"{r['p90_itl_ms']:.0f} ms",
            f"{r['p99_itl_ms']:.0f} ms" + _x(r["p99_itl_ms_x"], pdd and ITL_P99_MAX),
            r["pipelines"],
        )
    return t


def _x(ratio: float | None, target: float | bool = False) -> str:
    if ratio is None:
        return ""
    if not target:
        return f" (x{ratio:.2f})"
    mark = "[green]ok[/green]" if ratio <= target else f"[red]> x{target}[/red]"
    return f" (x{ratio:.2f} {mark})"
