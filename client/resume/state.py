"""The loader state: a small, versioned, JSON-serialisable dict, and its checks.

Version 1 (what a run that never changed its data plan writes, as every ferry before):
``{"version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint"}``.
``consumed`` counts global samples of epoch ``epoch`` delivered to the training loop;
world size, workers and batch size are deliberately absent, so a state loads into any
of them. ``fingerprint`` digests everything else that fixes the sample order (shuffle
mode, window, document mode, mixing weights or schedule, dataset versions, seeds, seq_len)
of the loader that wrote it.

Version 2 adds the history of a changing data plan, always with the same keys and no dict inside
a list (``torch.distributed.checkpoint`` flattens those into keys, so a checkpoint would then
only load into a loader with the same number of sources or skips):

- ``position``: global samples delivered over the whole run (``epoch``/``consumed`` then only
  describe it; after a skip ``consumed`` may exceed an epoch);
- ``plan``: a mixture's sources ``[key, url, identity as canonical JSON, eras]`` (url as
  :func:`ferry.client.fetching.replicas.shown` prints it, without credentials; key = fingerprint of
  the identity plus ``#k`` for its ``k``-th occurrence; eras as below, for a source continued on a
  newer version) and its phases ``[start, quota per source]`` over the
  whole run; ``anchor`` is where the last re-plan happened (phases from it on are the loader's own
  configuration, those before it history); ``null`` for a single dataset;
- ``eras``: the earlier dataset versions of a single dataset ``[version, samples, shards, epochs]``:
  the first ``epochs`` epochs had ``samples`` samples in the first ``shards`` shards;
- ``skips``: ``[epoch, consumed, samples]`` for every ``ferry state skip`` (where it was made, and
  how many samples it skipped). Skipping a version-1 state leaves ``position`` null (the state does not
  know an epoch's length): the loader then continues at ``epoch * n + consumed``, past the epoch's end
  if the skip went there.

A state comes from a file: every field is checked for its type and range before it is
used (even with ``strict=False``, which only skips the comparison with this loader).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.shard_tools.errors import StateError
from ferry.shard_tools.format.digest import ALGORITHM, digest_bytes

from ..checks import COUNT_LIMIT, SEED_LIMIT, bound, show
from ..fetching.replicas import shown
from ..sampling.mixing import MAX_PERIOD
from ..sampling.schedule import MAX_PHASES

__all__ = ["STATE_VERSION", "MAX_POSITION", "SavedState", "fingerprint", "make_state", "parse_state", "skip_state"]

STATE_VERSION = 2
MAX_POSITION = 2**62  # a stream position plus an epoch's samples stays far inside int64
MAX_SKIPS = 10_000
MAX_ERAS = 1_000
_KEYS_V1 = ("version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint")
_KEYS_V2 = (*_KEYS_V1, "position", "plan", "eras", "skips")
_MAX_NESTING = 8  # mixtures of mixtures, as deep as a real configuration goes
_VERSION_ID = re.compile(r"[0-9A-Za-z._-]{1,128}")
_FINGERPRINT = re.compile(ALGORITHM + r":[0-9a-f]{32}")
_SOURCE_KEY = re.compile(ALGORITHM + r":[0-9a-f]{32}#[0-9]{1,4}")


def fingerprint(identity: Mapping[str, Any]) -> str:
    """Digest of the canonical JSON of a dataset's identity (what fixes the sample order)."""
    return digest_bytes(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode())


@dataclass(frozen=True)
class SavedState:
    """A checked state: the fields of either version, ``position`` None for version 1 (it needs ``n``)."""

    version: int
    dataset_version: Any
    seed: Any
    seq_len: int
    epoch: int
    consumed: int
    fingerprint: str
    position: int | None = None
    plan: dict[str, Any] | None = None
    eras: list[list[Any]] = field(default_factory=list)
    skips: list[dict[str, int]] = field(default_factory=list)

    def stream_position(self, n: int, *, strict: bool) -> int:
        """Where the run stands: ``position``, or for a version-1 state ``epoch * n + consumed``."""
        if self.position is not None:
            return self.position
        if strict and self.consumed > n and not self.skips:
            raise StateError(f"loader state has consumed={self.consumed} but an epoch has only {n} samples")
        position = self.epoch * n + (self.consumed if self.skips else min(self.consumed, n))
        if position + n > MAX_POSITION:
            raise StateError(
                f"loader state epoch={self.epoch}, consumed={self.consumed} is out of range: with {n} samples per "
                "epoch epoch*n + consumed must stay below 2**62 - n; the state is corrupt"
            )
        return position


