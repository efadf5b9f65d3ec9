"""Shared fixtures: the default tiny model, built once per session into a temp cache."""

from __future__ import annotations

import pytest

from testbed import model as model_mod


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The default tiny model; built under the normal cache (reused across runs)."""
    return model_mod.build(model_mod.ModelShape())
