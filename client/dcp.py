"""Loader states in ``torch.distributed.checkpoint`` directories: finding, reading, and a loading template.

DCP flattens a Stateful's dict into keys (``loader.version``, ``loader.plan.phases`` …) and loads
only the keys of the *template* the Stateful returns before loading. A loader whose data plan
changed would return a template of another shape than the checkpoint's (a version-1 state has
fewer keys than a version-2 one), so :class:`ReplanOnLoad` builds its template from the keys the
checkpoint actually holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shard_tools.errors import StateError, UsageError

__all__ = ["ReplanOnLoad", "loader_keys", "read_dcp_state"]


def loader_keys(path: str, key: str | None = None) -> tuple[str, list[str]]:
    """The entry holding a loader state in the checkpoint at ``path``, and its flattened key names."""
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise UsageError(f"{path} is not a torch.distributed.checkpoint (no .metadata)")
    from torch.distributed.checkpoint import FileSystemReader

    names = list(FileSystemReader(path).read_metadata().state_dict_metadata)
    tops = sorted({n.split(".", 1)[0] for n in names if n.endswith(".fingerprint") and n.count(".") == 1})
    if key is None:
        if len(tops) != 1:
            raise UsageError(f"{path} holds loader states under {tops or 'no key'}; name one with --key")
        key = tops[0]
    wanted = [n for n in names if n.startswith(key + ".")]
    if not wanted:
        raise StateError(f"{path} has no entry {key!r} (loader states under {tops})")
    return key, wanted


def _nest(names: list[str], values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flattened ``key.a.b`` names (and their values, else None) as the nested dict under ``key``."""
    out: dict[str, Any] = {}
    for name in names:
        parts = name.split(".")[1:]
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = None if values is None else values[name]
    return out


def read_dcp_state(path: str, key: str | None = None) -> dict[str, Any]:
    """The loader state in a DCP checkpoint, read without the rest of it (no process group needed)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    key, names = loader_keys(path, key)
    loaded = _load_state_dict_from_keys(set(names), checkpoint_id=path)
    if key in loaded and isinstance(loaded[key], Mapping):
        return dict(loaded[key])
    return _nest(names, loaded)


class ReplanOnLoad:
    """A loader as a ``torch.distributed.checkpoint`` Stateful that re-plans when loaded.

    ``dcp.load({"loader": ReplanOnLoad(loader, ckpt)}, checkpoint_id=ckpt)`` calls
    ``loader.load_state_dict(state, replan=True)`` with the checkpoint's state, whatever its shape:
    for the first resume after a change of the data plan (weights, sources, a newer version), or any
    resume of a run whose state changed version on the way. ``key`` names the loader's entry when the
    checkpoint holds several.
    """

    def __init__(self, loader: Any, checkpoint_id: str | os.PathLike[str] | None = None, key: str | None = None):
        self.loader = loader
        self.checkpoint_id = None if checkpoint_id is None else os.fspath(checkpoint_id)
        self.key = key

    def state_dict(self) -> dict[str, Any]:
        if self.checkpoint_id is None or not os.path.exists(os.path.join(self.checkpoint_id, ".metadata")):
            return dict(self.loader.state_dict())  # saving, or no checkpoint to match
        return _nest(loader_keys(self.checkpoint_id, self.key)[1])  # the checkpoint's keys: values come from it

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state_dict, replan=True)
