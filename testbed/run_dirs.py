"""Run directories: a fresh one per run, never reused, named from a checked name."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str, what: str = "name") -> str:
    """A name that becomes part of a path: letters, digits, '_', '-', '.'; no '..'."""
    if not NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{what} {name!r}: 1-64 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit (it names run directories)"
        )
    return name


def new_run_dir(parent: Path, stem: str) -> Path:
    """``parent/stem-YYYYmmdd-HHMMSS``, created now; a run started in the same second
    gets ``-2``, ``-3``... rather than sharing (and overwriting) a directory."""
    base = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory named {base}-N in {parent}")


@contextmanager
def dropped_if_left_empty(run_dir: Path) -> Iterator[Path]:
    """``run_dir`` for a run that may fail before it writes anything (a trace that is
    not there, a model that does not load): then no empty directory is left behind to
    pass for a run. One with any file in it is kept, whatever happened."""
    try:
        yield run_dir
    except BaseException:
        if run_dir.is_dir() and not any(p.is_file() for p in run_dir.rglob("*")):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
