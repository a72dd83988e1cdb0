"""Runner: litdata ``StreamingDataset`` + ``TokensLoader(block_size=seq_len + 1)`` + ``StreamingDataLoader``.

The dataset is read as ``"local:" + path`` with a separate ``cache_dir``: from a plain local
directory litdata deletes the compressed chunks after decompressing them.
Peers' venv.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from _loadloop import Tool, main
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    ds = StreamingDataset(
        input_dir="local:" + a["data"],
        cache_dir=a["cache_dir"],
        item_loader=TokensLoader(block_size=a["seq_len"] + 1),
        shuffle=True,
        seed=a["seed"],
        drop_last=True,
    )
    return StreamingDataLoader(ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True)


def _ids(batch: Any) -> tuple[Any, Any]:
    # torch's uint16 -> int64 cast is far slower than numpy's (bench/analysis.md)
    t = torch.from_numpy(batch.numpy().astype(np.int64))
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
