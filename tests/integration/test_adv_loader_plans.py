"""Data plans as a careless operator or a hand-edited state writes them: phases far past any stream
position, in a mixture's schedule or in a saved plan, are ferry errors (a usage error, or a StateError
naming the plan), never a bare OverflowError from the index math."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.sampling.mixing import MixSchedule
from ferry.shard_tools.errors import StateError, UsageError

SCHEDULE = [(0, [1, 1]), (50, [1, 2])]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    base = tmp_path_factory.mktemp("plans")
    return [pack_test_dataset(str(base / name), 200, seed=k) for k, name in enumerate(("a", "b"))]


def _mixture(urls: list[str], cache: Path, weights: Any = SCHEDULE) -> TokenLoader:
    sources = [TokenDataset(u, seq_len=16, cache_dir=str(cache)) for u in urls]
    return TokenLoader(TokenDataset.mix(sources, weights), batch_size=4)


@pytest.mark.parametrize("start", [2**62, 2**63, 2**70])
def test_a_phase_starting_past_every_stream_position_is_a_usage_error(
    urls: list[str], tmp_path: Path, start: int
) -> None:
    with pytest.raises(UsageError, match=r"2\*\*62"):
        _mixture(urls, tmp_path, [(0, [1, 1]), (start, [1, 2])])


def test_the_last_phase_start_below_the_limit_is_taken(urls: list[str], tmp_path: Path) -> None:
    loader = _mixture(urls, tmp_path, [(0, [1, 1]), (2**62 - 1, [1, 2])])
    assert next(iter(loader))["input_ids"].shape == (4, 16)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("start", [2**62, 2**70])
def test_a_saved_plan_with_a_phase_past_every_stream_position_is_a_state_error(
    urls: list[str], tmp_path: Path, start: int, strict: bool
) -> None:
    loader = _mixture(urls, tmp_path)
    next(iter(loader))
    state = copy.deepcopy(loader.state_dict())
    state["plan"]["phases"].append([start, [1, 1]])
    with pytest.raises(StateError, match="plan phases"):
        _mixture(urls, tmp_path).load_state_dict(state, strict=strict)


def test_too_many_sources_is_said_so_in_one_short_line() -> None:
    with pytest.raises(UsageError, match="at most 4096 sources") as err:
        MixSchedule([1] * 5000)
    assert len(str(err.value)) < 300


def test_a_weight_too_small_for_the_period_is_named_in_one_short_line() -> None:
    """3 : 0.001 is within 1:4096, but 0.001 of a sum of 13.001 is not: the message names that weight."""
    with pytest.raises(UsageError, match=r"0\.001 is below 1/4096 of the weights' sum 13\.001") as err:
        MixSchedule([3, 0.001, *[1] * 10])
    assert len(str(err.value)) < 300
    with pytest.raises(UsageError, match="differ by more than") as err:
        MixSchedule([*[1.0] * 2000, 1e-6])
    assert len(str(err.value)) < 300


def test_a_state_of_another_long_schedule_is_refused_in_one_short_line(urls: list[str], tmp_path: Path) -> None:
    long = [(k * 10, [1 + k % 3, 1]) for k in range(4096)]
    loader = _mixture(urls, tmp_path, long)
    next(iter(loader))
    with pytest.raises(StateError, match="weights .* differ") as err:
        _mixture(urls, tmp_path, [1, 1]).load_state_dict(loader.state_dict())
    assert len(str(err.value)) < 600
