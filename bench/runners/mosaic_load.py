"""Runner: MosaicML ``StreamingDataset`` over the MDS samples (``seq_len + 1`` tokens each, shuffled
with its default algorithm) + ``StreamingDataLoader``. Peers' venv."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from _loadloop import Tool, main
from streaming import StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    clean_stale_shared_memory()  # a killed earlier run must not poison this one
    ds = StreamingDataset(local=a["data"], shuffle=True, shuffle_seed=a["seed"], batch_size=a["batch_size"])
    return StreamingDataLoader(
        ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True, collate_fn=_collate
    )


def _collate(samples: list[dict[str, Any]]) -> Any:
    # stack and widen in numpy: torch's uint16 -> int64 cast is far slower (bench/analysis.md)
    return torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))


def _ids(batch: Any) -> tuple[Any, Any]:
    t = batch
    return t[:, :-1], t[:, 1:]


if __name__ == "__main__":
    main(
        Tool(
            build=_build,
            ids=_ids,
            epoch_batches=len,
            state=lambda ld: ld.state_dict(),
            load_state=lambda ld, s: ld.load_state_dict(s),
        )
    )
