"""Reads planned a block of batches at a time are the reads of each batch planned alone, whatever the order in
which batches are asked for, and a block never serves another sequence of batches or another sample order."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import numpy as np
import pytest

from ferry.client.sampling.shards import sample_reads
from ferry.client.stream.blocks import FIRST_BLOCK, KEPT, MAX_BLOCK, MAX_SAMPLES, BlockPlans, ReadsOf
from ferry.shard_tools.errors import InvalidValueError

OFFSETS = np.asarray([0, 100, 130, 400, 401, 1000], dtype=np.int64)  # a one-token shard, and short ones
WIDTH = 17
SAMPLES = (int(OFFSETS[-1]) - 1) // (WIDTH - 1)


def _reads_of(order: np.ndarray) -> ReadsOf:
    def reads_of(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts = order[positions % SAMPLES] * (WIDTH - 1)
        return sample_reads(starts, OFFSETS, WIDTH)

    return reads_of


def _positions(batch: int, stride: int = 1) -> Callable[[int], np.ndarray]:
    def positions_of(j: int) -> np.ndarray:
        first = j * stride * batch
        return np.arange(first, first + batch, dtype=np.int64)

    return positions_of


def _alone(order: np.ndarray, positions: np.ndarray) -> tuple[list[int], list[int], bool]:
    """A batch's reads worked out sample by sample, without numpy's searches."""
    shards, offsets, runs_on = [], [], False
    for p in positions.tolist():
        start = int(order[p % SAMPLES]) * (WIDTH - 1)
        s = max(k for k in range(len(OFFSETS) - 1) if OFFSETS[k] <= start)
        shards.append(s)
        offsets.append(start - int(OFFSETS[s]))
        runs_on |= start + WIDTH > int(OFFSETS[s + 1])
    return shards, offsets, runs_on


@pytest.mark.parametrize("asked", ["in order", "backwards", "jumping"])
def test_planned_reads_are_each_batch_s_own(asked: str) -> None:
    order = np.random.default_rng(3).permutation(SAMPLES)
    plans, positions_of = BlockPlans(), _positions(5, stride=3)
    batches = list(range(3 * MAX_BLOCK))
    if asked == "backwards":
        batches.reverse()
    elif asked == "jumping":
        batches = [int(j) for j in np.random.default_rng(4).integers(0, 3 * MAX_BLOCK, 200)]
    seen_runs_on = False
    for j in batches:
        got = plans.reads("seq", order, j, positions_of, _reads_of(order))
        assert (got.shards, got.offsets, got.runs_on) == _alone(order, positions_of(j))
        seen_runs_on |= got.runs_on
    assert seen_runs_on  # some samples run on into the next shard, the one-token shard among them


def test_blocks_grow_while_batches_come_in_order_and_start_small_again() -> None:
    order = np.arange(SAMPLES)
    planned: list[int] = []

    def reads_of(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        planned.append(len(positions) // 2)
        return _reads_of(order)(positions)

    plans, positions_of = BlockPlans(), _positions(2)
    for j in range(FIRST_BLOCK + 2 * FIRST_BLOCK + 4 * FIRST_BLOCK):
        plans.reads("seq", order, j, positions_of, reads_of)
    assert planned == [FIRST_BLOCK, 2 * FIRST_BLOCK, 4 * FIRST_BLOCK]
    plans.reads("seq", order, 500, positions_of, reads_of)  # a jump: a new sequence of reads starts small
    assert planned[-1] == FIRST_BLOCK
    for j in range(501, 501 + 2000):
        plans.reads("seq", order, j, positions_of, reads_of)
    assert max(planned) == MAX_BLOCK


def test_a_block_serves_only_its_sequence_and_its_order() -> None:
    order = np.arange(SAMPLES)
    reversed_order = order[::-1].copy()
    plans = BlockPlans()
    a = plans.reads("a", order, 0, _positions(4), _reads_of(order))
    # another sequence (another batch size) and another order object, same batch index: planned again
    b = plans.reads("b", order, 0, _positions(3), _reads_of(order))
    c = plans.reads("b", reversed_order, 0, _positions(3), _reads_of(reversed_order))
    assert len(a.shards) == 4 and len(b.shards) == 3
    assert (c.shards, c.offsets) == _alone(reversed_order, _positions(3)(0))[:2]
    assert (b.shards, b.offsets) != (c.shards, c.offsets)


def test_a_block_past_the_last_positions_plans_the_batch_alone() -> None:
    """Batches after the one asked for may have no stream positions (the stream's end): the batch is still read."""
    order = np.arange(SAMPLES)
    inner = _positions(2)

    def positions_of(j: int) -> np.ndarray:
        if j > 0:
            raise InvalidValueError("stream positions must lie in [0, 2**62)")
        return inner(j)

    got = BlockPlans().reads("seq", order, 0, positions_of, _reads_of(order))
    assert (got.shards, got.offsets, got.runs_on) == _alone(order, inner(0))


def test_interleaved_sequences_keep_their_blocks() -> None:
    """Loaders of several ranks sharing one dataset object ask in turn: each keeps its block, and it grows."""
    order = np.random.default_rng(5).permutation(SAMPLES)
    planned: list[int] = []

    def reads_of(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        planned.append(len(positions))
        return _reads_of(order)(positions)

    plans = BlockPlans()
    ranks = [_positions(3, stride=r + 1) for r in range(KEPT)]
    for j in range(60):
        for r, positions_of in enumerate(ranks):
            got = plans.reads(("rank", r), order, j, positions_of, reads_of)
            assert (got.shards, got.offsets, got.runs_on) == _alone(order, positions_of(j))
    # each rank planned blocks of 4, 8, 16 and 32 batches (60 = 4 + 8 + 16 + 32), not one block per batch
    assert sorted(planned) == sorted([3 * n for n in (4, 8, 16, 32)] * KEPT)


def test_plans_pickle_empty() -> None:
    order = np.arange(SAMPLES)
    plans = BlockPlans()
    plans.reads("seq", order, 0, _positions(2), _reads_of(order))
    again = pickle.loads(pickle.dumps(plans))
    assert isinstance(again, BlockPlans) and not again._blocks


def test_a_block_holds_a_bounded_number_of_samples() -> None:
    """Large batches plan fewer batches at once (at least the one asked for), so a block's lists stay small."""
    big_offsets = np.asarray([0, 10**9], dtype=np.int64)
    planned: list[int] = []

    def reads_of(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        planned.append(len(positions))
        return sample_reads(positions * (WIDTH - 1), big_offsets, WIDTH)

    plans = BlockPlans()
    for batch in (MAX_SAMPLES // 2 - 1, 2 * MAX_SAMPLES):
        planned.clear()
        positions_of = _positions(batch)
        for j in range(40):
            got = plans.reads(("batch", batch), "order", j, positions_of, reads_of)
            assert got.offsets == (positions_of(j) * (WIDTH - 1)).tolist()
        assert max(planned) <= max(MAX_SAMPLES, batch) and sum(planned) == 40 * batch
