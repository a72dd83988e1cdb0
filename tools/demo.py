"""``make demo``: the whole product on one machine, no credentials, no internet, in about a minute.

1. generate a small synthetic corpus (Zipf token ids, log-normal document lengths) and pack it
   into cluster "east" (a local directory under ``./demo-data``);
2. start ``ferry serve`` replicating east → "west" (bandwidth-limited so the dashboard shows it);
3. print the dashboard URL and follow the replication with ``ServiceClient``;
4. stream from the west replica with ``TokenLoader``, interrupt half-way, resume from the
   state dict in a fresh loader, and check the stream is identical to an uninterrupted one;
5. publish a second version at east (the dashboard shows it replicating) and keep serving
   until Ctrl-C (``--no-wait`` exits instead).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ferry.shard_tools.errors import FerryError, ServiceError

__all__ = ["main", "make_corpus", "write_config"]

VOCAB = 50_257
EOS = 50_256
DATASET = "demo-corpus"


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def make_corpus(tokens: int, seed: int) -> list[np.ndarray]:
    """Synthetic documents: Zipf-distributed ids below the EOS id, log-normal lengths (median ~600)."""
    rng = np.random.default_rng(seed)
    docs: list[np.ndarray] = []
    total = 0
    while total < tokens:
        n = int(min(8000, max(16, rng.lognormal(np.log(600), 0.8))))
        ids = rng.zipf(1.2, size=n) % EOS
        docs.append(ids.astype(np.uint16))
        total += n
    return docs


def write_config(root: Path, port: int, bwlimit: str, token_env: str) -> Path:
    """ferry.toml for two local clusters, east → west."""
    text = f"""# written by `make demo` (tools/demo.py)
state_dir = "state"
poll_interval = 1

[clusters.east]
url = "east"
priority = 10

[clusters.west]
url = "west"
priority = 20

[[rules]]
datasets = "*"
from = "east"
to = ["west"]

[limits]
transfers = 2
bwlimit = "{bwlimit}"

[api]
host = "127.0.0.1"
port = {port}
token_env = "{token_env}"
sla_minutes = 5
"""
    path = root / "ferry.toml"
    path.write_text(text)
    return path


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], bool], timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise FerryError(f"ferry serve exited (code {proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise FerryError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def _batch_digest(batch: dict[str, Any]) -> str:
    return hashlib.blake2b(batch["input_ids"].numpy().tobytes(), digest_size=6).hexdigest()


def stream_demo(url: str, cache: Path, steps: int, seq_len: int = 256, batch_size: int = 8) -> bool:
    """Stream ``steps`` batches, interrupt at half, resume from the state dict; True when identical."""
    from ferry.client import TokenDataset, TokenLoader

    def loader() -> Any:
        ds = TokenDataset(url, seq_len=seq_len, seed=2026, shuffle="global", cache_dir=str(cache))
        return TokenLoader(ds, batch_size=batch_size)

    reference = []
    for i, batch in enumerate(loader()):
        if i >= steps:
            break
        reference.append(_batch_digest(batch))
        if i < 3 or i == steps - 1:
            say(f"  step {i:3d}: input_ids {tuple(batch['input_ids'].shape)} digest {reference[-1]}")
        elif i == 3:
            say("  …")
    cut = steps // 2
    first = loader()
    got: list[str] = []
    for batch in first:
        got.append(_batch_digest(batch))
        if len(got) == cut:
            break
    state = first.state_dict()
    say(f"interrupt after {cut} steps; state_dict = {state}")
    second = loader()
    second.load_state_dict(state)
    for batch in second:
        if len(got) >= steps:
            break
        got.append(_batch_digest(batch))
    same = got == reference
    say(
        f"resumed in a fresh loader: steps {cut}..{steps - 1} "
        f"{'identical' if same else 'DIFFERENT'} to the uninterrupted run"
    )
    return same


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/demo.py", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--data", default="demo-data", help="working directory (recreated; default ./demo-data)")
    p.add_argument("--port", type=int, default=8765, help="dashboard port (a free one is used when busy)")
    p.add_argument("--tokens", type=int, default=12_000_000, help="corpus size in tokens (default 12M)")
    p.add_argument("--shard-size", type=int, default=1 << 20, help="raw bytes per shard (default 1 MiB)")
    p.add_argument("--bwlimit", default="2MiB/s", help="replication bandwidth limit (default 2MiB/s)")
    p.add_argument("--steps", type=int, default=20, help="loader steps to stream (default 20)")
    p.add_argument("--no-wait", action="store_true", help="exit when the demo is done instead of serving until Ctrl-C")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for replication")
    return p


class _Run:
    """One demo run: its arguments, working directory, corpus and clock."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ferry.shard_tools.packer.packing import PackOptions

        self.args = args
        self.root = Path(args.data).resolve()
        for sub in ("east", "west", "state", "cache"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        (self.root / "east").mkdir(parents=True, exist_ok=True)
        (self.root / "west").mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.east_url = str(self.root / "east" / DATASET)
        self.west_url = str(self.root / "west" / DATASET)
        self.opts = PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=args.shard_size, name=DATASET, progress=False)
        say(f"generating a {args.tokens / 1e6:.0f}M-token corpus …")
        self.docs = make_corpus(args.tokens, seed=1)

    def elapsed(self) -> str:
        return f"{time.perf_counter() - self.t0:.1f}s"

    def pack_version(self, first: bool) -> Any:
        """Three quarters of the corpus as the first version at east; the rest appended as the second."""
        from ferry.shard_tools.packer.packing import PackOptions, pack_documents

        cut = len(self.docs) * 3 // 4
        if first:
            return pack_documents(self.docs[:cut], self.east_url, self.opts)
        return pack_documents(self.docs[cut:], self.east_url, PackOptions(**{**self.opts.__dict__, "append": True}))

    def start_serve(self) -> tuple[subprocess.Popen[bytes], str, str, Path]:
        """``ferry serve`` on the demo's config: (process, base URL, token, token file)."""
        port = self.args.port if self.args.port and _port_free(self.args.port) else _free_port()
        token_env = "FERRY_DEMO_TOKEN"
        token = os.environ.get(token_env) or secrets.token_urlsafe(18)
        token_file = self.root / "api-token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        config = write_config(self.root, port, self.args.bwlimit, token_env)
        serve = subprocess.Popen(
            [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config)],
            cwd=self.root,
            env={**os.environ, token_env: token},
        )
        return serve, f"http://127.0.0.1:{port}", token, token_file


