"""The loader state: a small, versioned, JSON-serialisable dict, and its checks.

``{"version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint"}``.
``consumed`` counts global samples of epoch ``epoch`` delivered to the training loop;
world size, workers and batch size are deliberately absent, so a state loads into any
of them. ``fingerprint`` digests everything else that fixes the sample order (shuffle
mode, window, document mode, mixing weights, dataset versions, seeds, seq_len).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shard_tools.digest import digest_bytes
from shard_tools.errors import StateError

__all__ = ["STATE_VERSION", "fingerprint", "make_state", "restore_position"]

STATE_VERSION = 1
_KEYS = ("version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint")


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
    if not isinstance(state, Mapping):
        raise StateError(f"loader state must be a dict, got {type(state).__name__}")
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise StateError(f"loader state lacks {missing}; it was not made by TokenLoader.state_dict()")
    if state["version"] != STATE_VERSION:
        raise StateError(f"loader state version {state['version']!r} is not supported (expected {STATE_VERSION})")
    epoch, consumed = state["epoch"], state["consumed"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, consumed)):
        raise StateError(f"loader state epoch/consumed must be non-negative integers, got {epoch!r}/{consumed!r}")
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
    return int(epoch) * n + min(int(consumed), n)
