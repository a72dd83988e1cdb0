"""The media cost policy and the packed-sequence planner (pure: no I/O)."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.client.media.planner import cut_pieces, plan_epoch
from ferry.shard_tools.errors import ManifestError, UsageError
from ferry.shard_tools.format.policy import MediaPolicy, parse_policy


def test_patch_policy_costs_images_from_their_size() -> None:
    p = MediaPolicy(max_side=448, patch=14).with_ids(1000)
    assert p.ids == (1000, 1001, 1002)
    assert p.cost("image", 448, 448, 0, 0) == 32 * 32 + 2
    assert p.cost("image", 1000, 500, 0, 0) == 32 * 16 + 2  # scaled to 448x224
    assert p.cost("image", 10, 10, 0, 0) == 1 + 2  # never scaled up
    assert p.cost("image", 15, 1, 0, 0) == 2 + 2
    assert p.cost("audio", 0, 0, 2.01, 0) == 51 + 2  # ceil(2.01 * 25)
    assert p.cost("video", 28, 28, 0, 20) == 8 * 4 + 2  # max_frames 8
    span = p.placeholder(5)
    assert span.tolist() == [1000, 1001, 1001, 1001, 1002]


def test_policy_spec_and_manifest_form() -> None:
    p = parse_policy("patch:max_side=224,patch=16,begin_id=1,patch_id=2,end_id=3")
    assert (p.max_side, p.patch, p.ids) == (224, 16, (1, 2, 3))
    assert MediaPolicy.from_dict(p.to_dict()) == p
    for bad in ("tiles", "patch:max_side=8,patch=16", "patch:size=3", "patch:patch=x", "patch:max_side"):
        with pytest.raises(UsageError):
            parse_policy(bad)
    with pytest.raises(UsageError, match="all three"):
        parse_policy("patch:begin_id=4").with_ids(100)
    with pytest.raises(ManifestError):
        MediaPolicy.from_dict({**p.to_dict(), "extra": 1})
    with pytest.raises(ManifestError):
        MediaPolicy.from_dict(MediaPolicy().to_dict())  # no placeholder ids


def _corpus(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Documents of text and 0-3 images of costs between 3 and 1026 tokens (the patch policy's range)."""
    rng = np.random.default_rng(seed)
    policy = MediaPolicy(max_side=448, patch=14)
    lengths, s_doc, s_start, s_cost = [], [], [], []
    for d in range(n):
        t = 0
        for _ in range(int(rng.integers(0, 4))):
            t += int(rng.integers(0, 300))  # text before the image
            cost = policy.cost("image", int(rng.integers(8, 1200)), int(rng.integers(8, 1200)), 0, 0)
            s_doc.append(d)
            s_start.append(t)
            s_cost.append(cost)
            t += cost
        lengths.append(t + int(rng.integers(1, 900)))  # a caption and EOS
    costs = np.asarray(s_cost, dtype=np.int64)
    ones = np.ones(len(costs), dtype=np.int64)
    return (np.asarray(lengths), np.asarray(s_doc), np.asarray(s_start), costs, ones, np.zeros_like(ones))


def test_planner_fills_sequences_and_keeps_the_caps() -> None:
    seq_len, cap = 4096, 8
    corpus = _corpus(3000, seed=1)
    pieces = cut_pieces(*corpus, seq_len)
    plan = plan_epoch(pieces, seq_len, seed=7, epoch=0, max_images=cap)
    placed = np.sort(plan.order)
    assert placed.tolist() == list(range(len(pieces)))  # every piece exactly once
    used = np.asarray([int(pieces.lengths[plan.pieces(k)].sum()) for k in range(len(plan))])
    images = np.asarray([int(pieces.images[plan.pieces(k)].sum()) for k in range(len(plan))])
    assert used.max() <= seq_len and images.max() <= cap
    efficiency = used.sum() / (len(plan) * seq_len)
    assert efficiency >= 0.98, efficiency
    assert int(pieces.lengths.sum()) == int(corpus[0].sum())  # pieces cover the documents


def test_pieces_never_cut_a_span() -> None:
    seq_len = 1100
    lengths, s_doc, s_start, s_cost, img, fr = _corpus(200, seed=2)
    lengths = lengths * 3  # long documents: most are cut
    pieces = cut_pieces(lengths, s_doc, s_start, s_cost, img, fr, seq_len)
    assert int(pieces.lengths.max()) <= seq_len and int(pieces.lengths.min()) > 0
    for j in range(len(s_doc)):
        d, a, b = s_doc[j], s_start[j], s_start[j] + s_cost[j]
        mine = np.flatnonzero(pieces.doc == d)
        assert any(pieces.start[p] <= a and b <= pieces.stop[p] for p in mine)
    assert int(pieces.images.sum()) == len(s_doc)


def test_plan_is_a_function_of_seed_and_epoch() -> None:
    pieces = cut_pieces(*_corpus(500, seed=3), 4096)
    a = plan_epoch(pieces, 4096, seed=5, epoch=1, max_images=4)
    b = plan_epoch(pieces, 4096, seed=5, epoch=1, max_images=4)
    c = plan_epoch(pieces, 4096, seed=5, epoch=2, max_images=4)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.bounds, b.bounds)
    assert not np.array_equal(a.order, c.order)


def test_a_span_longer_than_a_sequence_is_refused() -> None:
    with pytest.raises(UsageError, match="more than seq_len"):
        cut_pieces(np.asarray([600]), np.asarray([0]), np.asarray([0]), np.asarray([500]), np.ones(1), np.zeros(1), 256)
