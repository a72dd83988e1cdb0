"""``ferry sync`` (one-shot replication) and ``ferry serve`` (the daemon)."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from typing import Any

from .config import Config, load_config
from .daemon import Daemon

__all__ = ["register", "add_serve_parser", "serve_main", "run_until_signal", "SERVE_HOOKS", "SERVE_EXTRAS"]

StopFn = Callable[[], None]
#: Functions ``fn(parser)`` adding options to ``ferry serve`` (the HTTP API adds its own).
SERVE_HOOKS: list[Callable[[argparse.ArgumentParser], None]] = []
#: Functions ``fn(daemon, args) -> stop_fn | None`` run after the daemon started (e.g. start uvicorn).
SERVE_EXTRAS: list[Callable[[Daemon, argparse.Namespace], StopFn | None]] = []


def run_until_signal(daemon: Daemon) -> None:
    """Block the main thread until SIGTERM/SIGINT (or the daemon stops by itself)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set() and daemon.running:
            stop.wait(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def serve_main(config: Config, args: argparse.Namespace | None = None) -> int:
    """Run the daemon (and any SERVE_EXTRAS) until a signal; stop gracefully."""
    daemon = Daemon(config)
    daemon.start()
    stops: list[StopFn] = []
    try:
        for extra in SERVE_EXTRAS:
            fn = extra(daemon, args or argparse.Namespace())
            if fn is not None:
                stops.append(fn)
        run_until_signal(daemon)
    finally:
        for fn in reversed(stops):
            fn()
        daemon.stop()
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    return serve_main(load_config(args.config), args)


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the replication daemon", description="Run the replication daemon described by ferry.toml."
    )
    p.add_argument("--config", "-c", default="ferry.toml", help="path to ferry.toml (default: ./ferry.toml)")
    for hook in SERVE_HOOKS:
        hook(p)
    p.set_defaults(func=_cmd_serve)
    return p


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sync`` and ``serve``."""
    add_serve_parser(sub)
