"""``ferry state show | skip | diff``: what a saved loader state means, skipping samples, comparing two.

A state is read from a JSON file (what ``json.dump(loader.state_dict(), f)`` writes) or from a
``torch.distributed.checkpoint`` directory (the entry whose value is a loader state, or the one
named by ``--key``). ``skip`` always writes JSON; to use it with a DCP checkpoint, load the
checkpoint as usual and then ``loader.load_state_dict(json.load(open(OUT)))``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.shard_tools.cli import print_error, print_lines, printable
from ferry.shard_tools.errors import FerryError, StateError, UsageError

from .state import parse_state, skip_state

__all__ = ["register", "main", "read_state", "describe", "difference", "MAX_STATE_BYTES"]

#: the largest JSON state file read (a state with a 4096-source plan is a few MiB)
MAX_STATE_BYTES = 256 << 20


def read_state(path: str, key: str | None = None, *, trust_pickle: bool = False) -> dict[str, Any]:
    """The loader state in a JSON file, or in a ``torch.distributed.checkpoint`` directory (read without
    running code from it unless ``trust_pickle``: see :mod:`ferry.client.resume.dcp`)."""
    if os.path.isdir(path):
        return _from_dcp(path, key, trust_pickle)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: opening a FIFO waits for a writer
            raise UsageError(f"loader state {path} is not a regular file (a device, pipe or socket)")
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"{path} is larger than {MAX_STATE_BYTES >> 20} MiB; not a loader state")
        state = json.loads(data)
    except OSError as exc:
        raise UsageError(f"cannot read loader state {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{path} is not a JSON loader state ({exc}); pass a file written by json.dump") from None
    if key is not None:
        if not isinstance(state, Mapping) or key not in state:
            raise StateError(f"{path} has no entry {key!r}")
        state = state[key]
    return state


def _from_dcp(path: str, key: str | None, trust_pickle: bool) -> dict[str, Any]:
    from .dcp import read_dcp_state

    if trust_pickle:
        sys.stderr.write(
            f"ferry: warning: --trust-pickle: unpickling {printable(path)} with torch's loader; "
            "a crafted checkpoint runs code as you\n"
        )
    return read_dcp_state(path, key, trust_pickle=trust_pickle)


def describe(state: Mapping[str, Any]) -> list[str]:
    """What a state means, line by line: datasets and versions, position, phases and where each source stands."""
    saved = parse_state(state)
    lines = [f"loader state version {saved.version}, seq_len {saved.seq_len}, fingerprint {saved.fingerprint}"]
    where = f"epoch {saved.epoch}, {saved.consumed} samples into it"
    if saved.position is not None:
        where = f"global sample {saved.position:,} ({where})"
    lines.append(f"position: {where}")
    if saved.plan is None:
        lines.append(f"dataset: version {saved.dataset_version}, seed {saved.seed}")
    else:
        lines += _describe_plan(saved.plan, saved.position)
    for version, samples, shards, epochs in saved.eras:
        lines.append(f"era: version {version} ({samples:,} samples in {shards} shards) for {epochs} epoch(s)")
    for s in saved.skips:
        lines.append(f"skip: {s['samples']:,} samples at epoch {s['epoch']}, {s['consumed']} into it")
    return lines


def _describe_plan(plan: Mapping[str, Any], position: int | None) -> list[str]:
    from ..sampling.schedule import Schedule

    sched = Schedule([(s, q) for s, q in plan["phases"]])
    drawn = sched.drawn(position).tolist() if position is not None else None
    lines = [f"mixture of {len(plan['sources'])} sources (last re-plan at global sample {plan['anchor']:,}):"]
    for j, src in enumerate(plan["sources"]):
        ident = src["identity"]
        at = f", read {drawn[j]:,} samples of it" if drawn is not None else ""
        lines.append(
            f"  source {j}: {src['url'] or '?'} version {ident.get('dataset_version')} seed {ident.get('seed')} "
            f"shuffle {ident.get('shuffle', '-')}{at}"
        )
    for start, quota in plan["phases"]:
        total = sum(quota)
        weights = " ".join(f"{q / total:.4g}" for q in quota)
        lines.append(f"  phase from global sample {start:,}: weights {weights}")
    return lines


def difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Lines naming what differs between two states (nothing: they are the same)."""
    sa, sb = parse_state(a), parse_state(b)
    out = []
    for name in ("version", "dataset_version", "seed", "seq_len", "fingerprint", "epoch", "consumed", "position"):
        va, vb = getattr(sa, name), getattr(sb, name)
        if va != vb:
            out.append(f"{name}: {va!r} -> {vb!r}")
    pa, pb = sa.plan or {"sources": [], "phases": []}, sb.plan or {"sources": [], "phases": []}
    ka, kb = [s["key"] for s in pa["sources"]], [s["key"] for s in pb["sources"]]
    for s in pb["sources"]:
        if s["key"] not in ka:
            out.append(f"source added: {s['url'] or s['key']} version {s['identity'].get('dataset_version')}")
    for s in pa["sources"]:
        if s["key"] not in kb:
            out.append(f"source removed: {s['url'] or s['key']} version {s['identity'].get('dataset_version')}")
    if pa["phases"] != pb["phases"]:
        out.append(f"phases: {pa['phases']} -> {pb['phases']}")
    if sa.eras != sb.eras:
        out.append(f"eras: {sa.eras} -> {sb.eras}")
    if sa.skips != sb.skips:
        out.append(f"skips: {sa.skips} -> {sb.skips}")
    return out


