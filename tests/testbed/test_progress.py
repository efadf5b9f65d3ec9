"""The bench's live progress reads the client's records as they are appended (a file
written here by hand stands in for Locust's)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from testbed.bench.progress import LoadProgress


def test_progress_counts_requests_errors_and_ttft_from_appended_lines(tmp_path):
    path = tmp_path / "client.jsonl"
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with LoadProgress(console, "pdd", path, total=4) as p:
        p.update()  # no file yet
        assert p.done == 0
        with open(path, "a") as f:
            f.write(json.dumps({"status": "ok", "sent": 1.0, "first_token": 1.5}) + "\n")
            f.write(json.dumps({"status": "upstream_error", "sent": 2.0}) + "\n")
            f.write('{"status": "ok", "sent": 3.0, "first_tok')  # half a line: not yet
        p.update()
        assert (p.done, p.errors, p.ttfts) == (2, 1, [0.5])
        with open(path, "a") as f:
            f.write('en": 3.25}\n')
        p.update()
        assert p.done == 3 and p.ttfts == [0.5, 0.25]
        task = p.progress.tasks[0]
        assert task.total == 4 and task.completed == 3 and "1 errors" in task.fields["live"]
