"""An installed project (a wheel, not this checkout) finds its scenarios, profiles and
report templates: they ship as package data, and nothing reads them from the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_every_scenario_profile_and_template(tmp_path):
    src = tmp_path / "src"  # built from a copy: the build writes beside its sources
    skip = shutil.ignore_patterns(".venv", "runs", "build", "*.egg-info", "__pycache__", ".*")
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        cwd=src,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("pdd_testbed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"testbed/scenarios/{p.name}" for p in (ROOT / "testbed/scenarios").glob("*.yaml")}
    wanted |= {f"capacity/data/{p.name}" for p in (ROOT / "capacity/data").glob("*.yaml")}
    wanted |= {str(p.relative_to(ROOT)) for p in (ROOT / "reports").rglob("*.html.j2")}
    assert len(wanted) > 15 and wanted <= names, sorted(wanted - names)
    assert not any(n.startswith(("tests/", "scenarios/", "profiles/")) for n in names)
