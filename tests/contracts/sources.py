"""What every ``SampleSource`` (``ferry.client.source``) promises the loader, once for every source.

A source has ``num_samples`` samples an epoch over an endless stream of positions (epoch ``e`` covers
``[e*n, (e+1)*n)``) and writes the samples at any positions into batches:

- lengths and indexing: ``len`` is ``num_samples``, ``epoch_span`` cuts the stream into epochs, a batch
  holds int64 ``[B, seq_len]`` tensors (token mode: labels are the inputs shifted by one; document mode:
  an attention mask over a prefix), positions epochs apart are read without the epochs between;
- determinism: the same configuration gives the same samples at the same positions, in every process
  (DataLoader workers included), and another seed another order;
- the samples are what the data holds (each subclass's oracle, read without the loader);
- resume: a loader's state survives JSON, counts only the batches delivered, and a fresh source of the
  same configuration continues from it on another world size exactly where the run stopped, across an
  epoch's end; a state of another order is refused;
- epochs: a loader runs to the end of its epoch and the next ``iter()`` goes on into the next;
- the map-style view and a plain ``DataLoader`` read the same samples.

A subclass gives ``make`` (a fixture: ``make(seed)`` builds a fresh source of its configuration) and
``expected`` (the oracle).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from ferry.client import TokenLoader
from ferry.client.integrations import MapStyleView, StreamSampler
from ferry.client.source import SampleSource
from ferry.shard_tools.errors import StateError, UsageError

Make = Callable[..., SampleSource]
BATCH = 6  # the global batch of the resume checks: 1 rank of 6, then 2 ranks of 3


def _forever(loader: TokenLoader) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from loader


def _rows(loader: TokenLoader, steps: int) -> list[np.ndarray]:
    gen = _forever(loader)
    try:
        return [next(gen)["input_ids"].numpy() for _ in range(steps)]
    finally:
        gen.close()  # stops DataLoader workers


class SampleSourceContract:
    """The loader's contract with one kind of ``SampleSource``."""

    mode: ClassVar[str] = "tokens"
    seed: ClassVar[int] = 7
    other_seed: ClassVar[int] = 9

    @pytest.fixture
    def make(self) -> Make:
        raise NotImplementedError("a subclass gives make(seed) -> a fresh source of its configuration")

    def expected(self, source: SampleSource, positions: np.ndarray) -> dict[str, np.ndarray]:
        """The batch at stream ``positions`` as the data holds it, read without the loader: ``input_ids`` and
        whichever other keys the oracle knows."""
        raise NotImplementedError

    @pytest.fixture
    def source(self, make: Make) -> Iterator[SampleSource]:
        src = make(self.seed)
        yield src
        src.close()

    def test_len_is_the_samples_of_an_epoch_and_epoch_span_cuts_the_stream(self, source: SampleSource) -> None:
        n = len(source)
        assert n == source.num_samples > 0
        assert source.epoch_span(0) == source.epoch_span(n - 1) == (0, 0, n)
        assert source.epoch_span(n) == (1, n, 2 * n)
        assert source.epoch_span(5 * n + 3) == (5, 5 * n, 6 * n)

    def test_a_batch_is_int64_rows_of_seq_len(self, source: SampleSource) -> None:
        b = source.batch(np.arange(5))
        inputs, labels = b["input_ids"], b["labels"]
        assert inputs.dtype == labels.dtype == torch.int64
        assert tuple(inputs.shape) == tuple(labels.shape) == (5, source.seq_len)
        if source.mode == "tokens":
            assert set(b) == {"input_ids", "labels"}
            assert torch.equal(labels[:, :-1], inputs[:, 1:])  # the next token
            return
        assert set(b) == {"input_ids", "labels", "attention_mask"}
        for row in range(5):
            n = int(b["attention_mask"][row].sum())
            assert b["attention_mask"][row].tolist() == [1] * n + [0] * (source.seq_len - n)
            assert torch.equal(labels[row, : n - 1], inputs[row, 1:n])

    def test_the_samples_are_what_the_data_holds(self, source: SampleSource) -> None:
        n = len(source)
        positions = np.array([0, 1, 2, n - 1, n, n + 3, 3 * n + 1], dtype=np.int64)
        got, want = source.batch(positions), self.expected(source, positions)
        assert "input_ids" in want and set(want) <= set(got)
        for k, rows in want.items():
            np.testing.assert_array_equal(got[k].numpy(), rows, err_msg=k)

    def test_the_same_configuration_gives_the_same_samples(self, source: SampleSource, make: Make) -> None:
        n = len(source)
        positions = np.concatenate([np.arange(min(n, 40)), [n + 1, 2 * n + 5, 7 * n + 2]]).astype(np.int64)
        first = source.batch(positions)
        again = make(self.seed)
        try:
            for b in (source.batch(positions), again.batch(positions)):
                assert b.keys() == first.keys()
                for k in first:
                    assert torch.equal(b[k], first[k]), k
            other = make(self.other_seed)
            try:
                assert not torch.equal(other.batch(positions)["input_ids"], first["input_ids"])  # another order
            finally:
                other.close()
        finally:
            again.close()

    @pytest.mark.timeout(60)
    def test_positions_epochs_apart_are_read_without_the_epochs_between(self, source: SampleSource) -> None:
        """Positions billions of epochs apart (``ferry trace`` of a late step) are looked up in the epochs they
        are in, never by walking every epoch between them."""
        n = len(source)
        positions = np.array([5, 2**61 + 7, 3 * n + 1, 2**61 + n + 2], dtype=np.int64)
        together = source.batch(positions)["input_ids"]
        for row, p in enumerate(positions.tolist()):
            assert torch.equal(together[row], source.batch(np.array([p]))["input_ids"][0]), p

    def test_workers_never_change_the_stream(self, source: SampleSource) -> None:
        alone = _rows(TokenLoader(source, 5, num_workers=0, rank=1, world_size=2), 6)
        workers = _rows(TokenLoader(source, 5, num_workers=2, rank=1, world_size=2), 6)
        for a, b in zip(alone, workers, strict=True):
            np.testing.assert_array_equal(a, b)

    def test_the_state_counts_only_delivered_batches_and_survives_json(self, source: SampleSource) -> None:
        """With workers prefetching ahead, the state still reflects what the loop received."""
        loader = TokenLoader(source, batch_size=3, num_workers=2, rank=1, world_size=2, prefetch_factor=4)
        assert loader.state_dict()["consumed"] == 0
        it = iter(loader)
        for k in range(1, 6):
            next(it)
            state = loader.state_dict()
            assert state["epoch"] * len(source) + state["consumed"] == 6 * k
        del it
        state = loader.state_dict()
        assert json.loads(json.dumps(state)) == state

    @pytest.mark.parametrize("where", ["early", "at the epoch's end"])
    def test_a_resumed_run_on_another_world_size_equals_the_uninterrupted_one(
        self, source: SampleSource, make: Make, where: str
    ) -> None:
        steps = 13 if where == "early" else len(source) // BATCH - 1  # the last: the resumed run crosses epochs
        more = 9
        full = np.concatenate(_rows(TokenLoader(source, BATCH, rank=0, world_size=1), steps + more))
        first = TokenLoader(source, BATCH, rank=0, world_size=1)
        head = _rows(first, steps)
        state = json.loads(json.dumps(first.state_dict()))
        fresh = make(self.seed)
        try:
            ranks = [TokenLoader(fresh, BATCH // 2, num_workers=1, rank=r, world_size=2) for r in range(2)]
            for r in ranks:
                r.load_state_dict(state)
            gens = [_forever(r) for r in ranks]
            tail: list[np.ndarray] = []
            try:
                for _ in range(more):
                    tail.extend(next(g)["input_ids"].numpy() for g in gens)
            finally:
                for g in gens:
                    g.close()
            np.testing.assert_array_equal(np.concatenate(head + tail), full)
        finally:
            fresh.close()

    def test_a_state_of_another_order_is_refused(self, source: SampleSource, make: Make) -> None:
        loader = TokenLoader(source, 4, rank=0, world_size=1)
        next(iter(loader))
        state = loader.state_dict()
        other = make(self.other_seed)
        try:
            reseeded = TokenLoader(other, 4, rank=0, world_size=1)
            with pytest.raises(StateError, match="seed"):
                reseeded.load_state_dict(state)
            reseeded.load_state_dict(state, strict=False)  # explicitly overridden: continue at the same counter
            assert reseeded.position == 4
        finally:
            other.close()

    def test_iteration_runs_to_the_epoch_end_and_continues(self, source: SampleSource) -> None:
        loader = TokenLoader(source, batch_size=10, rank=0, world_size=1)
        n = len(source)
        assert len(loader) == -(-n // 10)
        batches = list(loader)
        assert len(batches) == -(-n // 10)
        assert loader.epoch == 1 and loader.state_dict()["consumed"] == len(batches) * 10 - n
        pos = loader.position
        assert len(loader) == -(-(2 * n - pos) // 10)
        assert len(list(loader)) == -(-(2 * n - pos) // 10)
        assert loader.epoch == 2

    def test_the_map_style_view_reads_the_loaders_samples(self, source: SampleSource) -> None:
        view = MapStyleView(source)
        n = len(view)
        assert n == len(source)
        for p in (0, 7, n + 3):  # a later epoch is its own permutation
            sample, want = view[p], source.batch(np.asarray([p]))
            assert sample.keys() == want.keys()
            for k in want:
                assert torch.equal(sample[k], want[k][0]), k
        with pytest.raises(UsageError, match="stream position"):
            view[-1]
        sampler = StreamSampler(source, 3, rank=1, world_size=2)
        ref = TokenLoader(source, 3, rank=1, world_size=2)
        for a, b in zip(DataLoader(view, sampler=sampler, batch_size=3), ref, strict=True):  # one epoch
            assert a.keys() == b.keys()
            for k in a:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        assert sampler.state_dict() == ref.state_dict()  # the sampler's state is TokenLoader's

    def test_a_plain_dataloader_reads_every_sample_of_epoch_0_once(self, source: SampleSource) -> None:
        plain = list(DataLoader(source, batch_size=4, num_workers=2))
        rows = torch.cat([b["input_ids"] for b in plain]).numpy()
        n = len(source)
        assert rows.shape == (n, source.seq_len)
        reference = source.batch(np.arange(n))["input_ids"].numpy()
        assert sorted(map(bytes, rows)) == sorted(map(bytes, reference))  # every sample once
