"""Deterministic tiny Llama models with a locally trained tokenizer.

No model hub is reachable from the testbed's machines, so the default model is built
here: random weights from a seed, a byte-level BPE tokenizer trained on a synthetic
corpus from the same seed. Same shape and seed → the same files, byte for byte.
Any real Hugging Face model directory can be used in its place.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MANIFEST = "pdd_model.json"
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def default_cache_dir() -> Path:
    return Path(os.environ.get("PDD_CACHE", Path.home() / ".cache" / "pdd-testbed"))


@dataclass(frozen=True)
class ModelShape:
    """Shape of a random-weight Llama; the default has 8 KiB of KV per token."""

    layers: int = 4
    hidden_size: int = 512
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 1024
    vocab_size: int = 4096
    max_context: int = 32768
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.max_context < 32768:
            raise ValueError(f"max_context must be >= 32768, got {self.max_context}")
        if self.vocab_size < 512:
            raise ValueError("vocab_size must be >= 512 (256 byte tokens plus merges)")

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: what one token costs in the KV pool."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def name(self) -> str:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"tiny-llama-{self.layers}l-{self.hidden_size}h-{digest[:8]}"


def _synthetic_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Pseudo-English text: enough variety for BPE merges, identical for a seed."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ing", "er"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    words += ["the", "a", "of", "to", "and", "in", "is", "tool", "call", "result", "user"]
    punct = [".", ",", "?", "!", ":", ";", "\n", " 42", " 7", " (", ")"]
    out = []
    for _ in range(lines):
        n = rng.randint(5, 30)
        text = " ".join(rng.choice(words) for _ in range(n))
        out.append(text[0].upper() + text[1:] + rng.choice(punct))
    return out


def build_tokenizer(shape: ModelShape):
    """Train a byte-level BPE tokenizer of ``shape.vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_synthetic_corpus(shape.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[1],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(shape: ModelShape, tokenizer):
    """Random-weight ``LlamaForCausalLM``; weights drawn from ``shape.seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_context,
        # A wide init keeps greedy logits well separated, so argmax does not flip
        # between two correct fp32 implementations (HF vs SGLang).
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=500000.0,
        dtype=shape.dtype,
    )
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, shape.dtype))
    return model.eval()


def build(shape: ModelShape, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build (or reuse) the model for ``shape``; returns its directory."""
    out = (cache_dir or default_cache_dir()) / "models" / shape.name
    if (out / MANIFEST).exists() and not force:
        return out
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(shape)
    model = build_model(shape, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    manifest = {
        "shape": asdict(shape),
        "parameters": sum(p.numel() for p in model.parameters()),
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "vocab_size": len(tokenizer),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)  # only a complete model ever carries the final name
    return out


def describe(model_dir: Path) -> dict:
    """Parameters and KV bytes per token of any Llama-like model directory."""
    manifest = model_dir / MANIFEST
    if manifest.exists():
        return json.loads(manifest.read_text())
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return {
        "kv_bytes_per_token": 2
        * config["num_hidden_layers"]
        * kv_heads
        * head_dim
        * DTYPE_BYTES.get(dtype, 2),
        "vocab_size": config.get("vocab_size"),
    }


def serving_limits(model_dir: Path) -> tuple[int | None, int | None]:
    """The vocabulary size and context length a model directory's config declares."""
    config = json.loads((model_dir / "config.json").read_text())
    return config.get("vocab_size"), config.get("max_position_embeddings")
