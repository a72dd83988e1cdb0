"""``ferry lease show|break URL``: see who holds a dataset copy's writer lease, and break it.

Exit codes: 0 done, 1 error or refused (nothing broken), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ferry.shard_tools.cli import parse_storage_options, print_error, print_json
from ferry.shard_tools.errors import FerryError, UsageError, WriteConflictError

__all__ = ["register", "main"]

_EXAMPLES = """examples:
  ferry lease show s3://bucket/datasets/web-en
  ferry lease show /data/web-en --json
  ferry lease show s3://bucket/web-en -S client_kwargs.endpoint_url=http://127.0.0.1:9000
  ferry lease break /data/web-en                      # shows the lease, asks before breaking it
  ferry lease break /data/web-en --yes --if-holder daemon:host-a:4242:1a2b3c4d

A lease ends by itself when it expires (60 s after its holder's last renewal by default) or, on
the holder's own host, boot and PID namespace, as soon as its process is gone. Break one only when
its holder is stuck: a live holder finds out at its next renewal and stops copying (it publishes
nothing); `break` swaps the lease only if it is still the one it showed.
"""


def _fmt_seconds(seconds: float) -> str:
    s = abs(seconds)
    if s < 120:
        text = f"{s:.0f} s"
    elif s < 7200:
        text = f"{s / 60:.0f} min"
    elif s < 172800:
        text = f"{s / 3600:.0f} h"
    else:
        text = f"{min(s / 86400, 99999):.0f} days"
    return text


def _report(view: Any, now: float) -> dict[str, Any]:
    """What ``show`` says about a :class:`ferry.service.replication.lease.LeaseView` (JSON-ready, bounded values)."""
    from ferry.service.replication.lease import safe_text

    out: dict[str, Any] = {"url": view.url, "exists": view.exists, "size": view.size}
    info = view.info
    if not view.exists:
        return {**out, "state": "none"}
    if info is None:
        return {**out, "state": "invalid", "problem": view.problem}
    liveness, why = info.liveness()
    if info.kind == "broken":
        state = "broken"
    elif info.expires_at == 0:
        state = "released"
    elif info.expired(now):
        state = "expired"
    else:
        state = "held"
    return {
        **out, "state": state, "holder": safe_text(info.holder, 256), "kind": safe_text(info.kind, 64),
        "host": safe_text(info.host, 256), "pid": info.pid, "ns": None if info.ns is None else safe_text(info.ns),
        "boot": None if info.boot is None else safe_text(info.boot), "start": info.start,
        "acquired_at": info.acquired_at, "age_s": round(now - info.acquired_at, 3),
        "expires_at": info.expires_at,
        "expires_in_s": None if state in ("released", "broken") else round(info.expires_at - now, 3),
        "liveness": liveness, "liveness_reason": why,
    }  # fmt: skip


def _print_human(r: dict[str, Any]) -> None:
    from ferry.service.replication.lease import safe_text

    url = safe_text(r["url"], 300)
    if r["state"] == "none":
        print(f"{url}: no lease (no writer has taken one)")
        return
    if r["state"] == "invalid":
        print(f"{url}: invalid lease file ({r['problem']}); it counts as expired")
        return
    age = r["age_s"]
    acquired = f"{_fmt_seconds(age)} ago" if age >= 0 else f"{_fmt_seconds(age)} in the future (clock skew?)"
    left = r["expires_in_s"]
    if r["state"] == "held":
        expiry = f"in {_fmt_seconds(left)}"
    elif r["state"] in ("released", "broken"):
        expiry = r["state"]
    else:
        expiry = "expired" + (f" {_fmt_seconds(left)} ago" if left <= 0 else " (its holder is gone)")
    alive = {"alive": "yes", "dead": "no"}.get(r["liveness"], "cannot tell from here")
    rows = [
        ("state", r["state"]), ("holder", r["holder"]), ("kind", r["kind"]), ("host", r["host"]),
        ("pid", str(r["pid"])), ("namespace", r["ns"] or "unknown (written by an older ferry)"),
        ("boot id", r["boot"] or "unknown"), ("acquired", acquired), ("expires", expiry),
    ]  # fmt: skip
    if r["state"] not in ("released", "broken"):  # the holder of a lease that ended matters no more
        rows.append(("alive", f"{alive} ({r['liveness_reason']})"))
    print(f"lease of {url}")
    for key, value in rows:
        print(f"  {key + ':':11} {value}")


def _location(args: argparse.Namespace) -> Any:
    from ferry.shard_tools.storage.store import resolve

    return resolve(args.url, parse_storage_options(args.storage_option))


def _cmd_show(args: argparse.Namespace) -> int:
    from ferry.service.replication.lease import view_lease

    loc = _location(args)
    report = _report(view_lease(loc), time.time())
    if not loc.exists("manifest.json") and not report["exists"]:
        report["note"] = "no dataset at this URL either: check it"
    if args.json:
        print_json(report)
    else:
        _print_human(report)
        if "note" in report:
            print(f"  note: {report['note']}")
    return 0


def _confirm(args: argparse.Namespace) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise FerryError("refusing to break the lease without --yes: no terminal to ask")
    print("break this lease? [y/N] ", end="", file=sys.stderr, flush=True)  # stdout stays the report
    return sys.stdin.readline(64).strip().lower() in ("y", "yes")


def _cmd_break(args: argparse.Namespace) -> int:
    from ferry.service.replication.lease import break_lease, safe_text, view_lease

    loc = _location(args)
    view = view_lease(loc)
    report = _report(view, time.time())
    if not view.exists:
        raise FerryError(f"{safe_text(loc.url, 300)}: no lease file: nothing to break")
    if args.if_holder is not None and (view.info is None or view.info.holder != args.if_holder):
        held = report.get("holder") or f"an invalid lease ({view.problem})"
        raise FerryError(f"the lease is held by {held}, not {safe_text(args.if_holder)}: not broken")
    if report["state"] in ("released", "broken", "expired"):
        return _done(args, report, broken=False, why=f"the lease is already free ({report['state']}): nothing to break")
    if not args.json:
        _print_human(report)
        if report.get("liveness") == "alive":
            print("  warning: its holder runs on this host; it stops copying at its next renewal")
    if not _confirm(args):
        raise FerryError("not broken")
    for _ in range(3):
        try:
            break_lease(loc, view, reason="ferry lease break")
        except WriteConflictError:
            again = view_lease(loc)  # the same holder renewing it is still the lease shown; anything else is not
            same = view.info is not None and again.info is not None and again.info.holder == view.info.holder
            if not same or not again.exists:
                raise FerryError("the lease changed since it was shown (another writer took it): not broken; "
                                 "look again with ferry lease show") from None  # fmt: skip
            view = again
            continue
        return _done(args, report, broken=True, why="broken: the next writer may take it")
    raise FerryError("the lease kept changing while breaking it: not broken; try again")


def _done(args: argparse.Namespace, report: dict[str, Any], *, broken: bool, why: str) -> int:
    if args.json:
        print_json({**report, "broken": broken, "message": why})
    else:
        print(why)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ferry lease show|break``."""
    p = sub.add_parser(
        "lease", help="show or break a dataset copy's writer lease", description=__doc__, epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    cmds = p.add_subparsers(dest="lease_command", metavar="ACTION", required=True)
    for name, helptext in (("show", "who holds the lease, since when, until when"),
                           ("break", "end the lease shown, if it is still that one")):  # fmt: skip
        c = cmds.add_parser(name, help=helptext, description=helptext, epilog=_EXAMPLES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        c.add_argument("url", metavar="URL", help="the dataset copy (a destination), e.g. s3://bucket/web-en")
        c.add_argument(
            "--storage-option", "-S", action="append", metavar="KEY=VALUE",
            help="fsspec storage option for URL (repeatable; dotted keys nest, "
            "e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000)",
        )  # fmt: skip
        c.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "break":
            c.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal)")
            c.add_argument("--if-holder", metavar="ID", help="break only a lease held by ID (holder as shown)")
        c.set_defaults(func=_cmd_show if name == "show" else _cmd_break)


def main(argv: list[str] | None = None) -> int:
    """``python -m service.lease_cli show|break …``: the command without the other packages' CLIs."""
    parser = argparse.ArgumentParser(prog="ferry")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(["lease", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except UsageError as exc:
        print_error("lease", exc)
        return 2
    except FerryError as exc:
        print_error("lease", exc)
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
