"""``FerryDataLoader``: a torchtitan data loader (``BaseDataLoader``) that reads a ferry dataset.

torchtitan builds its data loader from ``Trainer.Config.dataloader`` with the data-parallel
rank and degree, ``seq_len`` and the local batch size, iterates it for
``({"input": ..., "positions": ...}, labels)`` pairs and saves it in its checkpoint as a
``Stateful``. This one is a :class:`~ferry.client.stream.loader.TokenLoader` underneath: the order
depends only on the seed and the global batch position, and the state (TokenLoader's small
dict, the same on every rank) loads into another data-parallel degree, where torchtitan's
own loader refuses ("dataloader resharding is not supported yet").

``positions`` restart at 0 at every document start (ferry's ``position_ids``), which is what
torchtitan's FlexAttention / varlen backends turn into document-causal masks and what RoPE
reads; with ``document_masks=False`` they are ``0..seq_len-1`` for every sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ferry.shard_tools.errors import StateError, UsageError

from ..stream.dataset import TokenDataset
from ..stream.loader import TokenLoader
from .vocab import check_tokenizer

try:
    from torchtitan.components.dataloader import BaseDataLoader
except ImportError as exc:  # the extra is not installed
    raise UsageError(
        "ferry.client.integrations.torchtitan needs torchtitan (Python >= 3.11): pip install 'ferry-data[torchtitan]'"
    ) from exc

__all__ = ["FerryDataLoader"]

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


class FerryDataLoader(BaseDataLoader):
    """torchtitan's data-loader protocol over a ferry dataset (deterministic, resumable on any DP degree).

    Use it as ``Trainer.Config.dataloader = FerryDataLoader.Config(dataset_path=URL, ...)``;
    torchtitan's trainer calls ``config.build(dp_world_size=, dp_rank=, tokenizer=, seq_len=,
    local_batch_size=, ...)``. Keep the global batch (local batch × DP degree) when the degree
    changes across a resume to get the same batches; with another one the sample stream still
    continues with nothing repeated or skipped.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset_path: str | None = None
        """URL of the ferry dataset (any fsspec URL): the nearest replica."""

        replicas: list[str] = field(default_factory=list)
        """Further replica URLs of the same dataset, nearest first, tried when one fails."""

        seed: int = 0
        """Shuffle seed: epoch e is permuted by (seed, e)."""

        shuffle: str = "global"
        """'global' | 'window' (bounded cache) | 'none'."""

        window: int = 8
        """Shards per shuffle window (shuffle='window')."""

        cache_dir: str | None = None
        """Node-local cache of decompressed shards (default $FERRY_CACHE_DIR or ~/.cache/ferry/shards)."""

        cache_limit: str | None = None
        """Cache size, e.g. '200GiB' (default $FERRY_CACHE_LIMIT or 50GiB)."""

        num_workers: int = 0
        """DataLoader worker processes building batches (the order never depends on it)."""

        prefetch_factor: int = 2
        """Batches each worker builds ahead."""

        document_masks: bool = True
        """positions restart at each document start (document-causal attention); else 0..seq_len-1."""

        infinite: bool = True
        """Run through the epochs without end; False: stop at the end of the current epoch."""

        strict_resume: bool = True
        """Refuse a checkpoint made for another dataset version, seed, seq_len or shuffle."""

        check_tokenizer: bool = True
        """Refuse a job tokenizer with fewer ids than the dataset's vocabulary or another EOS id."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        # tokenizer: the dataset is tokenized already, it is only checked against the manifest's; snapshot_every_n_steps
        # and other runtime arguments torchtitan passes to its loaders have no meaning here (the state is exact)
        if not config.dataset_path:
            raise UsageError("FerryDataLoader.Config.dataset_path must be the URL of a ferry dataset")
        self.config = config
        urls = [config.dataset_path, *config.replicas]
        self.dataset = TokenDataset(
            urls if len(urls) > 1 else urls[0],
            seq_len=seq_len,
            seed=config.seed,
            shuffle=config.shuffle,
            cache_dir=config.cache_dir,
            cache_limit=config.cache_limit,
            window=config.window,
        )
        if config.check_tokenizer:
            check_tokenizer(self.dataset, tokenizer, where="FerryDataLoader.Config.check_tokenizer")
        self.loader = TokenLoader(
            self.dataset,
            batch_size=local_batch_size,
            num_workers=config.num_workers,
            rank=dp_rank,
            world_size=dp_world_size,
            return_doc_boundaries=config.document_masks,
            prefetch_factor=config.prefetch_factor,
        )
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size

    def __iter__(self) -> Iterator[Batch]:
        while True:
            for batch in self.loader:  # one epoch; the next iter() continues with the next
                yield _titan_batch(batch)
            if not self.config.infinite:
                return

    def state_dict(self) -> dict[str, Any]:
        """TokenLoader's state: identical on every rank, so one copy in the checkpoint serves any DP degree."""
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue after the checkpoint's last batch; an empty state (a fresh start) changes nothing."""
        if not state_dict:
            return
        if "world_size" in state_dict or any(str(k).startswith("dp_rank_") for k in state_dict):
            raise StateError(
                "the checkpoint's dataloader state was written by torchtitan's own data loader, not FerryDataLoader; "
                "add 'dataloader' to checkpoint.exclude_from_loading to start the ferry stream from the beginning"
            )
        self.loader.load_state_dict(state_dict, strict=self.config.strict_resume)


def _titan_batch(batch: Mapping[str, torch.Tensor]) -> Batch:
    """TokenLoader batch → torchtitan's ``({"input", "positions"}, labels)``."""
    ids = batch["input_ids"]
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(ids.shape[1], dtype=torch.int64).expand_as(ids).contiguous()
    return {"input": ids, "positions": positions}, batch["labels"]