def make_state(
    identity: Mapping[str, Any],
    position: int,
    span: tuple[int, int, int],
    *,
    plan: dict[str, Any] | None = None,
    eras: Sequence[Sequence[Any]] = (),
    skips: Sequence[Mapping[str, int]] = (),
) -> dict[str, Any]:
    """The state at stream ``position`` (``span``: its epoch, the epoch's first and end positions)."""
    epoch, start, _ = span
    state: dict[str, Any] = {
        "version": 1,
        "dataset_version": identity["dataset_version"],
        "seed": identity["seed"],
        "seq_len": identity["seq_len"],
        "epoch": epoch,
        "consumed": position - start,
        "fingerprint": fingerprint(identity),
    }
    if plan is None and not eras and not skips:
        return state  # nothing a version-1 reader would miss
    state.update(
        version=STATE_VERSION,
        position=position,
        plan=_encode_plan(plan),
        eras=[list(e) for e in eras],
        skips=[[s["epoch"], s["consumed"], s["samples"]] for s in skips],
    )
    return state


def _encode_plan(plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    sources = [
        [s["key"], s["url"], json.dumps(s["identity"], sort_keys=True, separators=(",", ":")), s["eras"]]
        for s in plan["sources"]
    ]
    return {"sources": sources, "phases": [[p[0], list(p[1])] for p in plan["phases"]], "anchor": plan["anchor"]}


def parse_state(state: Any) -> SavedState:
    """The checked fields of a state of either version (StateError naming the first bad field)."""
    if not isinstance(state, Mapping):
        raise StateError(f"loader state must be a dict, got {type(state).__name__}")
    if "version" not in state:
        missing = [k for k in _KEYS_V1 if k not in state]
        raise StateError(f"loader state lacks {missing}; it was not made by TokenLoader.state_dict()")
    version = state["version"]
    if not _is_int(version) or version not in (1, STATE_VERSION):
        raise StateError(f"loader state version {show(version)} is not supported (expected 1 or {STATE_VERSION})")
    keys = _KEYS_V1 if version == 1 else _KEYS_V2
    missing = [k for k in keys if k not in state]
    if missing:
        if version == 1:
            raise StateError(f"loader state lacks {missing}; it was not made by TokenLoader.state_dict()")
        raise StateError(
            f"loader state version {version} lacks {missing}: from a torch.distributed.checkpoint, load it through "
            "ferry.client.resume.dcp.ReplanOnLoad(loader, checkpoint_dir), whose template has the checkpoint's keys"
        )
    extra = [k for k in state if k not in keys]
    if extra:
        raise StateError(f"loader state has unknown keys {show(extra)}; it was not made by TokenLoader.state_dict()")
    _check_int(state, "seq_len", 1, COUNT_LIMIT)
    _check_int(state, "epoch", 0, 2**63)
    _check_int(state, "consumed", 0, 2**63)
    _check_each(state, "dataset_version", _is_version_id, "a version id")
    _check_each(state, "seed", _is_seed, "an integer in [0, 2**64)")
    fp = state["fingerprint"]
    if not isinstance(fp, str) or not _FINGERPRINT.fullmatch(fp):
        raise StateError(f"loader state fingerprint must be {ALGORITHM}:<32 hex digits>, got {show(fp)}")
    fields = {k: state[k] for k in _KEYS_V1}
    if version == 1:
        return SavedState(**fields)
    if state["position"] is not None or not state["skips"]:
        _check_int(state, "position", 0, MAX_POSITION)
    return SavedState(
        **fields,
        position=state["position"],
        plan=_check_plan(state["plan"]),
        eras=_check_eras(state["eras"]),
        skips=_check_skips(state["skips"]),
    )


def skip_state(state: Mapping[str, Any], samples: int) -> dict[str, Any]:
    """A copy of ``state`` that continues ``samples`` global samples later, the skip recorded in ``skips``."""
    saved = parse_state(state)
    if not _is_int(samples) or not 0 < samples < MAX_POSITION:
        raise StateError(f"a skip is a positive number of samples, got {show(samples)}")
    if len(saved.skips) >= MAX_SKIPS:
        raise StateError(f"loader state already records {MAX_SKIPS} skips; that is the most a state holds")
    position = None if saved.position is None else saved.position + samples
    if position is not None and position >= MAX_POSITION:
        raise StateError(f"skipping {samples} samples takes the state past stream position 2**62")
    out = dict(state)
    skips = [*saved.skips, {"epoch": saved.epoch, "consumed": saved.consumed, "samples": samples}]
    out.update(
        version=STATE_VERSION,
        consumed=saved.consumed + samples,  # may pass the epoch's end; the loader normalises it
        position=position,
        plan=_encode_plan(saved.plan),
        eras=saved.eras,
        skips=[[s["epoch"], s["consumed"], s["samples"]] for s in skips],
    )
    return out


def _check_plan(plan: Any) -> dict[str, Any] | None:
    if plan is None:
        return None
    bad = f"loader state plan must be {{sources, phases, anchor}} as TokenLoader writes it, got {show(plan)}"
    if not isinstance(plan, Mapping) or set(plan) != {"sources", "phases", "anchor"}:
        raise StateError(bad)
    sources, phases, anchor = plan["sources"], plan["phases"], plan["anchor"]
    if not isinstance(sources, list) or not 0 < len(sources) <= MAX_PERIOD:
        raise StateError(f"loader state plan sources must be a list of 1 to {MAX_PERIOD}, got {show(sources)}")
    decoded = [_decode_source(s) for s in sources]
    if len({s["key"] for s in decoded}) != len(sources):
        raise StateError("loader state plan names a source twice; the state is corrupt")
    if not isinstance(phases, list) or not 0 < len(phases) <= MAX_PHASES:
        raise StateError(f"loader state plan phases must be a list of 1 to {MAX_PHASES}, got {show(phases)}")
    from ..sampling.schedule import Schedule

    try:
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], list) for p in phases):
            raise ValueError("each phase is [start, [quota, ...]]")
        Schedule([(p[0], p[1]) for p in phases])
        if len(phases[0][1]) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(phases[0][1])} quotas per phase")
    except ValueError as exc:
        raise StateError(f"loader state plan phases are not a schedule ({exc}); the state is corrupt") from None
    if not _is_int(anchor) or not 0 <= anchor < MAX_POSITION:
        raise StateError(f"loader state plan anchor must be a stream position, got {show(anchor)}")
    return {"sources": decoded, "phases": [[p[0], list(p[1])] for p in phases], "anchor": anchor}


