"""Runner: ferry ``client.TokenDataset`` + ``client.TokenLoader`` (ferry's venv)."""

from __future__ import annotations

from typing import Any

from _loadloop import Tool, main

from ferry.client import TokenDataset, TokenLoader


def _build(a: dict[str, Any]) -> Any:
    ds = TokenDataset(
        a["data"], seq_len=a["seq_len"], seed=a["seed"], shuffle=a.get("shuffle", "global"), cache_dir=a["cache_dir"]
    )
    # with shared_labels, input_ids and labels are two views of one widened buffer: what the peers' runners give
    shared = a.get("shared_labels", False)
    return TokenLoader(ds, a["batch_size"], a["workers"], rank=0, world_size=1, shared_labels=shared)


def _epoch_batches(loader: Any) -> int:
    try:
        return len(loader)
    except TypeError:
        return len(loader.dataset) // loader.batch_size


if __name__ == "__main__":
    main(
        Tool(
            build=_build,
            ids=lambda b: (b["input_ids"], b["labels"]),
            epoch_batches=_epoch_batches,
            state=lambda ld: ld.state_dict(),
            load_state=lambda ld, s: ld.load_state_dict(s),
        )
    )
