"""A toy training loop over ``TokenLoader``, checkpointed with ``torch.distributed.checkpoint``.

Run by ``tests/integration/test_dcp_resume.py`` three ways:

* plain ``python dcp_train.py`` — one process, the uninterrupted reference;
* ``torchrun --nproc_per_node 4 dcp_train.py --stop-after K`` — trains K steps, saves a DCP
  checkpoint holding the model, the optimizer and the loader (a ``Stateful``), exits;
* ``torchrun --nproc_per_node 2 dcp_train.py --resume`` — loads it and trains to the end.

Every rank appends one JSON line per step to ``<out>/stream-<tag>-rank<r>.jsonl``:
``{"step", "rank", "world_size", "input_ids": [[...], ...]}`` — the test reassembles the
global batch of each step from the ranks in rank order. Rank 0 also writes the final
parameters to ``<out>/params-<tag>.json``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from ferry.client import TokenDataset, TokenLoader


class TinyLM(torch.nn.Module):
    """Embedding → linear head: enough parameters and optimizer state to checkpoint."""

    def __init__(self, vocab: int, dim: int = 8) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))  # type: ignore[no-any-return]


class AppState(Stateful):
    """Model + optimizer as one Stateful, so DCP reshards them for any world size."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model = model
        self.optim = optim

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optim, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"]
        )


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks when a run hangs
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ckpt", required=True, type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--steps", type=int, required=True, help="total steps of the whole run")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--stop-after", type=int, default=None, help="save a checkpoint after this many steps and exit")
    ap.add_argument("--resume", action="store_true", help="load the checkpoint at --ckpt first")
    args = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if args.global_batch % world:
        raise SystemExit(f"global batch {args.global_batch} does not split over {world} ranks")
    batch_size = args.global_batch // world

    torch.manual_seed(0)  # same initial weights on every rank and in the reference
    model = TinyLM(args.vocab)
    train_model: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    ds = TokenDataset(args.data, seq_len=args.seq_len, seed=args.seed, shuffle="global")
    # rank / world_size left to the loader: it must pick them up from torch.distributed.
    loader = TokenLoader(ds, batch_size=batch_size, num_workers=args.workers)
    state: dict[str, Any] = {"app": AppState(model, optim), "loader": loader}
    step = 0
    if args.resume:
        dcp.load(state, checkpoint_id=str(args.ckpt))
        with open(args.ckpt / "step.json") as f:
            step = json.load(f)["step"]

    stream = open(args.out / f"stream-{args.tag}-rank{rank}.jsonl", "a")  # noqa: SIM115 - closed below
    last = args.steps if args.stop_after is None else args.stop_after
    batches = iter(loader)
    while step < last:
        try:
            batch = next(batches)
        except StopIteration:  # end of an epoch: the next iterator continues with the next one
            batches = iter(loader)
            continue
        ids, labels = batch["input_ids"], batch["labels"]
        stream.write(json.dumps({"step": step, "rank": rank, "world_size": world, "input_ids": ids.tolist()}) + "\n")
        logits = train_model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), labels.reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
    del batches  # the loader's iterator stops this rank's DataLoader workers now, not at interpreter exit
    stream.close()

    if args.stop_after is not None:
        dcp.save(state, checkpoint_id=str(args.ckpt))
        if rank == 0:
            (args.ckpt / "step.json").write_text(json.dumps({"step": step}))
    if rank == 0:
        params = {k: v.detach().flatten().tolist() for k, v in model.state_dict().items()}
        (args.out / f"params-{args.tag}.json").write_text(json.dumps(params))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
        # Leave without running destructors. Seen in a test run (py-spy --native): the DDP reducer's
        # last reference dropped at exit, ~ProcessGroupGloo joined its worker thread while holding
        # the GIL, and that thread, destroying the barrier's AsyncWork, waited for the GIL to decref
        # a tensor — a deadlock inside torch; the rank never exited and torchrun left it orphaned.
        # Everything this script writes is closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
