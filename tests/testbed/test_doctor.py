"""``testbed doctor`` against real host agents (``testbed.agent``) on this machine: the
same model and versions pass; another model, a skewed clock and a host that does not
answer are each named in a clear error, and the command exits 1."""

from __future__ import annotations

import shutil
import time

from typer.testing import CliRunner

from testbed.agent import HostAgent
from testbed.cli import app
from testbed.doctor import run


class SkewedAgent(HostAgent):
    """Stands in for a host whose wall clock runs 2 s ahead (a namespace cannot move
    CLOCK_REALTIME): the real agent, answering with its clock shifted."""

    async def _host(self, request):
        from aiohttp import web

        return web.json_response({**self.info, "time_ns": time.time_ns() + 2_000_000_000})


def test_doctor_passes_a_good_host_and_names_each_bad_one(tiny_model, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model, other)
    (other / "config.json").write_text((other / "config.json").read_text() + " ")
    agents = [
        HostAgent({"role": "prefill"}, tiny_model, "127.0.0.1", 30611).start(),
        HostAgent({"role": "main_decode"}, other, "127.0.0.1", 30612).start(),
        SkewedAgent({"role": "relay_decode"}, tiny_model, "127.0.0.1", 30613).start(),
    ]
    try:
        urls = [f"http://127.0.0.1:{p}" for p in (30611, 30612, 30613, 30614)]
        good, wrong_model, skewed, absent = run(urls, tiny_model, max_offset_s=0.05)
        assert good.ok and abs(good.offset_ms) < 50 and good.rtt_ms is not None
        (problem,) = wrong_model.problems
        assert "30612 (main_decode) serves another model" in problem
        (problem,) = skewed.problems
        assert "30613 (relay_decode): clock off by +2" in problem
        assert 1900 < skewed.offset_ms < 2100
        (problem,) = absent.problems
        assert "30614: no host agent answers" in problem
        argv = ["doctor", "--model", str(tiny_model)]
        result = CliRunner().invoke(app, [*argv, "--host", urls[0], "--host", urls[1]])
        assert result.exit_code == 1 and "serves another model" in result.output
        result = CliRunner().invoke(app, [*argv, "--host", urls[0]])
        assert result.exit_code == 0, result.output
    finally:
        for agent in agents:
            agent.stop()
