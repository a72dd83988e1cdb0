"""Whether a training job's tokenizer can be the one a dataset was tokenized with.

A framework (torchtitan) builds a tokenizer from its own configuration and sizes the model's
embedding by it, while a ferry dataset is tokenized already and names its tokenizer's vocabulary
size and EOS id in its manifest. Ids from a larger vocabulary index past that embedding (on a GPU a
device-side assert, far from the cause); another EOS id means documents are cut where the model
does not expect it. Both are refused here, before the first batch, naming both sides.
"""

from __future__ import annotations

from typing import Any

from ferry.shard_tools.errors import UsageError

from ..source import SampleSource

__all__ = ["check_tokenizer"]


def _vocab_size(tokenizer: Any) -> int | None:
    """``get_vocab_size()`` (torchtitan, Hugging Face ``tokenizers``) or ``vocab_size``; None if neither."""
    get = getattr(tokenizer, "get_vocab_size", None)
    size = get() if callable(get) else getattr(tokenizer, "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _eos_id(tokenizer: Any) -> int | None:
    """``eos_id`` (torchtitan) or ``eos_token_id`` (transformers); None if neither is an id."""
    for name in ("eos_id", "eos_token_id"):
        eos = getattr(tokenizer, name, None)
        if isinstance(eos, int) and not isinstance(eos, bool):
            return eos
    return None


def check_tokenizer(dataset: SampleSource, tokenizer: Any, *, where: str = "check_tokenizer") -> None:
    """UsageError when ``tokenizer`` has a smaller vocabulary than ``dataset``'s manifest, or another EOS id
    (each checked where the tokenizer tells it); ``tokenizer=None`` checks nothing."""
    manifest = getattr(dataset, "manifest", None)
    if tokenizer is None or manifest is None:
        return
    theirs, ours = manifest.tokenizer, f"dataset {dataset.url}"
    hint = f"; set {where}=False if the model is sized for the dataset's ids regardless"
    size = _vocab_size(tokenizer)
    if size is not None and size < theirs.vocab_size:
        raise UsageError(
            f"the job's tokenizer has {size} ids but {ours} was tokenized with {theirs.name!r} of {theirs.vocab_size}: "
            f"its ids would index past a model sized by this tokenizer{hint}"
        )
    eos = _eos_id(tokenizer)
    if eos is not None and theirs.eos_id is not None and eos != theirs.eos_id:
        raise UsageError(
            f"the job's tokenizer ends documents with id {eos} but {ours} (tokenized with {theirs.name!r}) with "
            f"{theirs.eos_id}: it is not the dataset's tokenizer{hint}"
        )
