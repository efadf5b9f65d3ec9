"""How much CPU and memory each process of a deployment uses: the testbed's own
processes (link emulators, router, Locust) beside the servers, so a reader can see
whether they ate into a server's core (read from /proc with psutil just before the
deployment stops), and how their memory grows over a soak."""

from __future__ import annotations

import os
import time

import psutil

from topologies.netns import pids_in
from topologies.priority import priority_argv


def mark(net) -> dict:
    """Every process's CPU seconds now, by pid, and when: the baseline from which
    ``processes`` measures the load's window."""
    return {"time": time.time(), "cpu_s": {r["pid"]: r["cpu_s"] for r in processes(net)}}


def processes(net, since: dict | None = None) -> list[dict]:
    """Every process in the network's namespaces: host, what it is, its CPUs, its CPU
    seconds so far and its share of one CPU since it started; with ``since`` (a
    ``mark``), also its CPU seconds and share from then (``load_cpu_s``,
    ``load_share``): over its life, start-up (imports, model load, warm-up) counts
    too, about 10 s of CPU for each SGLang process whatever the load."""
    rows, now = [], time.time()
    for host in net.hosts + _gateways(net):
        for pid in pids_in(net.ns(host)):
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    t = p.cpu_times()
                    rows.append(
                        {
                            "host": host,
                            "pid": pid,
                            "process": describe(p.cmdline()),
                            "cpus": sorted(p.cpu_affinity()),
                            "nice": p.nice(),
                            "cpu_s": t.user + t.system,
                            "wall_s": now - p.create_time(),
                            "created": p.create_time(),
                        }
                    )
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    for r in rows:
        r["share"] = r["cpu_s"] / r["wall_s"] if r["wall_s"] > 0 else 0.0
        created = r.pop("created")
        if since is not None:  # a process started after the mark counts from its start
            wall = now - max(since["time"], created)
            r["load_cpu_s"] = r["cpu_s"] - since["cpu_s"].get(r["pid"], 0.0)
            r["load_share"] = r["load_cpu_s"] / wall if wall > 0 else 0.0
    return rows


def memory(net) -> list[dict]:
    """Every process in the network's namespaces: host, pid, what it is, its RSS."""
    rows = []
    for host in net.hosts + _gateways(net):
        for pid in pids_in(net.ns(host)):
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    rss = p.memory_info().rss
                    what = describe(p.cmdline())
                rows.append({"host": host, "pid": pid, "process": what, "rss": rss})
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return rows


def describe(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for needle, name in (
        ("sglang::scheduler", "SGLang scheduler"),
        ("sglang::detokenizer", "SGLang detokenizer"),
        ("sglang.launch_server", "SGLang HTTP server"),
        ("testbed.router", "router"),
        ("emulation.delayd", "link emulator (delayd)"),
        ("locust", "Locust"),
    ):
        if needle in text:
            return name
    return cmdline[0].rsplit("/", 1)[-1] if cmdline else "?"


def _gateways(net) -> list[str]:
    return [n for n in net.topo.nodes() if n not in net.hosts]


HARNESS_NICE = -5  # the router's and Locust's priority (servers and link daemons: 0)


def harness_priority() -> list[str]:
    """The prefix that starts a harness process (router, Locust) above the servers'
    priority, so a decoder busy on a shared core does not delay the moments it stamps
    (measured: the harness's median share of TTFT was 5.0% at equal priority). It uses
    little CPU, so the servers lose next to nothing. Unprivileged: equal priority."""
    if os.geteuid() != 0:
        return []
    return priority_argv(HARNESS_NICE, [])
