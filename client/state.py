"""The loader state: a small, versioned, JSON-serialisable dict, and its checks.

``{"version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint"}``.
``consumed`` counts global samples of epoch ``epoch`` delivered to the training loop;
world size, workers and batch size are deliberately absent, so a state loads into any
of them. ``fingerprint`` digests everything else that fixes the sample order (shuffle
mode, window, document mode, mixing weights, dataset versions, seeds, seq_len).

A state comes from a file: every field is checked for its type and range before it is
used (even with ``strict=False``, which only skips the comparison with this loader).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from shard_tools.digest import ALGORITHM, digest_bytes
from shard_tools.errors import StateError

from .checks import COUNT_LIMIT, SEED_LIMIT, bound, show
from .mixing import MAX_PERIOD

__all__ = ["STATE_VERSION", "MAX_POSITION", "fingerprint", "make_state", "restore_position"]

STATE_VERSION = 1
MAX_POSITION = 2**62  # a stream position plus an epoch's samples stays far inside int64
_KEYS = ("version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint")
_MAX_NESTING = 8  # mixtures of mixtures, as deep as a real configuration goes
_VERSION_ID = re.compile(r"[0-9A-Za-z._-]{1,128}")
_FINGERPRINT = re.compile(ALGORITHM + r":[0-9a-f]{32}")


def fingerprint(identity: Mapping[str, Any]) -> str:
    """Digest of the canonical JSON of a dataset's identity (what fixes the sample order)."""
    return digest_bytes(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode())


def make_state(identity: Mapping[str, Any], position: int, n: int) -> dict[str, Any]:
    """The state at stream position ``position`` for a dataset of ``n`` samples per epoch."""
    epoch, consumed = divmod(position, n)
    return {
        "version": STATE_VERSION,
        "dataset_version": identity["dataset_version"],
        "seed": identity["seed"],
        "seq_len": identity["seq_len"],
        "epoch": epoch,
        "consumed": consumed,
        "fingerprint": fingerprint(identity),
    }


def restore_position(state: Mapping[str, Any], identity: Mapping[str, Any], n: int, *, strict: bool = True) -> int:
    """Check ``state`` against this dataset's identity and return the stream position to continue from.

    Raises StateError on a malformed state, or (unless ``strict=False``) on a state made
    for another dataset version, seed, seq_len or order configuration.
    """
    _check_fields(state)
    epoch, consumed = state["epoch"], state["consumed"]
    if strict:
        hint = "; pass strict=False to load_state_dict to continue anyway"
        for key in ("dataset_version", "seed", "seq_len"):
            if state[key] != identity[key]:
                raise StateError(f"loader state is for {key} {state[key]!r}, this loader has {identity[key]!r}{hint}")
        if state["fingerprint"] != fingerprint(identity):
            raise StateError(
                "loader state was made with another shuffle mode, window, document mode or mixture "
                f"(fingerprint {state['fingerprint']} != {fingerprint(identity)}){hint}"
            )
        if consumed > n:
            raise StateError(f"loader state has consumed={consumed} but an epoch has only {n} samples")
    position = epoch * n + min(consumed, n)
    if position + n > MAX_POSITION:
        raise StateError(
            f"loader state epoch={epoch}, consumed={consumed} is out of range: with {n} samples per epoch "
            "epoch*n + consumed must stay below 2**62 - n; the state is corrupt"
        )
    return position


def _check_fields(state: Any) -> None:
    """The keys, types and ranges of a state, before any of it is used (StateError naming the field)."""
    if not isinstance(state, Mapping):
        raise StateError(f"loader state must be a dict, got {type(state).__name__}")
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise StateError(f"loader state lacks {missing}; it was not made by TokenLoader.state_dict()")
    extra = [k for k in state if k not in _KEYS]
    if extra:
        raise StateError(f"loader state has unknown keys {show(extra)}; it was not made by TokenLoader.state_dict()")
    version = state["version"]
    if not _is_int(version) or version != STATE_VERSION:
        raise StateError(f"loader state version {show(version)} is not supported (expected {STATE_VERSION})")
    _check_int(state, "seq_len", 1, COUNT_LIMIT)
    _check_int(state, "epoch", 0, 2**63)
    _check_int(state, "consumed", 0, 2**63)
    _check_each(state, "dataset_version", _is_version_id, "a version id")
    _check_each(state, "seed", _is_seed, "an integer in [0, 2**64)")
    fp = state["fingerprint"]
    if not isinstance(fp, str) or not _FINGERPRINT.fullmatch(fp):
        raise StateError(f"loader state fingerprint must be {ALGORITHM}:<32 hex digits>, got {show(fp)}")


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
