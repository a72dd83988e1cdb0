"""Runner: ferry loader start-up and resume on a (synthetic) dataset of many shards (ferry's venv).

``startup``: construct ``TokenDataset`` + ``TokenLoader`` and take the first batch.
``resume``: the state of a loader at 90% of the epoch (``consumed`` per DESIGN.md §2), loaded into a
fresh loader: construct + ``load_state_dict`` + first batch.
"""

from __future__ import annotations

from typing import Any

from _common import args, emit, now

from client import TokenDataset, TokenLoader


def _loader(a: dict[str, Any]) -> TokenLoader:
    ds = TokenDataset(a["data"], seq_len=2048, seed=1234, shuffle="global", cache_dir=a["cache_dir"])
    return TokenLoader(ds, batch_size=16, num_workers=0, rank=0, world_size=1)


def main() -> None:
    a = args()
    if a["mode"] == "startup":
        t0 = now()
        loader = _loader(a)
        batch = next(iter(loader))
        seconds = now() - t0
        emit({"startup_s": seconds, "samples": loader.dataset.num_samples, "shape": list(batch["input_ids"].shape)})
        return
    state = _loader(a).state_dict()
    n = state_samples = _loader(a).dataset.num_samples
    state["consumed"] = (int(n * 0.9) // 16) * 16
    t0 = now()
    loader = _loader(a)
    loader.load_state_dict(state)
    next(iter(loader))
    seconds = now() - t0
    emit({"resume_s": seconds, "samples": state_samples, "consumed": state["consumed"]})


if __name__ == "__main__":
    main()
