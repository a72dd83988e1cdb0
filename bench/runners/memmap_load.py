"""Runner: the loading limit — random ``seq_len + 1`` windows gathered from a ``numpy.memmap`` of
the raw uint16 token stream into int64 batches. No format, no cache, no state beyond a counter."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from _loadloop import Tool, main


class MemmapLoader:
    """Batches of random windows; a sample index permutation drawn once (the limit may cheat)."""

    def __init__(self, a: dict[str, Any]) -> None:
        # the runner that decompresses the stream into memory first passes it as ``tokens``
        self.tokens = a["tokens"] if "tokens" in a else np.memmap(a["data"], dtype=np.uint16, mode="r")
        self.seq_len = a["seq_len"]
        self.batch = a["batch_size"]
        self.samples = (len(self.tokens) - 1) // self.seq_len
        self.order = np.random.default_rng(a["seed"]).permutation(self.samples)
        self.pos = 0

    def __len__(self) -> int:
        return self.samples // self.batch

    def __iter__(self) -> Any:
        if self.pos + self.batch > len(self.order):
            self.pos = 0  # next epoch (same order: the limit need not reshuffle)
        width = self.seq_len + 1
        while self.pos + self.batch <= len(self.order):
            starts = self.order[self.pos : self.pos + self.batch] * self.seq_len
            self.pos += self.batch
            window = np.empty((self.batch, width), dtype=np.int64)
            for j, s in enumerate(starts):  # one contiguous slice copy per sample beats a fancy-index gather
                window[j] = self.tokens[s : s + width]
            t = torch.from_numpy(window)
            yield t[:, :-1], t[:, 1:]


def _load(loader: MemmapLoader, state: dict[str, Any]) -> None:
    loader.pos = state["pos"]


if __name__ == "__main__":
    main(
        Tool(
            build=MemmapLoader,
            ids=lambda b: b,
            epoch_batches=len,
            state=lambda ld: {"pos": ld.pos},
            load_state=_load,
        )
    )
