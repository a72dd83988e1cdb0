"""``ferry status``: the replica matrix, transfers and errors of a running service, as a terminal table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any, TextIO

from ferry.shard_tools.cli import printable
from ferry.shard_tools.cli import printable_fields as _printable_fields
from ferry.shard_tools.errors import ServiceError
from ferry.shard_tools.units import format_bytes

from .job_types import Job
from .service_client import DEFAULT_SERVER, ServiceClient
from .service_types import ErrorEntry, ReplicaMatrix, Status, Transfer

__all__ = ["printable", "register", "render_status"]


def _bytes(n: float | None) -> str:
    return "—" if n is None else format_bytes(n)


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right or set()
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _bar(pct: float, width: int = 20) -> str:
    filled = round(width * max(0.0, min(100.0, pct)) / 100)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _cell_text(matrix: ReplicaMatrix, dataset: str, cluster: str) -> str:
    c = matrix.cell(dataset, cluster)
    if c is None:
        return "–"
    if c.role == "source":
        return "source"
    text = f"{c.percent:5.1f}% {c.state}"
    if c.lag_seconds:
        text += f" lag {_dur(c.lag_seconds)}"
    return text


def render_status(
    server: str,
    status: Status,
    matrix: ReplicaMatrix,
    transfers: list[Transfer],
    errors: list[ErrorEntry],
    jobs: list[Job] | None = None,
) -> str:
    """The whole ``ferry status`` screen as text; strings from the server are shown ``printable``."""
    server = printable(server)
    status, matrix = _printable_fields(status), _printable_fields(matrix)
    transfers, errors = _printable_fields(transfers), _printable_fields(errors)
    jobs = _printable_fields(jobs or [])
    state = "paused" if status.paused else ("syncing" if status.transfers_in_flight else "idle")
    lines = [
        f"ferry status — {server}",
        f"{state} · {_bytes(status.rate_bps)}/s · {status.transfers_in_flight} in flight · "
        f"pending {_bytes(status.pending_bytes)} ({status.pending_shards} shards) · ETA {_dur(status.eta_seconds)} · "
        f"copied {_bytes(status.copied_bytes_total)} · errors {status.open_errors}",
        "",
    ]
    if matrix.datasets:
        rows = [[ds, *(_cell_text(matrix, ds, cl) for cl in matrix.clusters)] for ds in matrix.datasets]
        lines += _table(["DATASET", *matrix.clusters], rows)
    else:
        lines.append("no datasets yet")
    lines.append("")
    if transfers:
        rows = [
            [
                f"{t.dataset}/{t.shard.rsplit('/', 1)[-1]}",
                f"{t.source}->{t.destination}",
                f"{_bar(t.percent)} {t.percent:5.1f}%",
                f"{_bytes(t.rate_bps)}/s",
            ]
            for t in transfers
        ]
        lines += [f"TRANSFERS ({len(transfers)})", *_table(["SHARD", "LINK", "PROGRESS", "RATE"], rows, right={3})]
    else:
        lines.append("no transfers in flight")
    if errors:
        rows = [
            [str(e.id), f"{e.dataset}/{e.shard.rsplit('/', 1)[-1]}", e.cluster, str(e.attempts), e.reason[:80]]
            for e in errors
        ]
        lines += ["", f"ERRORS ({len(errors)})", *_table(["ID", "SHARD", "CLUSTER", "TRIES", "REASON"], rows)]
    if jobs:
        lines += ["", f"JOBS ({len(jobs)})", *_jobs_table(jobs)]
    return "\n".join(lines) + "\n"


def _jobs_table(jobs: list[Job]) -> list[str]:
    """One row per registered loader: job and rank, what it reads (dataset@version, from which replica),
    where it stands, how fast, and the share of its time it waited on data."""
    rows = []
    for j in jobs:
        reads = ", ".join(f"{s.dataset or s.replica}@{s.version[:12]}" for s in j.sources)
        replica = ", ".join(sorted({s.cluster or s.replica for s in j.sources}))
        rows.append([
            j.name, f"{j.rank}/{j.world_size}", reads[:60], replica[:40], str(j.position),
            f"{j.samples_per_second:.0f}/s", f"{100 * j.stats.stall_share:.1f}%",
        ])  # fmt: skip
    return _table(["JOB", "RANK", "READS", "REPLICA", "POSITION", "RATE", "STALL"], rows, right={4, 5, 6})


def _snapshot(client: ServiceClient) -> tuple[Status, ReplicaMatrix, list[Transfer], list[ErrorEntry], list[Job]]:
    return client.status(), client.replicas(), client.transfers(), client.errors(limit=20), _jobs(client)


def _jobs(client: ServiceClient) -> list[Job]:
    try:
        return client.jobs()
    except ServiceError as exc:
        if exc.status == 404:  # a service without the jobs API
            return []
        raise


def _show(client: ServiceClient, as_json: bool, out: TextIO) -> None:
    status, matrix, transfers, errors, jobs = _snapshot(client)
    if as_json:
        doc: dict[str, Any] = {
            "server": client.base_url,
            "status": dataclasses.asdict(status),
            "replicas": dataclasses.asdict(matrix),
            "transfers": [dataclasses.asdict(t) for t in transfers],
            "errors": [dataclasses.asdict(e) for e in errors],
            "jobs": [dataclasses.asdict(j) for j in jobs],
        }
        out.write(json.dumps(doc, indent=2).replace("\x7f", "\\u007f") + "\n")  # ASCII: no raw DEL either
    else:
        out.write(render_status(client.base_url, status, matrix, transfers, errors, jobs))
    out.flush()


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        return _status(args)
    except ServiceError as exc:  # its message quotes the server's answer: printed on the terminal as well
        raise ServiceError(printable(str(exc)), status=exc.status) from exc


def _status(args: argparse.Namespace) -> int:
    token = args.token or (os.environ.get(args.token_env) if args.token_env else None)
    with ServiceClient(args.server, token=token, timeout=args.timeout) as client:
        if not args.watch:
            _show(client, args.json, sys.stdout)
            return 0
        try:
            while True:
                if not args.json and sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")  # clear the screen between frames
                _show(client, args.json, sys.stdout)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ferry status``."""
    p = sub.add_parser(
        "status",
        help="show replication status of a running ferry service",
        description="Print the dataset × cluster replica matrix, transfers in flight and open errors of a running "
        "`ferry serve`.",
    )
    p.add_argument(
        "--server",
        default=None,
        help=f"base URL of the service (default: $FERRY_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument("--token", default=None, help="bearer token (when the service protects reading)")
    p.add_argument(
        "--token-env",
        default="FERRY_API_TOKEN",
        help="environment variable holding the token (default: FERRY_API_TOKEN)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes with --watch (default 2)")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds (default 10)")
    p.set_defaults(func=_cmd_status)
