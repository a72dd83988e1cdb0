"""Runner: a ferry mixture of several sources, single-phase or scheduled (ferry's venv).

``mode="throughput"``: samples/s over ``batches`` batches of a mixture of ``data`` with ``phases``
phases spread over the measured positions (1 = a plain weighted mixture), after one warm pass
that fills the node-local cache. ``mode="resume"``: a state deep in the last of ``phases`` phases
(at global sample ``position``) loaded into a new loader: mixture set-up, ``load_state_dict`` and
the first batch, timed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from _common import args, emit, now

# the checkout this runner belongs to, ahead of an installed ferry (schedules are newer than some installs)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ferry.client import TokenDataset, TokenLoader  # noqa: E402

# a few weight vectors for 8 sources (small integers: short periods), cycled through the phases
WEIGHTS = [[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1], [1, 0, 2, 0, 3, 0, 4, 5], [3, 1, 1, 1, 1, 1, 1, 3]]


def _schedule(k: int, phases: int, span: int) -> Any:
    weights = [(w * k)[:k] for w in WEIGHTS]
    if phases == 1:
        return weights[0]
    return [(i * span // phases, weights[i % len(weights)]) for i in range(phases)]


def _loader(a: dict[str, Any], phases: int, span: int) -> TokenLoader:
    sources = [
        TokenDataset(u, seq_len=a["seq_len"], seed=i, shuffle="global", cache_dir=a["cache_dir"])
        for i, u in enumerate(a["data"])
    ]
    mixed = TokenDataset.mix(sources, _schedule(len(sources), phases, span))
    return TokenLoader(mixed, batch_size=a["batch_size"], num_workers=0, rank=0, world_size=1)


def _throughput(a: dict[str, Any]) -> dict[str, Any]:
    span = a["batches"] * a["batch_size"]
    for _ in range(2):  # the first pass warms the cache; the second is timed
        loader = _loader(a, a["phases"], span)
        t0, c0 = now(), time.process_time()
        left = a["batches"]
        while left:  # one iter() per epoch of the mixture
            for _ in zip(range(left), loader, strict=False):
                left -= 1
        elapsed, cpu = now() - t0, time.process_time() - c0
    samples = a["batches"] * a["batch_size"]
    # per CPU second too: on a shared machine wall time mostly measures the neighbours
    return {
        "samples_per_s": samples / elapsed,
        "samples_per_cpu_s": samples / cpu,
        "tokens_per_s": samples * a["seq_len"] / elapsed,
    }


def _resume(a: dict[str, Any]) -> dict[str, Any]:
    phases, position = a["phases"], a["position"]
    span = position + 1  # the last phase starts before the state's position
    state = _loader(a, phases, span).state_dict()
    state["position"] = position
    t0 = now()
    loader = _loader(a, phases, span)
    setup = now() - t0
    loader.load_state_dict(state)
    next(iter(loader))
    return {"setup_s": setup, "resume_s": now() - t0}


if __name__ == "__main__":
    a = args()
    emit(_throughput(a) if a["mode"] == "throughput" else _resume(a))