def _west_has(client: Any, version: str) -> Callable[[], bool]:
    """A check that west publishes ``version``, printing west's progress each time it is asked."""

    def check() -> bool:
        try:
            cell = client.replicas().cell(DATASET, "west")
        except ServiceError:
            return False
        if cell is None:
            return False
        say(f"  west: {cell.percent:5.1f}% ({cell.verified_shards}/{cell.total_shards} shards, {cell.state})")
        return bool(cell.published_version == version)

    return check


def _stop(serve: subprocess.Popen[bytes]) -> None:
    if serve.poll() is None:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


def main(argv: list[str] | None = None) -> int:
    from ferry.client.service.service_client import ServiceClient

    run = _Run(_parser().parse_args(argv))
    args = run.args
    res = run.pack_version(first=True)
    say(
        f"packed {res.documents} documents, {res.tokens / 1e6:.1f}M tokens into {res.shards} shards "
        f"({res.stored_bytes / 2**20:.1f} MiB) at east: {run.east_url}  [{run.elapsed()}]"
    )
    serve, base, token, token_file = run.start_serve()
    client = ServiceClient(base, token=token)
    code = 1
    try:
        _wait("the API", client.healthy, 30, serve)
        say(f"dashboard: {base}/   (control token in {token_file})")
        say(f"ferry serve is replicating east → west at ≤ {args.bwlimit}; try: ferry status --server {base}")
        _wait("west to hold a complete replica", _west_has(client, res.version_id), args.timeout, serve)
        say(f"west replica published: {run.west_url}  [{run.elapsed()}]")
        say(f"streaming {args.steps} steps from the west replica with TokenLoader …")
        code = 0 if stream_demo(run.west_url, run.root / "cache", args.steps) else 1
        res2 = run.pack_version(first=False)
        say(f"published a second version at east ({res2.new_shards} new shards): watch it replicate on the dashboard")
        if args.no_wait:
            _wait("the second version at west", _west_has(client, res2.version_id), args.timeout, serve)
            say(f"done in {run.elapsed()}")
            return code
        say(f"dashboard stays up at {base}/ — press Ctrl-C to stop")
        serve.wait()
    except KeyboardInterrupt:
        say("stopping")
    finally:
        client.close()
        _stop(serve)
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except FerryError as exc:
        print(f"[demo] error: {exc}", file=sys.stderr)
        sys.exit(1)
