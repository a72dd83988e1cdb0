"""The training-loop side of every load runner: same loop, same clock, same checks for every tool.

A tool plugs in a :class:`Tool`: how to build its loader, turn one of its batches into
``(input_ids, labels)`` int64 tensors, and save/restore its state. Modes:

- ``throughput``: build, time the first batch, then iterate for ``min_seconds`` (at least
  ``min_batches``, at most one epoch) and report tokens/s delivered to the loop, and tokens per CPU second
  (the CPU time of the runner and its DataLoader workers over the same stretch).
- ``epoch``: build and read exactly one epoch (with a fresh cache: a cold epoch), timed from the build to the
  last batch; tokens/s and tokens per CPU second over all of it.
- ``reference``: an uninterrupted run up to batch ``resume_at``; save the loader state there
  and digest the next ``check_batches`` batches.
- ``resume``: a fresh loader loads that state; time until the first batch; digest the next batches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from _common import args, cpu_seconds, emit, now, profiled

__all__ = ["Tool", "main"]


@dataclass
class Tool:
    """How the shared loop drives one loader implementation."""

    build: Callable[[dict[str, Any]], Any]  # args -> loader (iterable of batches)
    ids: Callable[[Any], tuple[Any, Any]]  # batch -> (input_ids, labels), int64 [B, seq_len]
    epoch_batches: Callable[[Any], int]
    state: Callable[[Any], dict[str, Any]] | None = None
    load_state: Callable[[Any, dict[str, Any]], None] | None = None
    state_note: str = ""


def _digest(input_ids: Any, labels: Any) -> str:
    h = hashlib.sha1(input_ids.contiguous().numpy().tobytes())
    h.update(labels.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _check(ids: Any, labels: Any, batch: int, seq_len: int) -> None:
    import torch

    if tuple(ids.shape) != (batch, seq_len) or ids.dtype != torch.int64 or labels.dtype != torch.int64:
        raise SystemExit(f"bad batch: {tuple(ids.shape)} {ids.dtype}, wanted ({batch}, {seq_len}) int64")


def _throughput(tool: Tool, a: dict[str, Any]) -> dict[str, Any]:
    t0 = now()
    loader = tool.build(a)
    it: Iterator[Any] = iter(loader)
    ids, labels = tool.ids(next(it))
    first = now() - t0
    _check(ids, labels, a["batch_size"], a["seq_len"])
    epoch = tool.epoch_batches(loader)
    n = 0
    t1, c1 = now(), cpu_seconds()
    limit = a.get("max_batches", 10**9)
    done = False
    while not done:  # a fast loader runs on into the next epoch until the clock has enough
        before = n
        for batch in it:
            ids, labels = tool.ids(batch)
            n += 1
            if n >= limit or (n >= a.get("min_batches", 20) and now() - t1 >= a.get("min_seconds", 3.0)):
                done = True
                break
        if n == before:
            break
        if not done:
            it = iter(loader)
    seconds, cpu = now() - t1, cpu_seconds() - c1
    tokens = n * a["batch_size"] * a["seq_len"]
    del it
    return {
        "first_batch_s": first,
        "batches": n,
        "epoch_batches": epoch,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "cpu_s": cpu,
        "tokens_per_cpu_s": tokens / cpu if cpu > 0 else 0.0,
    }


def _epoch(tool: Tool, a: dict[str, Any]) -> dict[str, Any]:
    """One whole epoch from the build on (the caller gives a fresh cache: decompressing is part of it)."""
    t0, c0 = now(), cpu_seconds()
    loader = tool.build(a)
    epoch = tool.epoch_batches(loader)
    n = 0
    first = None
    for batch in loader:
        ids, labels = tool.ids(batch)
        if first is None:
            first = now() - t0
            _check(ids, labels, a["batch_size"], a["seq_len"])
        n += 1
        if n >= epoch:
            break
    seconds, cpu = now() - t0, cpu_seconds() - c0
    tokens = n * a["batch_size"] * a["seq_len"]
    return {
        "first_batch_s": first,
        "batches": n,
        "epoch_batches": epoch,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "cpu_s": cpu,
        "tokens_per_cpu_s": tokens / cpu if cpu > 0 else 0.0,
    }


def _reference(tool: Tool, a: dict[str, Any]) -> dict[str, Any]:
    assert tool.state is not None
    loader = tool.build(a)
    epoch = tool.epoch_batches(loader)
    # 90% of the epoch, leaving room for the batches we compare
    stop = a.get("resume_at") or max(1, min(int(epoch * 0.9), epoch - a["check_batches"] - 1))
    it = iter(loader)
    t0 = now()
    for _ in range(stop):
        next(it)
    reach = now() - t0
    state = tool.state(loader)
    with open(a["state_file"], "w") as f:
        json.dump(state, f)
    digests = [_digest(*tool.ids(next(it))) for _ in range(a["check_batches"])]
    del it
    return {"stop_batch": stop, "epoch_batches": epoch, "reach_s": reach, "digests": digests}


def _resume(tool: Tool, a: dict[str, Any]) -> dict[str, Any]:
    assert tool.load_state is not None
    with open(a["state_file"]) as f:
        state = json.load(f)
    t0 = now()
    loader = tool.build(a)
    tool.load_state(loader, state)
    it = iter(loader)
    first = tool.ids(next(it))
    resume_s = now() - t0
    digests = [_digest(*first)] + [_digest(*tool.ids(next(it))) for _ in range(a["check_batches"] - 1)]
    del it
    return {"resume_s": resume_s, "digests": digests}


def main(tool: Tool) -> None:
    """Run the mode the harness asked for and print the JSON result."""
    a = args()
    modes = {"throughput": _throughput, "epoch": _epoch, "reference": _reference, "resume": _resume}
    fn = modes[a["mode"]]
    if a["mode"] != "throughput" and tool.state is None:
        emit({"unsupported": tool.state_note or "no resumable state"})
        return
    result = profiled(lambda: fn(tool, a)) if a.get("profile") else fn(tool, a)
    emit(result)
