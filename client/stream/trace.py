"""Provenance: which documents a step's samples were cut from (``ferry trace``, ``TokenLoader.trace``).

For stream positions: each sample's source (in a mixture), dataset version, sample id and
token range of the dataset's stream, and for each document it overlaps: shard, global
document index, the token range inside the document (EOS included, as stored), and, when the
dataset recorded it at pack time (columns ``origin_file`` / ``origin_row``), the input file and
row (JSONL: line) of the document. Datasets packed before provenance simply have no origin.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.shard_tools.cli import print_error, print_lines
from ferry.shard_tools.errors import FerryError, InvalidValueError, UsageError

from .. import checks
from ..resume.state import MAX_POSITION

__all__ = [
    "POSITION_LIMIT",
    "trace_positions",
    "step_positions",
    "batch_positions",
    "check_positions",
    "register",
    "main",
]

#: exclusive bound of a stream position, the one a loader state holds (and of the step
#: ``TokenLoader.trace(step=)`` takes): sample and token arithmetic stays inside int64 below it
POSITION_LIMIT = MAX_POSITION


def check_positions(positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """``positions`` as int64, each an integer in ``[0, POSITION_LIMIT)`` (never a bool or a float)."""
    try:
        pos = np.asarray(positions)
    except (TypeError, ValueError, OverflowError):
        pos = np.asarray([], dtype=object)
    ok = pos.ndim == 1 and (pos.size == 0 or pos.dtype.kind in "iu" or (pos.dtype == object and all(
        isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_)) for p in pos.tolist())))  # fmt: skip
    if not ok:
        raise UsageError(f"positions must be a list of integers, got {checks.show(positions)}")
    values = [int(p) for p in pos.tolist()]
    bad = [p for p in values if not 0 <= p < POSITION_LIMIT]
    if bad:
        raise InvalidValueError(f"stream positions must lie in [0, 2**62), got {checks.show(bad[0])}")
    return np.asarray(values, dtype=np.int64)


def step_positions(
    step: int, global_batch: int, *, rank: int | None = None, batch_size: int | None = None
) -> np.ndarray:
    """Stream positions of global step ``step`` (all ``global_batch`` of them, or rank ``rank``'s
    ``batch_size``), each bound checked as :meth:`TokenLoader.trace` checks its ``step``."""
    g = checks.integer("--global-batch", global_batch, 1)
    step = checks.integer("--step", step, 0, POSITION_LIMIT)
    if (step + 1) * g > POSITION_LIMIT:
        raise InvalidValueError(f"--step {step} × --global-batch {g} is beyond the last stream position (2**62)")
    return batch_positions(step * g, g, rank=rank, batch_size=batch_size)


def batch_positions(
    first: int, global_batch: int, *, rank: int | None = None, batch_size: int | None = None
) -> np.ndarray:
    """Stream positions of the global batch that starts at position ``first`` (or of rank ``rank``'s part)."""
    g = checks.integer("--global-batch", global_batch, 1)
    first = checks.integer("position", first, 0, POSITION_LIMIT)
    if first + g > POSITION_LIMIT:
        raise InvalidValueError(f"a global batch of {g} from position {first} is beyond the last one (2**62)")
    if rank is None:
        if batch_size is not None:
            raise UsageError("--batch-size goes with --rank (the samples of one rank)")
        return check_positions(np.arange(first, first + g, dtype=np.int64))
    if batch_size is None:
        raise UsageError("--rank needs --batch-size (samples per rank), a divisor of --global-batch")
    b = checks.integer("--batch-size", batch_size, 1, g + 1)
    if g % b:
        raise UsageError(f"--batch-size {b} does not divide --global-batch {g}")
    rank = checks.integer("--rank", rank, 0, g // b)
    return check_positions(np.arange(first + rank * b, first + (rank + 1) * b, dtype=np.int64))


def trace_positions(ds: Any, positions: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """One record per stream position of ``ds`` (a TokenDataset or MixedDataset)."""
    pos = check_positions(positions)
    if hasattr(ds, "schedule"):  # a mixture: each position's source, then that source's own trace
        src, idx = ds.schedule.locate(pos)
        out = []
        for p, j, i in zip(pos.tolist(), src.tolist(), idx.tolist(), strict=True):
            (rec,) = trace_positions(ds.source_at(j), [i])
            out.append({"position": p, "source": j, "source_position": i, **_drop(rec, "position")})
        return out
    # one position at a time: positions far apart would make sample_ids walk every epoch between them
    return [_trace_one(ds, p, int(ds.sample_ids(pos[i : i + 1])[0])) for i, p in enumerate(pos.tolist())]


def _drop(rec: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != key}


def _trace_one(ds: Any, position: int, sample: int) -> dict[str, Any]:
    reader = ds.reader
    if ds.mode == "document":
        s = int(reader.shard_of_document(np.asarray([sample]))[0])
        local = sample - int(reader.doc_offsets[s])
        view = reader.view(s)
        length = int(view.offsets[local + 1] - view.offsets[local])
        a = int(ds.manifest.shards.token_offsets[s]) + int(view.offsets[local])
        pieces = [_piece(ds, s, local, 0, min(length, ds.seq_len + 1))]
        return _record(ds, position, sample, a, a + pieces[0]["doc_tokens"][1], pieces)
    a = sample * ds.seq_len
    b = a + ds.seq_len + 1
    pieces = []
    s = int(reader.shard_of_token(np.asarray([a]))[0])
    offsets = ds.manifest.shards.token_offsets
    while s < len(offsets) - 1 and int(offsets[s]) < b:
        base = int(offsets[s])
        starts = reader.view(s).offsets
        first = int(np.searchsorted(starts, max(a - base, 0), side="right")) - 1
        last = int(np.searchsorted(starts, b - base, side="left"))
        for d in range(max(first, 0), min(last, len(starts) - 1)):
            lo, hi = int(starts[d]) + base, int(starts[d + 1]) + base
            pieces.append(_piece(ds, s, d, max(a, lo) - lo, min(b, hi) - lo))
        s += 1
    return _record(ds, position, sample, a, b, pieces)


def _record(ds: Any, position: int, sample: int, a: int, b: int, pieces: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "position": position,
        "url": ds.url,
        "dataset_version": ds.version_id,
        "sample": sample,
        "tokens": [a, b],
        "documents": pieces,
    }


def _piece(ds: Any, s: int, local: int, x: int, y: int) -> dict[str, Any]:
    """Document ``local`` of shard ``s``, tokens ``[x, y)`` of it, with its origin when the shard has one."""
    view = ds.reader.view(s)
    piece: dict[str, Any] = {
        "shard": s,
        "path": ds.manifest.shards.paths[s],
        "document": int(ds.reader.doc_offsets[s]) + local,
        "shard_document": local,
        "doc_tokens": [x, y],
    }
    names = view.table.column_names
    if "origin_file" in names and "origin_row" in names:
        piece["file"] = view.table.column("origin_file")[local].as_py()
        piece["row"] = view.table.column("origin_row")[local].as_py()
    return piece


# --- ferry trace --------------------------------------------------------------------------------------------------


def _dataset_from(args: argparse.Namespace, state: dict[str, Any] | None) -> Any:
    """The dataset to trace: the state's mixture (its plan names URLs and settings), or --data with the flags."""
    from .dataset import TokenDataset

    common = {"cache_dir": args.cache_dir}
    from ..resume.state import parse_state

    plan = parse_state(state).plan if state is not None else None
    if plan is not None and not args.data:
        if args.weights:
            raise UsageError("the state's plan sets the mixture's weights; drop --weights (or name --data)")
        sources = []
        for src in plan["sources"]:
            ident = src["identity"]
            if src["url"] is None or "sources" in ident:
                raise UsageError("the state's mixture has a source without a URL (a nested mixture); pass --data")
            sources.append(
                TokenDataset(
                    src["url"],
                    seq_len=ident["seq_len"],
                    seed=ident["seed"],
                    shuffle=ident["shuffle"],
                    window=ident.get("window", 8),
                    mode=ident["mode"],
                    version=ident["dataset_version"],
                    **common,
                )  # fmt: skip
            )
        # the sources as the plan names them, read with the plan's phases as they are
        return TokenDataset.mix(sources, [1] * len(sources)).with_plan(plan)
    if not args.data:
        raise UsageError("name the dataset(s) with --data URL (a single dataset's state does not record its URL)")
    seed = args.seed if state is None else state["seed"]
    seq_len = args.seq_len if state is None else state["seq_len"]
    for flag, given, saved in (("--seed", args.seed, seed), ("--seq-len", args.seq_len, seq_len)):
        if given is not None and given != saved:
            raise UsageError(f"{flag} {given} contradicts the state's {saved}; drop {flag}")
    if seed is None or seq_len is None:
        raise UsageError("without --state, give --seed and --seq-len (and --shuffle, --window, --mode if not default)")
    dss = [
        TokenDataset(u, seq_len=seq_len, seed=seed, shuffle=args.shuffle, window=args.window, mode=args.mode, **common)
        for u in args.data
    ]
    if len(dss) == 1:
        if args.weights:
            raise UsageError("--weights mixes two or more --data datasets; one was given")
        return dss[0]
    return TokenDataset.mix(dss, args.weights or [1] * len(dss))


def _positions(args: argparse.Namespace, position: int) -> np.ndarray:
    if args.step is None and args.state is None:
        raise UsageError("give --step N (or --state FILE for the step after it)")
    if args.step is not None:
        return step_positions(args.step, args.global_batch, rank=args.rank, batch_size=args.batch_size)
    return batch_positions(position, args.global_batch, rank=args.rank, batch_size=args.batch_size)


def _cmd_trace(args: argparse.Namespace) -> int:
    from ..resume.state import parse_state
    from ..resume.state_cli import read_state
    from .loader import TokenLoader

    state = read_state(args.state, args.key, trust_pickle=args.trust_pickle) if args.state else None
    if args.media:
        return _cmd_trace_media(args, state)
    saved = parse_state(state) if state is not None else None
    ds = _dataset_from(args, state)
    loader = TokenLoader(ds, batch_size=1, rank=0, world_size=1)
    if saved is not None and saved.plan is not None and not args.data:
        position = saved.position or 0  # the rebuilt mixture already reads with the state's plan
    elif state is not None:
        loader.load_state_dict(state)
        position = loader.position
    records = loader.trace(_positions(args, position if state is not None else 0))
    if args.json:
        sys.stdout.write(json.dumps(records, indent=1).replace("\x7f", "\\u007f") + "\n")
        return 0
    lines = []
    for r in records:
        src = f"source {r['source']} " if "source" in r else ""
        lines.append(f"global sample {r['position']}: {src}{r['url']} version {r['dataset_version']} "
                     f"sample {r['sample']} tokens [{r['tokens'][0]}, {r['tokens'][1]})")  # fmt: skip
        for d in r["documents"]:
            origin = f"  from {d['file']}:{d['row']}" if "file" in d else ""
            lines.append(f"  shard {d['shard']} document {d['document']} "
                         f"tokens [{d['doc_tokens'][0]}, {d['doc_tokens'][1]}){origin}")  # fmt: skip
    print_lines(lines)
    return 0


def _cmd_trace_media(args: argparse.Namespace, state: dict[str, Any] | None) -> int:
    """``ferry trace --media``: the sequences of a media loader (``MediaLoader``) and the media items they carry."""
    from ..media.trace import source_for, trace_lines, trace_media

    settings = {"seq_len": args.seq_len, "seed": args.seed, "max_images": args.max_images,
                "max_frames": args.max_frames, "weights": args.weights}  # fmt: skip
    source = source_for(args.data, state, settings)
    records = trace_media(source, _positions(args, source.start).tolist())
    if args.json:
        sys.stdout.write(json.dumps(records, indent=1).replace("\x7f", "\\u007f") + "\n")
    else:
        print_lines(trace_lines(records))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ferry trace``."""
    from ..resume.state_cli import TRUST_PICKLE_HELP

    p = sub.add_parser(
        "trace",
        help="which documents the samples of a training step came from",
        description="For a loader state (the next step, or --step) or a (seed, config, step, rank): each sample's "
        "dataset version, shard, documents and token ranges, and the input file and row of each document when "
        "the dataset recorded them.",
        epilog="examples:\n"
        "  ferry trace --state ckpt/step1000 --global-batch 512            # the step after the checkpoint\n"
        "  ferry trace --state state.json --data s3://b/ds --global-batch 512 --step 70 --rank 3 --batch-size 64\n"
        "  ferry trace --data s3://b/ds --seed 0 --seq-len 2048 --global-batch 512 --step 70 --json\n"
        "  ferry trace --media --state media.json --data ./ds/text --data ./ds/pairs --global-batch 64  # MediaLoader",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state", help="loader state: JSON file or torch.distributed.checkpoint directory")
    p.add_argument("--key", help="entry of the state in a DCP checkpoint or JSON dict")
    p.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    p.add_argument("--data", action="append", default=[], help="dataset URL (repeat for a mixture)")
    p.add_argument("--weights", type=float, nargs="+", help="mixture weights, one per --data")
    p.add_argument("--seed", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--shuffle", default="global", choices=["global", "window", "none"])
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--mode", default="tokens", choices=["tokens", "document"])
    p.add_argument("--global-batch", type=int, required=True, help="samples per step over all ranks")
    p.add_argument("--step", type=int, help="step number (positions step*G ..); default: the state's next step")
    p.add_argument("--rank", type=int, help="only this rank's samples (with --batch-size)")
    p.add_argument("--batch-size", type=int, help="samples per rank")
    p.add_argument("--media", action="store_true", help="a MediaLoader's sequences and the media items they carry")
    p.add_argument("--max-images", type=int, help="--media without --state: the images cap per sequence")
    p.add_argument("--max-frames", type=int, help="--media without --state: the video frames cap per sequence")
    p.add_argument("--cache-dir", help="shard cache (default: $FERRY_CACHE_DIR or ~/.cache/ferry/shards)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_trace)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ferry.client.stream.trace ...``: the same as ``ferry trace ...``."""
    parser = argparse.ArgumentParser(prog="ferry")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["trace", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except FerryError as exc:
        print_error("trace", exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
