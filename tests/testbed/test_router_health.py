"""Active health checks on a real router process. The servers here are stand-ins for
SGLang (a few lines of http.server answering /health and a non-streamed /generate):
what is tested is the router's rotation, not generation."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.testbed.router_process import colocated_config, free_port, running_router


class StandIn(BaseHTTPRequestHandler):
    flushed: list[int] = []  # the ports whose cache was flushed

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())
            return
        self.send_response(200 if self.path in ("/health", "/ping") else 404)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        if self.path == "/flush_cache":
            StandIn.flushed.append(self.server.server_address[1])
            self.send_response(200)
            self.end_headers()
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if request.get("stream"):  # two tokens, then the server "dies": connection cut
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for n in (1, 2):
                chunk = {
                    "text": "x" * n,
                    "output_ids": [7] * n,
                    "meta_info": {"completion_tokens": n},
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        body = json.dumps({"text": "x", "output_ids": [7], "meta_info": {"completion_tokens": 1}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def serve(port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def down(url: str) -> dict:
    return httpx.get(url + "/health", timeout=5).json()["down"]


def test_a_dead_server_leaves_rotation_within_2_s_and_returns_when_healthy(tmp_path):
    live, dead = free_port(), free_port()
    config = colocated_config(tmp_path, {"a-dead": dead, "b-live": live})
    stand_in = serve(live)
    revived = None
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(running_router(config, tmp_path))
        stack.callback(lambda: revived and (revived.shutdown(), revived.server_close()))
        started = time.monotonic()
        while "a-dead" not in down(url):
            assert time.monotonic() - started < 2.0, "the dead server is still in rotation"
            time.sleep(0.05)
        # Least-loaded would pick "a-dead" first (ties break by name): every request
        # goes to the live server instead.
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
        for _ in range(5):
            assert httpx.post(url + "/generate", json=body, timeout=10).status_code == 200
        revived = serve(dead)
        started = time.monotonic()
        while "a-dead" in down(url):
            assert time.monotonic() - started < 2.0, "the revived server is still out"
            time.sleep(0.05)
        stand_in.shutdown()
        stand_in.server_close()
        started = time.monotonic()
        while "b-live" not in down(url):
            assert time.monotonic() - started < 2.0
            time.sleep(0.05)
        assert httpx.post(url + "/generate", json=body, timeout=10).status_code == 200
        revived.shutdown()
        revived.server_close()
        revived = None
        while len(down(url)) < 2:
            assert time.monotonic() - started < 4.0
            time.sleep(0.05)
        r = httpx.post(url + "/generate", json=body, timeout=10)
        assert (
            r.status_code == 503 and "no healthy colocated server" in r.json()["error"]["message"]
        )


def test_a_server_dying_mid_stream_ends_the_stream_with_an_error_event(tmp_path):
    """Never a second HTTP response inside the chunked body: the client reads the
    tokens it got, then an SSE error event, then a clean end of the stream."""
    live = free_port()
    config = colocated_config(tmp_path, {"dies": live})
    stand_in = serve(live)
    with running_router(config, tmp_path) as url:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}, "stream": True}
        with httpx.stream("POST", url + "/generate", json=body, timeout=10) as r:
            assert r.status_code == 200
            events = [json.loads(x[5:]) for x in r.iter_lines() if x.startswith("data:")]
        assert [e.get("meta_info", {}).get("completion_tokens") for e in events[:2]] == [1, 2]
        assert "error" in events[-1] and events[-1]["error"]["code"] == 502
        time.sleep(0.3)
        (record,) = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
        assert record["status"] == "upstream_error" and record["output_tokens"] == 2
    stand_in.shutdown()
    stand_in.server_close()


def test_model_info_is_a_servers_and_flush_cache_reaches_every_server(tmp_path):
    ports = [free_port(), free_port()]
    config = colocated_config(tmp_path, {f"s{i}": p for i, p in enumerate(ports)})
    stand_ins = [serve(p) for p in ports]
    with running_router(config, tmp_path) as url:
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "tiny"  # what the server serves, as it says it
        StandIn.flushed.clear()
        r = httpx.post(url + "/flush_cache", timeout=10)
        assert r.status_code == 200 and sorted(StandIn.flushed) == sorted(ports)
        stand_ins[1].shutdown()
        stand_ins[1].server_close()
        r = httpx.post(url + "/flush_cache", timeout=10)
        assert r.status_code == 502 and "s1" in r.json()["error"]["message"]
    stand_ins[0].shutdown()
    stand_ins[0].server_close()
