"""Run directories: a bench that fails before it writes anything leaves none behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed.run_dirs import dropped_if_left_empty, new_run_dir


def test_a_bench_refused_before_it_wrote_anything_leaves_no_run_directory(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "bench", "default", "--out", str(tmp_path / "runs")]
        + ["--set", f"workload.trace={missing}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    said = " ".join((out.stdout + out.stderr).split())  # the console wraps long lines
    assert f"workload.trace {missing} does not exist" in said
    assert not list((tmp_path / "runs").glob("bench-*"))  # nothing to pass for a run


def test_a_run_directory_with_a_file_in_it_is_kept_whatever_happened(tmp_path):
    with pytest.raises(RuntimeError), dropped_if_left_empty(new_run_dir(tmp_path, "r")) as run:
        (run / "point").mkdir()
        raise RuntimeError("before anything was written")
    assert not list(tmp_path.iterdir())
    with pytest.raises(RuntimeError), dropped_if_left_empty(new_run_dir(tmp_path, "r")) as run:
        (run / "records.jsonl").write_text("{}\n")
        raise RuntimeError("after")
    assert (run / "records.jsonl").exists()
