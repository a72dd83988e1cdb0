"""Runner: ferry resume on a changed world size (ferry's venv).

The state saved by a 1-rank loader (batch 16) at 90% of the epoch is loaded into two loaders,
rank 0 and rank 1 of world size 2 with batch 8 each (the same global batch). Step by step, rank 0's
batch followed by rank 1's must equal the uninterrupted run's batch.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from _common import args, emit, now

from ferry.client import TokenDataset, TokenLoader


def _digest(input_ids: Any, labels: Any) -> str:
    h = hashlib.sha1(input_ids.contiguous().numpy().tobytes())
    h.update(labels.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    a = args()
    with open(a["state_file"]) as f:
        state = json.load(f)
    t0 = now()
    iters = []
    for rank in (0, 1):
        ds = TokenDataset(a["data"], seq_len=a["seq_len"], seed=a["seed"], shuffle="global", cache_dir=a["cache_dir"])
        loader = TokenLoader(ds, batch_size=a["batch_size"] // 2, num_workers=0, rank=rank, world_size=2)
        loader.load_state_dict(state)
        iters.append(iter(loader))
    digests = []
    for _ in range(a["check_batches"]):
        b0, b1 = next(iters[0]), next(iters[1])
        ids = torch.cat([b0["input_ids"], b1["input_ids"]])
        labels = torch.cat([b0["labels"], b1["labels"]])
        digests.append(_digest(ids, labels))
    emit({"resume_s": now() - t0, "digests": digests})


if __name__ == "__main__":
    main()
