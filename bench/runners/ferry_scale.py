"""Runner: ferry loader start-up and resume on a (synthetic) dataset of many shards (ferry's venv).

Start-up: construct ``TokenDataset`` + ``TokenLoader`` and take the first batch. Then resume: the
state at 90% of the epoch (``consumed``, as the determinism contract defines it) loaded into a second, new loader:
construct + ``load_state_dict`` + first batch (imports are warm by then, as in a real restart's
second step; the manifest is read again from disk).
"""

from __future__ import annotations

from typing import Any

from _common import args, emit, now

from ferry.client import TokenDataset, TokenLoader


def _loader(a: dict[str, Any]) -> TokenLoader:
    ds = TokenDataset(a["data"], seq_len=2048, seed=1234, shuffle="global", cache_dir=a["cache_dir"])
    return TokenLoader(ds, batch_size=16, num_workers=0, rank=0, world_size=1)


def main() -> None:
    a = args()
    t0 = now()
    loader = _loader(a)
    batch = next(iter(loader))
    startup = now() - t0
    state = loader.state_dict()
    n = loader.dataset.num_samples
    state["consumed"] = (int(n * 0.9) // 16) * 16  # 90% of the epoch, on a batch boundary
    t0 = now()
    resumed = _loader(a)
    resumed.load_state_dict(state)
    next(iter(resumed))
    resume = now() - t0
    shape = list(batch["input_ids"].shape)
    emit({"startup_s": startup, "resume_s": resume, "samples": n, "consumed": state["consumed"], "shape": shape})


if __name__ == "__main__":
    main()
