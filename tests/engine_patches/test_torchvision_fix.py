"""torchvision imports beside the CPU torch, and the fix is active only where needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_patches.cpu import torchvision_fix


def test_torchvision_imports_in_a_fresh_interpreter():
    # A fresh process goes through the .pth bootstrap, as SGLang's subprocesses do.
    code = "import torchvision, torch; print(torch.version.cuda)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_needed_for_pypi_torchvision_beside_the_cpu_torch():
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA torch: the fix is for CPU-only torch builds")
    assert torchvision_fix.torchvision_is_cuda_build(), "make setup installs PyPI's CUDA build"
    assert torchvision_fix.needed()


def test_inert_when_torchvision_matches_torch(monkeypatch):
    monkeypatch.setattr(torchvision_fix, "torchvision_is_cuda_build", lambda: False)
    monkeypatch.setattr(torchvision_fix, "_library", None)
    assert not torchvision_fix.needed()
    assert torchvision_fix.apply_if_needed() is False
