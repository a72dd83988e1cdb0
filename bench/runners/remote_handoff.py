"""Runner: the floor of the stall share — a torch DataLoader whose workers hand over ready batches of the
same shape (16 x 2049 int64 by default), through the same loop and step as the remote runners. No data is
read: what remains is the worker-to-loop handoff every DataLoader-based loader pays per batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from _remoteloop import main
from torch.utils.data import DataLoader, IterableDataset


class _Ready(IterableDataset):
    def __init__(self, batch_size: int, seq_len: int) -> None:
        self.batch = torch.zeros((batch_size, seq_len + 1), dtype=torch.int64)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.batch.clone()


def _build(a: dict[str, Any]) -> DataLoader:
    return DataLoader(_Ready(a["batch_size"], a["seq_len"]), batch_size=None, num_workers=a["workers"])


if __name__ == "__main__":
    main(_build, lambda b: b)
