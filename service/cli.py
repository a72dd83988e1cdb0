"""``ferry sync`` (one-shot replication between two URLs) and ``ferry serve`` (the daemon)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ferry.shard_tools.cli import parse_storage_options, print_error, print_json, printable_fields
from ferry.shard_tools.errors import DatasetNotFoundError, FerryError, ManifestError, UsageError

from .config import Config, format_rate, load_config, parse_rate, redact

if TYPE_CHECKING:  # the engine and its storage stack load only when a command needs them
    from ferry.shard_tools.storage.store import Location

    from .daemon import Daemon
    from .replication.engine import Engine
    from .replication.passes import PassResult
    from .transfer.bandwidth import Bandwidth
    from .transfer.copier import Copier
    from .transfer.executor import Executor, JobResult
    from .transfer.stats import Stats

__all__ = [
    "register",
    "add_serve_parser",
    "add_sync_parser",
    "serve_main",
    "run_until_signal",
    "SERVE_HOOKS",
    "SERVE_EXTRAS",
]

StopFn = Callable[[], None]
#: Functions ``fn(parser)`` adding options to ``ferry serve`` (the HTTP API adds its own).
SERVE_HOOKS: list[Callable[[argparse.ArgumentParser], None]] = []
#: Functions ``fn(daemon, args) -> stop_fn | None`` run after the daemon started (e.g. start uvicorn).
SERVE_EXTRAS: list[Callable[[Daemon, argparse.Namespace], StopFn | None]] = []


class _Signals:
    """SIGTERM/SIGINT set an event instead of killing the process (installed before anything starts)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        logging.getLogger("ferry.daemon").info("signal %d: stopping", signum)
        self.event.set()

    def __enter__(self) -> _Signals:
        self._old = {s: signal.signal(s, self._handler) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def run_until_signal(daemon: Daemon, stop: threading.Event | None = None) -> None:
    """Block the main thread until SIGTERM/SIGINT (or ``stop`` is set, or the daemon stops by itself)."""
    if stop is None:
        with _Signals() as signals:
            run_until_signal(daemon, signals.event)
        return
    while not stop.is_set() and not daemon.wait(0.2):
        pass


def serve_main(config: Config, args: argparse.Namespace | None = None) -> int:
    """Run the daemon (and any SERVE_EXTRAS) until a signal; stop gracefully."""
    from .daemon import Daemon

    with _Signals() as signals:
        daemon = Daemon(config)
        daemon.start()
        stops: list[StopFn] = []
        try:
            for extra in SERVE_EXTRAS:
                fn = extra(daemon, args or argparse.Namespace())
                if fn is not None:
                    stops.append(fn)
            run_until_signal(daemon, signals.event)
        finally:
            for fn in reversed(stops):
                fn()
            daemon.stop(getattr(args, "drain_timeout", 30.0))
    return 0


# C0 controls, DEL, C1 controls and the Unicode line/paragraph separators: anything a terminal or a
# log collector may take for a line break or an escape sequence.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_control(text: str) -> str:
    r"""``text`` with every control character written as an escape (``\n``, ``\x1b``, ``\u2028``)."""

    def one(m: re.Match[str]) -> str:
        ch = m.group()
        return _SHORT.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")

    return _CONTROL.sub(one, text)


class SafeFormatter(logging.Formatter):
    """One record, one line: control characters in the values a message interpolates (dataset names
    from storage, error texts from backends) are escaped, so no value can forge a log line or send a
    terminal escape. A traceback keeps its lines, each indented and escaped the same way."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's API
        return _escape_control(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indent_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indent_lines(super().formatStack(stack_info))


def _indent_lines(text: str) -> str:
    return "\n".join("    " + _escape_control(line) for line in text.splitlines())


#: Record attributes (passed with ``extra=``) that a JSON line carries when a log call sets them.
LOG_FIELDS = ("dataset", "cluster", "source", "destination", "shard", "failed_shards")
LOG_FORMATS = ("human", "json")


class JsonFormatter(logging.Formatter):
    """One record, one JSON object on one line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the :data:`LOG_FIELDS` the call passed, and ``exc`` (the traceback) if any. JSON
    escaping covers the C0 controls; ``ensure_ascii`` the C1 controls and U+2028/9; DEL is escaped
    by hand, so no value can break the line or reach a terminal raw."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in LOG_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value if isinstance(value, (list, int, float)) else str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=True, default=str).replace("\x7f", "\\u007f")


def configure_logging(level: int, library_level: int | None = None, log_format: str = "human") -> None:
    """Log to stderr through :class:`SafeFormatter` (``log_format="json"``: :class:`JsonFormatter`):
    ferry's loggers at ``level``, every other logger at ``library_level`` (default: ``level``).
    A process whose logging is set up already keeps it."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
        _log_uncaught()
    else:
        handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level if library_level is None else library_level)
    logging.getLogger("ferry").setLevel(level)


def _log_uncaught() -> None:
    """With JSON logs every stderr line is JSON: warnings and uncaught exceptions become records too."""
    logging.captureWarnings(True)
    crash = logging.getLogger("ferry.crash")

    def on_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            name = args.thread.name if args.thread is not None else "?"
            crash.critical("uncaught exception in thread %s", name, exc_info=args.exc_value)

    def on_main(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        crash.critical("uncaught exception", exc_info=(exc_type, exc, tb))

    threading.excepthook = on_thread
    sys.excepthook = on_main


def _logged_errors(args: argparse.Namespace, run: Callable[[], int]) -> int:
    """``run()``; with JSON logs a FerryError ends as one error record (same exit code), not a plain line."""
    from ferry.shard_tools.errors import FerryError

    if getattr(args, "log_format", "human") != "json":
        return run()
    try:
        return run()
    except FerryError as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        logging.getLogger(f"ferry.{args.command}").error("ferry %s: error: %s", args.command, message)
        return exc.exit_code


def _cmd_serve(args: argparse.Namespace) -> int:
    level = getattr(logging, args.log_level.upper())
    # libraries never below INFO: botocore's DEBUG prints keys
    configure_logging(level, max(level, logging.INFO), args.log_format)
    return _logged_errors(args, lambda: serve_main(load_config(args.config), args))


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``serve`` sub-command (SERVE_HOOKS add their options here)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the replication daemon",
        description="Run the replication daemon described by ferry.toml until SIGTERM or Ctrl-C "
        "(transfers in flight are allowed to finish, up to --drain-timeout).",
    )
    p.add_argument("--config", "-c", default="ferry.toml", help="path to ferry.toml (default: ./ferry.toml)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_log_format(p)
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to let transfers finish on stop")
    for hook in SERVE_HOOKS:
        hook(p)
    p.set_defaults(func=_cmd_serve)
    return p


def _add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        default="human",
        choices=LOG_FORMATS,
        help="stderr log lines: human (default) or json (one object per line: ts, level, logger, message, "
        "dataset, cluster, shard where known)",
    )


_SYNC_EXAMPLES = """examples:
  ferry sync /data/web-en s3://bucket/web-en --transfers 16
  ferry sync s3://bucket/web-en /lustre/web-en --bwlimit 500MiB/s --json
  ferry sync s3://bucket/web-en gs://bucket/web-en --engine ray --ray-address auto
  ferry sync /data/web-en /backup/web-en --verify-only
"""


def add_sync_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "sync",
        help="replicate one dataset from SRC_URL to DST_URL (one shot)",
        description=textwrap.fill(
            "Copy every shard of the source's current version that the destination lacks, verify each "
            "against the manifest digest, then publish versions/<id>.json and manifest.json at the destination. "
            "The destination only moves forward: a version that does not descend from the destination's current one "
            "(its parent chain) is refused unless --allow-rollback, and a destination another writer holds (its "
            "lease: a daemon, another ferry sync) is left alone. Exits 1 if any shard could not be copied and "
            "verified, or the publish was refused.",
            width=88,
        ),
        epilog=_SYNC_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC_URL", help="source dataset URL")
    p.add_argument("dst", metavar="DST_URL", help="destination dataset URL")
    p.add_argument("--transfers", type=int, default=4, help="concurrent shard transfers (default 4)")
    p.add_argument("--bwlimit", default=None, help="bandwidth limit, e.g. 100MiB/s (default: unlimited)")
    p.add_argument("--retries", type=int, default=5, help="attempts per shard before it fails (default 5)")
    p.add_argument(
        "--engine",
        choices=["threads", "ray"],
        default="threads",
        help="where the copies run: threads of this process (default), or ray: one Ray task per shard over the "
        "nodes of the Ray cluster at --ray-address (needs the 'ray' extra; both URLs must be storage every node "
        "reaches)",
    )
    p.add_argument(
        "--ray-address",
        default="auto",
        help="with --engine ray: 'auto' (the cluster this machine belongs to, default), HOST:PORT or ray://HOST:PORT",
    )
    p.add_argument("--verify-only", action="store_true", help="only re-hash the destination's shards; copy nothing")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument(
        "--allow-rollback",
        action="store_true",
        help="publish even if the source's version does not descend from the destination's (moves it back)",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar (TTY)")
    _add_log_format(p)
    p.add_argument("--storage-option", "-S", action="append", metavar="KEY=VALUE", help="fsspec option for both sides")
    p.add_argument("--src-option", action="append", metavar="KEY=VALUE", help="fsspec option for the source only")
    p.add_argument("--dst-option", action="append", metavar="KEY=VALUE", help="fsspec option for the destination")
    p.set_defaults(func=_cmd_sync)
    return p


def _progress_thread(stats: Stats, enabled: bool) -> tuple[threading.Event, threading.Thread | None]:
    done = threading.Event()
    if not enabled:
        return done, None
    from tqdm import tqdm

    def run() -> None:
        bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc="sync", file=sys.stderr, dynamic_ncols=True)
        seen = 0
        while not done.wait(0.2):
            snap = stats.snapshot()
            bar.total = snap.bytes_read - seen + bar.n + snap.pending_bytes if snap.pending_bytes else bar.total
            bar.update(snap.bytes_read - seen)
            seen = snap.bytes_read
            bar.set_postfix_str(
                f"{snap.transfers_in_flight} in flight, {snap.pending_shards} left, {snap.corrupt_detected} bad"
            )
        snap = stats.snapshot()
        bar.update(snap.bytes_read - seen)
        bar.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return done, t


def _cmd_sync(args: argparse.Namespace) -> int:
    configure_logging(logging.WARNING, log_format=args.log_format)
    return _logged_errors(args, lambda: _sync(args))


def _sync(args: argparse.Namespace) -> int:
    if args.transfers < 1:
        raise UsageError("--transfers must be at least 1")
    bwlimit = parse_rate(args.bwlimit, "--bwlimit")
    both = parse_storage_options(args.storage_option)
    src_options = {**both, **parse_storage_options(args.src_option)}
    dst_options = {**both, **parse_storage_options(args.dst_option)}
    t0 = time.monotonic()
    if not args.verify_only:
        from .replication.noop_check import up_to_date_header

        header = up_to_date_header(args.src, args.dst, src_options, dst_options)
        if header is not None:  # nothing to do, known without the storage stack
            from .replication.passes import PassResult

            res = PassResult.of_source("dataset", "src", "dst", header)
            res.mark_up_to_date()
            return _print_report(_report(res, args), args, t0, ok=True)

    from ferry.shard_tools.storage.store import resolve

    from .replication.engine import Engine
    from .replication.state import State
    from .transfer.bandwidth import Bandwidth
    from .transfer.executor import Executor
    from .transfer.object_store import skip_double_checksums
    from .transfer.stats import Stats

    skip_double_checksums()
    src = resolve(args.src, src_options)
    dst = resolve(args.dst, dst_options)
    names = {"src": src, "dst": dst}
    stats = Stats()
    bandwidth = Bandwidth(bwlimit)
    executor = Executor(
        transfers=args.transfers,
        bandwidth=bandwidth,
        stats=stats,
        retries=max(1, args.retries),
        copier=_copier(args, bandwidth),
    )
    # a bar is not a log line: with JSON logs only an explicit --progress draws one
    show = sys.stderr.isatty() and args.log_format != "json" if args.progress is None else args.progress
    done, thread = _progress_thread(stats, show and not args.json)
    try:
        if args.verify_only:
            report, ok = _verify_only(executor, names, args)
        else:
            engine = Engine(executor, State(None), writer="sync", allow_rollback=args.allow_rollback)
            res = _pass_following_the_source(engine, names)
            report, ok = _report(res, args), res.ok
        if args.engine == "ray":
            report["copies_by_node"] = _copies_by_node(executor.copier)
    finally:
        done.set()
        if thread is not None:
            thread.join()
        executor.copier.close()
    return _print_report(report, args, t0, ok)


def _copies_by_node(copier: Copier) -> dict[str, int]:
    """Ray node id → the copies (and re-hashes) that moved bytes there."""
    from .transfer.ray_copier import RayCopier

    return copier.transfers_by_node() if isinstance(copier, RayCopier) else {}


def _copier(args: argparse.Namespace, bandwidth: Bandwidth) -> Copier | None:
    """The Ray engine's copier for ``--engine ray`` (None: the executor's own threads)."""
    if args.engine != "ray":
        return None
    for url in (args.src, args.dst):
        if url.startswith("memory://"):
            raise UsageError(
                f"--engine ray copies in other processes, which cannot see {redact(url)} (this process' memory); "
                "use storage every node reaches"
            )
    from .config_types import TransferConfig
    from .transfer.copier import make_copier

    return make_copier(TransferConfig(engine="ray", address=args.ray_address), bandwidth, from_flags=True)


#: passes one ``ferry sync`` makes at most when its source publishes a newer version while it reads
SOURCE_MOVES = 3


def _pass_following_the_source(engine: Engine, names: dict[str, Location]) -> PassResult:
    """One pass to the source's current version; when the source publishes a newer one meanwhile (whose
    retention may prune what the pass was reading), a new pass starts at the newer one, a few times at most."""
    from .replication.engine import read_header

    for attempt in range(1, SOURCE_MOVES + 1):
        header = read_header(names["src"])
        try:
            res = engine.sync_pass("dataset", "src", "dst", names, src_header=header)
        except ManifestError:
            if attempt == SOURCE_MOVES or not _moved_on(names["src"], header):
                raise
            continue
        if res.ok or attempt == SOURCE_MOVES or not _moved_on(names["src"], header):
            return res
    raise AssertionError("unreachable: the last attempt returns or raises")


def _moved_on(src: Location, header: tuple[bytes, dict[str, Any]] | None) -> bool:
    """Whether the source's manifest.json names another version than ``header`` did."""
    from .replication.engine import read_header

    try:
        now = read_header(src)
    except FerryError:
        return False
    if now is None or header is None or now[1]["version_id"] == header[1]["version_id"]:
        return False
    was, new = header[1]["version_id"], now[1]["version_id"]
    logging.getLogger("ferry.sync").warning(
        "the source moved on from %s to %s during the pass: syncing %s", was, new, new
    )
    return True


