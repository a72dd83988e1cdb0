"""Resuming a loader from a saved state: the same plan, or (``replan=True``) a changed one.

A state's fingerprint names the configuration of the loader that wrote it. Equal
fingerprints: the loader adopts the state's history (earlier phases, earlier dataset
versions) and continues. Different ones: a one-line ``StateError`` naming what differs,
or, with ``replan=True``, a new plan from the state's position on — every source that
stays continues from the sample it would have read next, an added source starts at its
beginning, and the change is recorded (a mixture's new phase; a single dataset's era).

The plan arithmetic here is pure: phases in, phases out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferry.shard_tools.errors import StateError

from ..checks import show
from ..source import SampleSource
from .state import SavedState, fingerprint

__all__ = ["resume", "anchored", "merge_plan", "source_keys"]

Phase = tuple[int, tuple[int, ...]]
_HINT = "; pass replan=True to load_state_dict to continue with this loader's plan (or strict=False to ignore)"


def source_keys(identities: Sequence[dict[str, Any]]) -> list[str]:
    """A key per mixture source: its identity's fingerprint and which occurrence of it this is."""
    seen: dict[str, int] = {}
    keys = []
    for ident in identities:
        fp = fingerprint(ident)
        keys.append(f"{fp}#{seen.get(fp, 0)}")
        seen[fp] = seen.get(fp, 0) + 1
    return keys


def anchored(phases: Sequence[Phase], at: int) -> list[Phase]:
    """A configured schedule from position ``at`` on: the phase in force at ``at`` restarts there."""
    live = [k for k, (s, _) in enumerate(phases) if s <= at][-1]
    return [(at, phases[live][1]), *[(s, q) for s, q in phases[live + 1 :] if s > at]]


def merge_plan(
    old_keys: Sequence[str], old_phases: Sequence[Phase], new_keys: Sequence[str], config: Sequence[Phase], at: int
) -> tuple[list[str], list[Phase]]:
    """The run's plan after a re-plan at ``at``: sources (old first, then added ones) and phases
    (the old ones before ``at``, then the configured schedule anchored at ``at``), quotas by source."""
    union = list(old_keys) + [k for k in new_keys if k not in old_keys]
    slot = [union.index(k) for k in new_keys]

    def widen(quota: Sequence[int], slots: Sequence[int]) -> tuple[int, ...]:
        out = [0] * len(union)
        for j, q in zip(slots, quota, strict=True):
            out[j] = q
        return tuple(out)

    history = [(s, widen(q, range(len(old_keys)))) for s, q in old_phases if s < at]
    return union, history + [(s, widen(q, slot)) for s, q in anchored(config, at)]


def resume(config: SampleSource, saved: SavedState, *, strict: bool, replan: bool) -> tuple[SampleSource, int]:
    """The dataset to read (``config`` with the state's history) and the position to continue from."""
    n = config.num_samples
    if not strict:
        return config, saved.stream_position(n, strict=False)
    identity = config.identity()
    if saved.fingerprint == fingerprint(identity):
        return config.restored(saved), saved.stream_position(n, strict=True)
    if saved.seq_len != identity["seq_len"]:
        raise StateError(f"loader state is for seq_len {saved.seq_len!r}, this loader has {identity['seq_len']!r}")
    if replan:
        return config.replanned(saved)
    raise StateError(difference(saved, identity))


def difference(saved: SavedState, identity: dict[str, Any]) -> str:
    """What differs between the state's configuration and this loader's, in one line."""
    if "sources" in identity and saved.plan is not None:
        return mixture_difference(saved.plan, identity) + _HINT
    hint = _HINT
    for key in ("dataset_version", "seed"):
        if getattr(saved, key) != identity[key]:
            return f"loader state is for {key} {getattr(saved, key)!r}, this loader has {identity[key]!r}{hint}"
    return (
        "loader state was made with another shuffle mode, window, document mode or mixture "
        f"(fingerprint {saved.fingerprint} != {fingerprint(identity)}){hint}"
    )


def mixture_difference(plan: dict[str, Any], identity: dict[str, Any]) -> str:
    """Sources added / removed and weights changed between a state's current plan and a mixture's."""
    keys = source_keys(identity["sources"])
    old = {s["key"]: s for s in plan["sources"]}
    anchor = plan["anchor"]
    live = {plan["sources"][j]["key"] for p in plan["phases"] if p[0] >= anchor for j, q in enumerate(p[1]) if q}
    parts = []
    added = [k for k in keys if k not in live]
    gone = [k for k in live if k not in keys]
    if added:
        named = [_describe(i) for k, i in zip(keys, identity["sources"], strict=True) if k in added]
        parts.append("sources added: " + _few(named))
    if gone:
        parts.append("sources removed: " + _few([_describe(old[k]["identity"]) for k in gone]))
    if not parts:
        was = [p[1] for p in plan["phases"] if p[0] >= anchor]
        parts.append(f"weights (quota per source) differ: state {show(was)}, loader {show(_config_quotas(identity))}")
    return "the loader's mixture differs from the state's: " + "; ".join(parts)


def _few(items: Sequence[str], limit: int = 4) -> str:
    """The first ``limit`` items, and how many more (a message stays one short line)."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _config_quotas(identity: dict[str, Any]) -> list[list[int]]:
    if "phases" in identity:
        return [p[1] for p in identity["phases"]]
    return [identity["quota"]]


def _describe(identity: dict[str, Any]) -> str:
    return f"{identity.get('dataset_version')!r} seed {identity.get('seed')!r}"
