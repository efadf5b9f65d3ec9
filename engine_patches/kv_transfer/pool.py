"""Views of a KV pool's buffers (from ``KVArgs``) as ``[pages, item_len]`` byte tensors.

SGLang's MHA pool is buffers k0..kL-1 then v0..vL-1; page ``p`` of buffer ``b`` is bytes
``[p * item_len[b], (p + 1) * item_len[b])``. The same holds for the metadata (aux)
buffers, one row per request.
"""

from __future__ import annotations

import ctypes
import hashlib

import numpy as np
import torch


def _bytes_at(address: int, size: int) -> torch.Tensor:
    return torch.frombuffer((ctypes.c_uint8 * size).from_address(address), dtype=torch.uint8)


class BufferSet:
    """Row-addressable byte views of several buffers (KV pool or aux buffers)."""

    def __init__(self, ptrs: list[int], lens: list[int], item_lens: list[int]) -> None:
        self.item_lens = list(item_lens)
        self.views = [
            _bytes_at(ptr, length).view(length // item, item)
            for ptr, length, item in zip(ptrs, lens, item_lens, strict=True)
        ]

    @property
    def bytes_per_row(self) -> int:
        return sum(self.item_lens)

    def read(self, rows: np.ndarray) -> list[torch.Tensor]:
        """Contiguous copies of ``rows`` of every buffer (one tensor per buffer)."""
        index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        return [view.index_select(0, index) for view in self.views]

    def write(self, rows: np.ndarray, payload: memoryview) -> None:
        """Write a payload laid out as ``read`` produced it (buffer after buffer)."""
        index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        n, offset = len(rows), 0
        for view, item in zip(self.views, self.item_lens, strict=True):
            size = n * item
            chunk = torch.frombuffer(payload[offset : offset + size], dtype=torch.uint8)
            view.index_copy_(0, index, chunk.view(n, item))
            offset += size


def layout_digest(item_lens: list[int], page_size: int) -> int:
    """Prefill and decode must agree on the KV layout to exchange raw pages."""
    text = f"{page_size}:{','.join(map(str, item_lens))}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")
