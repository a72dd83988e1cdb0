"""Run under torchrun: read STEPS batches per rank, save the rows, checkpoint the loader with DCP.

Usage: torchrun --nproc_per_node N loader_torchrun.py URL CACHE OUT BATCH STEPS [RESUME_FROM]
Writes OUT/rank<r>.npy (the rows this rank received, step by step) and OUT/ckpt (DCP checkpoint).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ferry.client import TokenDataset, TokenLoader


def main() -> None:
    url, cache, out, batch, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    resume = sys.argv[6] if len(sys.argv) > 6 else None
    dist.init_process_group("gloo")
    ds = TokenDataset(url, seq_len=64, seed=21, shuffle="global", cache_dir=cache)
    loader = TokenLoader(ds, batch_size=batch, num_workers=1)  # rank and world size from torch.distributed
    assert (loader.rank, loader.world_size) == (dist.get_rank(), dist.get_world_size())
    if resume:
        dcp.load({"loader": loader}, checkpoint_id=resume)
    rows: list[np.ndarray] = []
    while len(rows) < steps:
        for b in loader:
            rows.append(b["input_ids"].numpy())
            if len(rows) == steps:
                break
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / f"rank{loader.rank}.npy", np.stack(rows))
    dcp.save({"loader": loader}, checkpoint_id=str(out / "ckpt"))
    if loader.rank == 0:
        (out / "state.json").write_text(json.dumps(loader.state_dict()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
