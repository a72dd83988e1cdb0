"""Tokenizers for text inputs: the built-in byte-level one and Hugging Face ``tokenizer.json`` files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .errors import UsageError
from .manifest import Tokenizer

__all__ = ["TextTokenizer", "ByteTokenizer", "HFTokenizer", "load_tokenizer"]


class TextTokenizer(Protocol):
    """What packing needs from a tokenizer."""

    info: Tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOS = 256, vocabulary 257. Needs no download."""

    info = Tokenizer(name="bytes", vocab_size=257, eos_id=256)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16) for t in texts]


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``."""

    def __init__(self, path: str, eos_token: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:
            raise UsageError("a tokenizer.json needs the 'tokenizers' extra: pip install 'ferry[tokenizers]'") from exc
        try:
            self._tok = _HF.from_file(path)
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exception subclasses
            raise UsageError(f"cannot load tokenizer {path}: {exc}") from exc
        eos_id = None
        candidates = [eos_token] if eos_token else ["</s>", "<|endoftext|>", "<eos>", "[SEP]", "<|end_of_text|>"]
        for tok in candidates:
            if tok is not None and self._tok.token_to_id(tok) is not None:
                eos_id = self._tok.token_to_id(tok)
                break
        if eos_token and eos_id is None:
            raise UsageError(f"EOS token {eos_token!r} is not in the vocabulary of {path}")
        self.info = Tokenizer(name=path.rsplit("/", 1)[-1], vocab_size=self._tok.get_vocab_size(), eos_id=eos_id)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]


def load_tokenizer(spec: str, eos_token: str | None = None) -> TextTokenizer:
    """``"bytes"`` for the built-in tokenizer, else a path to a ``tokenizer.json``."""
    if spec == "bytes":
        return ByteTokenizer()
    return HFTokenizer(spec, eos_token)
