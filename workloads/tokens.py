"""Deterministic token ids from prefix blocks: the same block id always gives the same
tokens, so prefix sharing in a trace is prefix sharing on the server, exactly."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

FIRST_TOKEN = 10  # keep clear of special tokens at the start of small vocabularies


CACHED_BLOCKS = 8192  # the most recently used blocks kept (shared prefixes stay hot)


class TokenSynth:
    def __init__(self, vocab_size: int, block_tokens: int, seed: int = 0) -> None:
        if vocab_size <= FIRST_TOKEN + 1:
            raise ValueError(f"vocab_size {vocab_size} too small")
        self.vocab_size, self.block_tokens, self.seed = vocab_size, block_tokens, seed
        # LRU, bounded: a long replay (a soak) must not grow the load generator's memory
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def block(self, block_id: int) -> np.ndarray:
        tokens = self._cache.get(block_id)
        if tokens is not None:
            self._cache.move_to_end(block_id)
            return tokens
        rng = np.random.default_rng([self.seed, int(block_id)])
        drawn = rng.integers(FIRST_TOKEN, self.vocab_size, self.block_tokens, dtype=np.int64)
        tokens = drawn.astype(np.int32)  # the same ids, half the memory
        self._cache[block_id] = tokens
        if len(self._cache) > CACHED_BLOCKS:
            self._cache.popitem(last=False)
        return tokens

    def tokens(self, hash_ids, length: int | None = None) -> list[int]:
        """The prompt for ``hash_ids``, cut to ``length`` tokens (the last block may be partial)."""
        if not hash_ids:
            return []
        out = np.concatenate([self.block(b) for b in hash_ids])
        return out[: length if length is not None else len(out)].tolist()
