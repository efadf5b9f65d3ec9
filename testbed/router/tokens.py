"""The served model's tokenizer in the router: text prompts become the token ids the
servers would compute themselves, so a text request gets the same prefix prediction and
the same pipelines (relay included, which hands off token ids) as one sent as ids.

Lifecycle: loaded from the model directory and warmed (an encode and a chat template
applied once) while the router starts, before it accepts requests: loading takes
seconds, and on the first request it held up every request in flight (transformers'
AutoTokenizer, as SGLang loads it); then shared.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path


class RouterTokenizer:
    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model_dir))

    def warm(self) -> None:
        self.encode("warm up")
        if getattr(self.tokenizer, "chat_template", None):
            self.chat([{"role": "user", "content": "warm up"}])

    def encode(self, text: str) -> list[int]:
        """As SGLang's tokenizer manager encodes a prompt (special tokens included)."""
        return list(self.tokenizer([text])["input_ids"][0])

    def chat(self, messages: list[dict]) -> list[int]:
        """A conversation through the model's chat template, ready for the reply."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        return list(ids if isinstance(ids, list) else ids["input_ids"])  # or an encoding

    def decode(self, ids: list[int]) -> str:
        """Output ids as text, as SGLang's detokenizer shows them."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)
