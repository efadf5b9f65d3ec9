"""Peers' load tools against the router, unchanged: AIPerf (``make setup`` installs it in
``.venv-peers``, a venv of its own, never the project's).

AIPerf replays a multi-turn chat dataset (its ``multi_turn`` JSONL: one session per
line, a list of user turns) against the router's ``/v1/chat/completions``, carrying
each conversation's id in our session header and each request's id in ``X-Request-ID``
(which the router keeps as the record's ``request_id``), so its per-request figures
join the router's records one to one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from protocol import headers

PEERS_VENV = Path(__file__).resolve().parent.parent / ".venv-peers"
AIPERF = PEERS_VENV / "bin" / "aiperf"


def multi_turn_dataset(
    path: Path, sessions: int, turns: int, words: int, seed: int = 0
) -> list[list[str]]:
    """Write AIPerf's multi_turn JSONL: ``sessions`` conversations of ``turns`` user
    messages of ``words`` random words each. Returns the messages."""
    rng = random.Random(seed)
    conversations = [
        [" ".join(f"step{rng.randrange(10**6)}" for _ in range(words)) for _ in range(turns)]
        for _ in range(sessions)
    ]
    with open(path, "w") as f:
        for i, conv in enumerate(conversations):
            line = {"session_id": f"s{i}", "turns": [{"text": t} for t in conv]}
            f.write(json.dumps(line) + "\n")
    return conversations


def aiperf_argv(
    url: str,
    tokenizer: Path,
    dataset: Path,
    out_dir: Path,
    sessions: int,
    concurrency: int = 2,
    max_tokens: int = 32,
) -> list[str]:
    """``aiperf profile`` replaying ``dataset`` (``sessions`` conversations, each once,
    in order) against the router at ``url``: streaming chat, greedy, exactly
    ``max_tokens`` tokens per answer, no interactive UI."""
    return [
        str(AIPERF),
        "profile",
        "--model",
        "default",
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--tokenizer",
        str(tokenizer),
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "multi_turn",
        "--conversation-num",
        str(sessions),
        "--dataset-sampling-strategy",
        "sequential",
        "--concurrency",
        str(concurrency),
        "--extra-inputs",
        f"max_tokens:{max_tokens}",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        "temperature:0",
        "--session-header",
        headers.SESSION,
        # Token counts as the server reports them: re-tokenizing a tiny model's random
        # output text does not give its token count back (AIPerf would flag the gap).
        "--use-server-token-count",
        "--random-seed",
        "0",
        "--output-artifact-dir",
        str(out_dir),
        "--ui-type",
        "none",
        # The router has no Prometheus endpoint and the machine no GPU; AIPerf's optional
        # collectors for them only cost CPU, and one that misses its heartbeats on a busy
        # 2-core machine fails the whole run ("result producer died before reporting").
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]


def aiperf_requests(out_dir: Path) -> dict[str, dict]:
    """AIPerf's per-request records (``profile_export.jsonl``), by X-Request-ID: its
    TTFT in seconds, and whether the request failed."""
    out = {}
    with open(out_dir / "profile_export.jsonl") as f:
        for line in f:
            row = json.loads(line)
            meta, metrics = row["metadata"], row.get("metrics") or {}
            ttft = (metrics.get("time_to_first_token") or {}).get("value")
            out[meta["x_request_id"]] = {
                "started": meta["request_start_ns"] / 1e9,  # wall clock, as the router's
                "ttft_s": ttft / 1000 if ttft is not None else None,
                "error": row.get("error"),
                "conversation": meta.get("conversation_id"),
                "turn": meta.get("turn_index"),
            }
    return out
