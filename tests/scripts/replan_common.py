"""Helpers of the re-plan tests: a source that says exactly what was read, and runs over any topology."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.client import TokenDataset, TokenLoader
from ferry.client.source import SampleSource
from ferry.client.stream.mixed import MixedDataset

TAG = 10**9  # a delivered token is source_tag * TAG + the sample's position in that source's own stream


class Counting(SampleSource):
    """A source whose sample at stream position p is the constant token ``tag * TAG + p``: what was read, exactly."""

    def __init__(self, tag: int, n: int = 37, seq_len: int = 3) -> None:
        self.tag, self.num_samples, self.seq_len = tag, n, seq_len
        self.mode, self.prefetch_depth, self.token_dtype = "tokens", 0, np.dtype(np.int64)

    def identity(self) -> dict[str, Any]:
        return {"dataset_version": f"src{self.tag}", "seed": 0, "seq_len": self.seq_len, "mode": "tokens",
                "shuffle": "none"}  # fmt: skip

    def fill(self, positions: np.ndarray, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        out["windows"][rows] = (self.tag * TAG + np.asarray(positions))[:, None]

    def boundaries(self, positions: np.ndarray) -> list[list[int]]:
        return [[] for _ in positions]


def mix(tags: Sequence[int], weights: Any) -> MixedDataset:
    return TokenDataset.mix([Counting(t) for t in tags], weights)


def endless(loader: TokenLoader) -> Iterator[dict[str, Any]]:
    while True:
        yield from loader


def run(
    ds: SampleSource, state: dict | None, world: int, batch: int, steps: int, *, replan: bool = False, workers: int = 0
) -> tuple[list[int], dict[str, Any]]:
    """``steps`` global batches on ``world`` ranks from ``state``: the tokens in global order, and the state after."""
    loaders = [TokenLoader(ds, batch, num_workers=workers, rank=r, world_size=world) for r in range(world)]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(json.loads(json.dumps(state)), replan=replan)
    its = [endless(ld) for ld in loaders]
    out: list[int] = []
    for _ in range(steps):
        for it in its:
            out.extend(next(it)["input_ids"][:, 0].tolist())
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)
    del its
    return out, states[0]


def per_source(tokens: Sequence[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for t in tokens:
        out.setdefault(t // TAG, []).append(t % TAG)
    return out
