"""Without workers, a loop with a step finds its next batch built during the step (by the loader's helper
thread), and what it gets is what a loop without a step gets: the same batches, the same states."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader

STEP_S = 0.05  # far longer than the helper takes to notice the step


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("idle") / "ds"), 200)


def _loader(url: str, cache: Path) -> TokenLoader:
    return TokenLoader(TokenDataset(url, seq_len=16, seed=7, cache_dir=str(cache)), batch_size=4)


def test_a_loop_with_a_step_gets_the_same_batches_built_during_its_steps(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_by: list[str] = []
    payload = TokenDataset.planned_payload

    def recorded(self: TokenDataset, *args: object, **kwargs: object) -> object:
        built_by.append(threading.current_thread().name)
        return payload(self, *args, **kwargs)  # type: ignore[arg-type]

    expected = [b["input_ids"] for b in _loader(url, tmp_path / "a")]
    monkeypatch.setattr(TokenDataset, "planned_payload", recorded)
    loader = _loader(url, tmp_path / "b")
    got, states, resumed = [], [], []
    for batch in loader:
        got.append(batch["input_ids"])
        time.sleep(STEP_S)  # the next batch is built now
        states.append(loader.state_dict())  # taken while it is, or after: it counts the batches delivered
        if len(got) == 5:
            break
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=False))
    assert "ferry-idle" in built_by[1:]
    for k, state in enumerate(states):  # each state continues right after the batches delivered before it
        again = _loader(url, tmp_path / "c")
        again.load_state_dict(state)
        resumed.append(next(iter(again))["input_ids"])
        assert torch.equal(resumed[-1], expected[k + 1])
