"""The load of a bench: Locust in the topology's client hosts, one process or Locust's
own master and workers (``workload.workers``), each worker in a client host of its own
where the topology has enough (round robin otherwise).

Lifecycle: ``Load(...).start()`` → ``poll()`` until the master (or the single process)
exits → ``finish()``: the workers are stopped and their records merged into
``client.jsonl`` (every request once, or an error), and the CPU seconds of every Locust
process (each under :mod:`workloads.cpu_meter`) go to ``locust_cpu.json`` (the
harness's cost in the report) —
``stop()`` ends everything early.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testbed.cpu_share import harness_priority
from testbed.workload_cli import LOCUSTFILE, locust_argv
from workloads.shards import merge_shards, shard_path

MASTER_PORT = 5557


class Load:
    def __init__(
        self, net, router_url: str, trace: Path, workload, out: Path, ui_port: int | None = None
    ) -> None:
        """``ui_port``: run with Locust's web UI there (it starts and quits by itself)."""
        self.net, self.out, self.workers = net, Path(out), workload.workers
        self.clients = net.hosts_with_role("client")
        argv = locust_argv(router_url, trace, workload, self.out)
        self.ui_url = None
        if ui_port is not None:
            argv.remove("--headless")
            argv += ["--autostart", "--autoquit", "5", "--web-host", "0.0.0.0"]
            argv += ["--web-port", str(ui_port)]
            self.ui_url = f"http://{net.address(self.clients[0])}:{ui_port}"
        if self.workers:
            argv += ["--master", "--expect-workers", str(self.workers)]
            argv += ["--master-bind-port", str(MASTER_PORT)]
        self.master_argv = argv
        self.procs: list[subprocess.Popen] = []
        self.logs = []

    @property
    def records(self) -> list[Path]:
        """The files the clients append records to (one per worker when distributed)."""
        main = self.out / "client.jsonl"
        if not self.workers:
            return [main]
        return [Path(shard_path(str(main), i, self.workers)) for i in range(self.workers)]

    def start(self) -> Load:
        self._started = time.monotonic()
        self._spawn(self.clients[0], self.master_argv, self.out / "locust.log")
        master = self.net.address(self.clients[0])
        for i in range(self.workers):
            host = self.clients[(i + 1) % len(self.clients)]
            argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker"]
            argv += ["--master-host", master, "--master-port", str(MASTER_PORT)]
            self._spawn(host, argv, self.out / f"locust-worker{i}.log")
        return self

    def _spawn(self, host: str, argv: list[str], log_path: Path) -> None:
        log = open(log_path, "w")  # noqa: SIM115 - closed in finish/stop
        self.logs.append(log)
        meter = [
            sys.executable,
            "-m",
            "workloads.cpu_meter",
            str(self._meter(len(self.procs))),
            "--",
        ]
        cmd = self.net.exec_argv(host, [*harness_priority(), *meter, *argv])
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))

    def poll(self) -> int | None:
        return self.procs[0].poll()

    @property
    def returncode(self) -> int | None:
        return self.procs[0].returncode

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self.logs:
            log.close()

    def finish(self) -> int:
        """Stop what is left, merge the workers' records; returns the requests."""
        self.stop()
        self._write_cpu()
        if self.workers:
            return merge_shards(self.out / "client.jsonl", self.workers)
        path = self.out / "client.jsonl"
        return sum(1 for _ in open(path)) if path.exists() else 0

    def _meter(self, index: int) -> Path:
        """Where the CPU meter of Locust process ``index`` writes what it used."""
        return self.out / f".locust-cpu-{index}.json"

    def _write_cpu(self) -> None:
        """The CPU of every Locust process (each measured by its own meter: nothing
        else the harness runs meanwhile is counted); one that wrote nothing is named."""
        cpu_s, missing = 0.0, []
        for i in range(len(self.procs)):
            try:
                cpu_s += json.loads(self._meter(i).read_text())["cpu_s"]
                self._meter(i).unlink()
            except (OSError, ValueError, KeyError):
                missing.append(i)
        row = {
            "host": self.clients[0],
            "pid": self.procs[0].pid,
            "process": f"Locust (master and {self.workers} workers)" if self.workers else "Locust",
            "cpus": sorted(os.sched_getaffinity(0)),
            "cpu_s": round(cpu_s, 3),
            "wall_s": time.monotonic() - self._started,
        }
        if missing:
            row["not_measured"] = [f"process {i}: its CPU meter wrote nothing" for i in missing]
        row["share"] = row["cpu_s"] / row["wall_s"] if row["wall_s"] > 0 else 0.0
        (self.out / "locust_cpu.json").write_text(json.dumps([row], indent=2))
