"""A toy training loop over a mixture whose plan changes between runs, checkpointed with DCP.

Run by ``tests/integration/test_replan_torchrun.py`` under ``torchrun``: trains from step ``--start`` (0, or
the step saved next to ``--ckpt-in``) to ``--until`` over ``TokenDataset.mix(--data, --weights)``,
then saves model, optimizer and loader to ``--ckpt-out``. With ``--replan`` the loader in the
checkpoint re-plans onto this run's mixture (:class:`ferry.client.stream.loader.ReplanOnLoad`). Every rank
appends ``{"step", "rank", "world_size", "input_ids"}`` per step to ``<out>/stream-rank<r>-<tag>.jsonl``.
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
from dcp_train import AppState, TinyLM

from ferry.client import TokenDataset, TokenLoader
from ferry.client.resume.dcp import ReplanOnLoad


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--weights", type=float, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--ckpt-in", type=Path)
    ap.add_argument("--ckpt-out", type=Path, required=True)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--replan", action="store_true")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=1000)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM(args.vocab)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sources = [TokenDataset(u, seq_len=args.seq_len, seed=10 + i, shuffle="global") for i, u in enumerate(args.data)]
    loader = TokenLoader(TokenDataset.mix(sources, args.weights), batch_size=args.global_batch // world)
    app = AppState(model, optim)
    step = 0
    if args.ckpt_in is not None:
        state: dict[str, Any] = {"app": app, "loader": ReplanOnLoad(loader, args.ckpt_in) if args.replan else loader}
        dcp.load(state, checkpoint_id=str(args.ckpt_in))
        step = json.loads((args.ckpt_in / "step.json").read_text())["step"]

    with open(args.out / f"stream-rank{rank}-{args.tag}.jsonl", "a") as stream:
        batches = iter(loader)
        while step < args.until:
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                continue
            ids = batch["input_ids"]
            rec = {"step": step, "rank": rank, "world_size": world, "input_ids": ids.tolist()}
            stream.write(json.dumps(rec) + "\n")
            logits = ddp(ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch["labels"].reshape(-1))
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
        del batches
    dcp.save({"app": app, "loader": loader}, checkpoint_id=str(args.ckpt_out))
    if rank == 0:
        (args.ckpt_out / "step.json").write_text(json.dumps({"step": step}))
        (args.out / f"state-{args.tag}.json").write_text(json.dumps(loader.state_dict()))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as dcp_train.py: no destructors (a gloo/DDP teardown can deadlock)


if __name__ == "__main__":
    raise SystemExit(main())