def _decode_source(s: Any) -> dict[str, Any]:
    """``[key, url, identity JSON, eras]`` → a dict of them; the key must be the identity's fingerprint."""
    bad = f"loader state plan source must be [key, url, identity JSON, eras], got {show(s)}"
    if not isinstance(s, list) or len(s) != 4 or not isinstance(s[0], str) or not _SOURCE_KEY.fullmatch(s[0]):
        raise StateError(bad)
    if not (s[1] is None or isinstance(s[1], str)) or not isinstance(s[2], str) or len(s[2]) > 1 << 20:
        raise StateError(bad)
    try:
        identity = json.loads(s[2])
    except (ValueError, RecursionError):
        raise StateError(bad) from None
    if not isinstance(identity, dict) or fingerprint(identity) != s[0].split("#", 1)[0]:
        raise StateError(f"loader state plan source {s[0]} does not match its identity; the state is corrupt")
    # the URL as ferry prints it: one written with credentials by an older ferry does not pass them on
    return {"key": s[0], "url": shown(s[1]) if s[1] else s[1], "identity": identity, "eras": _check_eras(s[3])}


def _check_eras(eras: Any) -> list[list[Any]]:
    if not isinstance(eras, list) or len(eras) > MAX_ERAS:
        raise StateError(f"loader state eras must be a list of at most {MAX_ERAS}, got {show(eras)}")
    for e in eras:
        ok = isinstance(e, list) and len(e) == 4 and _is_version_id(e[0])
        if not ok or not all(_is_int(x) and 0 < x < MAX_POSITION for x in e[1:]):
            raise StateError(f"loader state era must be [version, samples, shards, epochs], got {show(e)}")
    return [list(e) for e in eras]


def _check_skips(skips: Any) -> list[dict[str, int]]:
    if not isinstance(skips, list) or len(skips) > MAX_SKIPS:
        raise StateError(f"loader state skips must be a list of at most {MAX_SKIPS}, got {show(skips)}")
    for s in skips:
        ok = isinstance(s, list) and len(s) == 3
        if not ok or not all(_is_int(v) and 0 <= v < MAX_POSITION for v in s):
            raise StateError(f"loader state skip must be [epoch, consumed, samples], got {show(s)}")
    return [{"epoch": s[0], "consumed": s[1], "samples": s[2]} for s in skips]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seed(value: Any) -> bool:
    return _is_int(value) and 0 <= value < SEED_LIMIT


def _is_version_id(value: Any) -> bool:
    return isinstance(value, str) and _VERSION_ID.fullmatch(value) is not None


def _check_int(state: Mapping[str, Any], key: str, lo: int, hi: int) -> None:
    v = state[key]
    if not _is_int(v) or not lo <= v < hi:
        raise StateError(f"loader state {key} must be an integer in [{lo}, {bound(hi)}), got {show(v)}")


def _check_each(state: Mapping[str, Any], key: str, ok: Callable[[Any], bool], what: str) -> None:
    """One value, or (a mixture's state) a list of them, nested as mixtures of mixtures are."""
    v = state[key]
    if not _all_ok(v, ok, _MAX_NESTING):
        raise StateError(f"loader state {key} must be {what} or a list of them (a mixture), got {show(v)}")


def _all_ok(value: Any, ok: Callable[[Any], bool], depth: int) -> bool:
    if not isinstance(value, list):
        return ok(value)
    # a mixture has 1..MAX_PERIOD sources (each needs a share of the period)
    if depth == 0 or not 0 < len(value) <= MAX_PERIOD:
        return False
    return all(_all_ok(x, ok, depth - 1) for x in value)
