"""Tokenizers for text inputs: the built-in byte-level one, Hugging Face ``tokenizer.json`` files and
model directories, and local tiktoken BPE files. None downloads anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..errors import UsageError
from ..format.manifest import Tokenizer

__all__ = ["TextTokenizer", "ByteTokenizer", "HFTokenizer", "TiktokenTokenizer", "load_tokenizer"]


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
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``.

    EOS is ``eos_token`` if given; else, when ``guess``, the first of a few common EOS strings
    in the vocabulary."""

    def __init__(self, path: str, eos_token: str | None = None, *, name: str | None = None, guess: bool = True) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:
            raise UsageError(
                "a tokenizer.json needs the 'tokenizers' extra: pip install 'ferry-data[tokenizers]'"
            ) from exc
        _check_file(path, "tokenizer")
        try:
            self._tok = _HF.from_file(path)
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exception subclasses
            raise UsageError(f"cannot load tokenizer {path}: {exc}") from exc
        # a tokenizer.json may carry the truncation and padding a model was served with: packing
        # keeps every token of every document and adds none
        self._tok.no_truncation()
        self._tok.no_padding()
        eos_id = None
        candidates = [eos_token] if eos_token else _EOS_GUESSES if guess else []
        for tok in candidates:
            if tok is not None and self._tok.token_to_id(tok) is not None:
                eos_id = self._tok.token_to_id(tok)
                break
        if eos_token and eos_id is None:
            raise UsageError(f"EOS token {eos_token!r} is not in the vocabulary of {path}")
        name = name or path.rsplit("/", 1)[-1]
        self.info = Tokenizer(name=name, vocab_size=_vocab_size(self._tok), eos_id=eos_id)

    @classmethod
    def from_model_dir(cls, path: str, eos_token: str | None = None) -> HFTokenizer:
        """A Hugging Face model directory: its ``tokenizer.json``, with EOS from ``tokenizer_config.json``."""
        root = path.rstrip("/") or "/"
        tokenizer_json, config_json = os.path.join(root, "tokenizer.json"), os.path.join(root, "tokenizer_config.json")
        for needed in (tokenizer_json, config_json):
            if not os.path.isfile(needed):
                raise UsageError(
                    f"{needed} is missing: a model directory for --tokenizer holds tokenizer.json and "
                    "tokenizer_config.json (or pass a tokenizer.json file)"
                )
        name = os.path.basename(os.path.abspath(root))
        if eos_token:
            return cls(tokenizer_json, eos_token, name=name)
        eos = _config_eos(config_json)
        tok = cls(tokenizer_json, name=name, guess=False)
        eos_id = tok._tok.token_to_id(eos) if eos is not None else None
        if eos is not None and eos_id is None:
            raise UsageError(f"{config_json}: eos_token {eos!r} is not in the vocabulary of {tokenizer_json}")
        tok.info = dataclasses.replace(tok.info, eos_id=eos_id)
        return tok

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]


def _check_file(path: str, what: str) -> None:
    """A tokenizer is read whole: a path that is no regular file (``/dev/zero``, a FIFO, a
    directory) would be read without end or fail obscurely."""
    if not os.path.exists(path):
        raise UsageError(f"{what} {path} does not exist")
    if not os.path.isfile(path):
        raise UsageError(f"{what} {path} is not a regular file")


def _vocab_size(tok: object) -> int:
    """One past the largest id the tokenizer can produce. ``get_vocab_size`` counts entries, and
    a vocabulary with gaps (``{"a": 0, "b": 70000}``) has ids past that count: the token dtype
    and the range check must allow them."""
    ids = tok.get_vocab(with_added_tokens=True).values()  # type: ignore[attr-defined]
    return max(int(tok.get_vocab_size()), max(ids, default=-1) + 1)  # type: ignore[attr-defined]


_EOS_GUESSES = ["</s>", "<|endoftext|>", "<eos>", "[SEP]", "<|end_of_text|>"]


def _config_eos(config_json: str) -> str | None:
    """``eos_token`` of a ``tokenizer_config.json``: a string, or an AddedToken dict with ``content``."""
    try:
        with open(config_json, "rb") as f:
            config = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"cannot read {config_json}: {exc}") from exc
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    if eos is not None and not isinstance(eos, str):
        raise UsageError(f"{config_json}: eos_token is {eos!r}, expected a string or an AddedToken with 'content'")
    return eos or None


class TiktokenTokenizer:
    """A local tiktoken BPE file (a base64 token and its rank per line), loaded by tiktoken's loader.

    The file holds neither the pre-tokenization pattern nor special tokens: the pattern is
    cl100k_base's (Llama 3's splits differently only whitespace at the very end of a text), and
    the EOS id comes from ``--eos-id`` (with ``--vocab-size`` when it lies past the last rank)."""

    def __init__(self, path: str) -> None:
        try:
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe
        except ImportError as exc:
            raise UsageError("tiktoken:PATH needs the 'tiktoken' extra: pip install 'ferry-data[tiktoken]'") from exc
        if not path or "://" in path:
            raise UsageError(f"tiktoken:{path}: give the path of a local BPE file (ferry downloads no tokenizer)")
        _check_file(path, "tiktoken BPE file")
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            # the hash makes tiktoken's path-keyed cache return this file's bytes, never a stale copy
            ranks = load_tiktoken_bpe(path, expected_hash=digest)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot load tiktoken BPE file {path}: {exc}") from exc
        _check_ranks(path, ranks)
        name = path.rsplit("/", 1)[-1]
        self._enc = tiktoken.Encoding(name, pat_str=_CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={})
        self.info = Tokenizer(name=f"tiktoken:{name}", vocab_size=max(ranks.values()) + 1, eos_id=None)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint32) for ids in self._enc.encode_ordinary_batch(list(texts))]


# cl100k_base's pre-tokenization pattern, as tiktoken_ext.openai_public defines it
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)


def _check_ranks(path: str, ranks: dict[bytes, int]) -> None:
    """What tiktoken's encoder assumes and would otherwise panic on (a Rust panic, not an exception)."""
    if not ranks:
        raise UsageError(f"tiktoken BPE file {path} has no tokens")
    if len(set(ranks.values())) != len(ranks):
        raise UsageError(f"tiktoken BPE file {path} gives the same rank to two tokens")
    bad = next((r for r in ranks.values() if not 0 <= r < 2**32), None)
    if bad is not None:
        raise UsageError(f"tiktoken BPE file {path}: rank {bad} is outside 0..2**32-1")
    missing = next((b for b in range(256) if bytes([b]) not in ranks), None)
    if missing is not None:
        raise UsageError(f"tiktoken BPE file {path} has no token for byte 0x{missing:02x}: not a byte-level BPE")


def load_tokenizer(spec: str, eos_token: str | None = None) -> TextTokenizer:
    """``"bytes"`` for the built-in tokenizer, ``"tiktoken:PATH"`` for a tiktoken BPE file, a
    Hugging Face model directory, else a path to a ``tokenizer.json``."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("tiktoken:"):
        if eos_token:
            raise UsageError(
                "--eos-token does not apply to tiktoken:PATH (the file names no special tokens); pass --eos-id"
            )
        return TiktokenTokenizer(spec[len("tiktoken:") :])
    if os.path.isdir(spec):
        return HFTokenizer.from_model_dir(spec, eos_token)
    return HFTokenizer(spec, eos_token)