def _print_report(report: dict[str, Any], args: argparse.Namespace, t0: float, ok: bool) -> int:
    report["seconds"] = round(time.monotonic() - t0, 3)
    if args.json:
        print_json(report)
    else:
        _print_human(report, json_logs=args.log_format == "json")
    return 0 if ok else 1


def _failures(failed: list[JobResult]) -> list[dict[str, Any]]:
    return [
        {"shard": r.job.shard.path, "error": r.error, "retryable": r.retryable, "attempts": r.attempts}
        for r in sorted(failed, key=lambda r: r.job.shard.path)
    ]


def _report(res: PassResult, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "source": redact(args.src),
        "destination": redact(args.dst),
        "version": res.version_id,
        "up_to_date": res.up_to_date,
        "published": res.published,
        "shards": res.total_shards,
        "copied": res.copied,
        "copied_bytes": res.copied_bytes,
        "verified_in_place": res.verified_in_place,
        "already_verified": res.already_verified,
        "corrupt_detected": res.corrupt_detected,
        "temps_deleted": res.temps_deleted,
        "failed": _failures(res.failed),
        "throughput_bytes_per_s": res.copied_bytes / res.seconds if res.seconds else 0.0,
    }


def _verify_only(executor: Executor, names: dict[str, Any], args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    from .replication.engine import load_version, read_header
    from .replication.planner import SourceVersion
    from .transfer.executor import Job

    header = read_header(names["src"])
    if header is None:
        raise DatasetNotFoundError(f"no manifest.json at {redact(args.src)}")
    manifest = load_version(names["src"], header[0])
    dst_header = read_header(names["dst"])
    jobs = [
        Job("dataset", manifest.version_id, s, (), "dst", verify_first=True) for s in SourceVersion.of(manifest).shards
    ]
    results = executor.run(jobs, names)
    bad = [r for r in results if not r.ok]
    for r in bad:
        r.error = r.error or ("corrupt" if r.corrupt else "missing")
    report = {
        "source": redact(args.src),
        "destination": redact(args.dst),
        "version": manifest.version_id,
        "destination_version": dst_header[1]["version_id"] if dst_header else None,
        "shards": len(jobs),
        "verified": len(results) - len(bad),
        "failed": _failures(bad),
    }
    return report, not bad and dst_header is not None and dst_header[1]["version_id"] == manifest.version_id


def _print_human(report: dict[str, Any], json_logs: bool = False) -> None:
    report = printable_fields(report)  # shard paths, versions and errors come from storage
    if "verified" in report:
        print(
            f"verified {report['verified']}/{report['shards']} shards of {report['version']} at {report['destination']}"
            f" (destination publishes {report['destination_version']})"
        )
    elif report["up_to_date"]:
        print(f"{report['destination']} already publishes {report['version']}: nothing to do")
    else:
        rate = format_rate(report["throughput_bytes_per_s"])
        print(
            f"copied {report['copied']} shards ({report['copied_bytes']:,} bytes, {rate}), verified in place "
            f"{report['verified_in_place']}, corrupt transfers detected {report['corrupt_detected']}; "
            + ("published " + report["version"] if report["published"] else "NOT published")
        )
    for f in report["failed"]:
        if json_logs:
            extra = {"source": report["source"], "destination": report["destination"], "shard": f["shard"]}
            logging.getLogger("ferry.sync").error("FAILED %s: %s", f["shard"], f["error"], extra=extra)
        else:
            print(f"FAILED {f['shard']}: {f['error']}", file=sys.stderr)


def _running_sync() -> bool:
    """True when this process runs ``ferry sync`` (its first positional argument is ``sync``)."""
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    return first == "sync"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sync`` and ``serve``."""
    if not _running_sync():  # `ferry sync` needs no web stack: importing it would be most of a no-op resync
        from .api.server import install_serve_hooks  # the HTTP API and dashboard ride along with `ferry serve`

        install_serve_hooks(SERVE_HOOKS, SERVE_EXTRAS)
    add_sync_parser(sub)
    add_serve_parser(sub)


def main(argv: list[str] | None = None) -> int:
    """``python -m service.cli sync|serve …``: the same commands without loading other packages' CLIs."""
    from ferry.shard_tools.errors import FerryError

    parser = argparse.ArgumentParser(prog="ferry")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FerryError as exc:
        print_error(args.command, exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