def _write_json(path: str, doc: Any) -> None:
    """Atomically: a temp file in the same directory, flushed to disk, then renamed over ``path`` (a
    symlink at ``path`` is replaced, not written through). A path that cannot be written is a UsageError."""
    if os.path.isdir(path):
        raise UsageError(f"-o {path} is a directory; name the JSON file to write")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ferry-state-", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc} ({directory})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def _cmd_show(args: argparse.Namespace) -> int:
    state = read_state(args.file, args.key, trust_pickle=args.trust_pickle)
    if args.json:
        parse_state(state)
        sys.stdout.write(json.dumps(state, indent=1).replace("\x7f", "\\u007f") + "\n")
    else:
        print_lines(describe(state))
    return 0


def _cmd_skip(args: argparse.Namespace) -> int:
    if (args.samples is None) == (args.steps is None):
        raise UsageError("give --samples N, or --steps N with --global-batch G")
    if args.steps is not None and args.global_batch is None:
        raise UsageError("--steps needs --global-batch (samples per step over all ranks)")
    n = args.samples if args.samples is not None else args.steps * args.global_batch
    new = skip_state(read_state(args.file, args.key, trust_pickle=args.trust_pickle), n)
    _write_json(args.out, new)
    print_lines([f"wrote {args.out}: skips the next {n:,} samples"])
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    trust = args.trust_pickle
    lines = difference(
        read_state(args.a, args.key, trust_pickle=trust), read_state(args.b, args.key, trust_pickle=trust)
    )
    print_lines(lines or ["the states are the same"])
    return 1 if lines else 0


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


TRUST_PICKLE_HELP = (
    "read a torch.distributed.checkpoint with torch's own unpickler: RUNS CODE a crafted checkpoint holds; "
    "without it ferry reads only plain values and refuses anything else"
)
_EXAMPLES = """examples:
  ferry state show ckpt/step1000                   # the loader state in a DCP checkpoint
  ferry state show state.json --json               # the checked state as JSON
  ferry state skip state.json --steps 20 --global-batch 512 -o skipped.json
  ferry state diff before.json after.json          # exit 1 if they differ
"""


def _add_source(p: argparse.ArgumentParser, *files: str) -> None:
    for name in files:
        p.add_argument(name, help="JSON state file or torch.distributed.checkpoint directory")
    p.add_argument("--key", default=None, help="entry holding the loader state (in a DCP checkpoint or a JSON dict)")
    p.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ferry state``."""
    p = sub.add_parser(
        "state",
        help="show, skip or compare saved loader states",
        description=__doc__,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    show = cmds.add_parser("show", help="what a loader state means", epilog=_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _add_source(show, "file")
    show.add_argument("--json", action="store_true", help="print the checked state as JSON")
    show.set_defaults(func=_cmd_show)
    skip = cmds.add_parser("skip", help="a new state that skips the next N samples (the skip is recorded)",
                           epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _add_source(skip, "file")
    skip.add_argument("--samples", type=_positive, default=None, help="global samples to skip")
    skip.add_argument("--steps", type=_positive, default=None, help="steps to skip (with --global-batch)")
    skip.add_argument("--global-batch", type=_positive, default=None, help="samples per step over all ranks")
    skip.add_argument(
        "-o", "--out", required=True, help="where to write the new JSON state (atomically; replaces an existing file)"
    )
    skip.set_defaults(func=_cmd_skip)
    diff = cmds.add_parser("diff", help="what differs between two states (exit 1 if anything)", epilog=_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _add_source(diff, "a", "b")
    diff.set_defaults(func=_cmd_diff)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ferry.client.resume.state_cli ...``: the same as ``ferry state ...``."""
    parser = argparse.ArgumentParser(prog="ferry")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["state", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except FerryError as exc:
        print_error("state", exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
