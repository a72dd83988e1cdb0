"""A training loop for the staging tests: a mixture (or one dataset) read for ``batches`` batches, each paced by
``step_s``, with the loader told of the daemon at $FERRY_SERVICE_URL (or not, when it is unset).

    python staging_job.py SPEC.json

SPEC: ``sources`` (per source, its replica URLs), ``weights``, ``seed``, ``cache``, ``progress``, ``batches``,
``step_s``; optional ``save`` (write the loader state there after the last batch) and ``resume`` (a state file:
the loader continues it with ``replan=True``). With ``resume`` and ``ready``/``go``: once the daemon knows the
job, the state is loaded, ``ready`` gets ``{"job", "position"}`` and the loop waits for ``go`` to exist. With
``hold``: before each batch, the loop waits while that file exists (heartbeats go on meanwhile).

Writes the batches read so far to ``progress`` after each batch and, at the end, one JSON line to stdout: a digest
of every batch, the heartbeats the daemon accepted and the bytes read from each replica.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from ferry.client.stream.dataset import TokenDataset
from ferry.client.stream.loader import TokenLoader

WAIT_S = 120.0


def build(spec: dict[str, Any]) -> TokenLoader:
    parts = [
        TokenDataset(
            urls, seq_len=32, seed=spec["seed"] + k, shuffle="window", window=2, cache_dir=f"{spec['cache']}/{k}"
        )  # fmt: skip
        for k, urls in enumerate(spec["sources"])
    ]
    ds = parts[0] if len(parts) == 1 else TokenDataset.mix(parts, spec["weights"])
    return TokenLoader(ds, batch_size=4)


def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    loader = build(spec)
    if spec.get("resume"):
        if spec.get("ready"):  # the job is registered with its configured plan first: the re-plan is a change
            wait_for(lambda: loader._job is not None and loader._job.job_id is not None, "the registration")
        loader.load_state_dict(json.loads(Path(spec["resume"]).read_text()), replan=True)
        if spec.get("ready"):
            job = loader._job.job_id if loader._job else None
            Path(spec["ready"]).write_text(json.dumps({"job": job, "position": loader.position}))
            wait_for(lambda: Path(spec["go"]).exists(), "the go file")
    progress = Path(spec["progress"])
    digests: list[str] = []
    it = iter(loader)
    hold = Path(spec["hold"]) if spec.get("hold") else None
    for n in range(spec["batches"]):
        if hold is not None:
            wait_for(lambda: not hold.exists(), "the hold file to go")
        batch = next(it, None)
        if batch is None:  # the epoch ended: the next one
            it = iter(loader)
            batch = next(it)
        digests.append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16])
        progress.write_text(str(n + 1))
        time.sleep(spec["step_s"])
    if spec.get("save"):
        Path(spec["save"]).write_text(json.dumps(loader.state_dict()))
    job = loader._job
    replica_bytes = {u: r["bytes"] for u, r in loader.stats()["replicas"].items()}
    print(json.dumps({"digests": digests, "heartbeats": job.sent if job else None, "replica_bytes": replica_bytes}))


if __name__ == "__main__":
    main()
