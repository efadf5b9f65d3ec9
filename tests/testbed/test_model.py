"""testbed model build: deterministic files, KV size, shape validation."""

from __future__ import annotations

import hashlib

import pytest

from testbed import model as model_mod

SMALL = model_mod.ModelShape(
    layers=1,
    hidden_size=64,
    heads=2,
    kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    vocab_size=600,
)


def digest(directory):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_same_shape_and_seed_build_identical_files(tmp_path):
    a = model_mod.build(SMALL, tmp_path / "a")
    b = model_mod.build(SMALL, tmp_path / "b")
    assert digest(a) == digest(b)
    assert "model.safetensors" in digest(a) and "tokenizer.json" in digest(a)


def test_default_shape_has_at_least_8k_of_kv_per_token():
    shape = model_mod.ModelShape()
    assert shape.kv_bytes_per_token >= 8 * 1024
    assert shape.max_context >= 32768


def test_kv_bytes_per_token_follows_the_shape(tmp_path):
    path = model_mod.build(SMALL, tmp_path)
    info = model_mod.describe(path)
    # K and V, 1 layer, 1 KV head of 32 fp32 values.
    assert info["kv_bytes_per_token"] == 2 * 1 * 1 * 32 * 4
    assert info["parameters"] > 0


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(heads=3, kv_heads=2), "multiple of kv_heads"),
        (dict(layers=0), "layers must be positive"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(max_context=4096), "max_context must be >= 32768"),
    ],
)
def test_invalid_shapes_are_refused_with_a_clear_message(bad, message):
    with pytest.raises(ValueError, match=message):
        model_mod.ModelShape(**bad)
