"""Loader states in ``torch.distributed.checkpoint`` directories: finding, reading, and a loading template.

DCP flattens a Stateful's dict into keys (``loader.version``, ``loader.plan.phases`` …) and loads
only the keys of the *template* the Stateful returns before loading. A loader whose data plan
changed would return a template of another shape than the checkpoint's (a version-1 state has
fewer keys than a version-2 one), so :class:`ReplanOnLoad` builds its template from the keys the
checkpoint actually holds.

A checkpoint's ``.metadata`` is a pickle, and each non-tensor value in it is a pickle too: unpickling
runs whatever code the file names. Inspecting one (``ferry state show``, ``ferry trace --state``) reads
both with an unpickler that builds only the classes of DCP's metadata (and plain values for the
loader state's entries) and refuses any other, so a crafted checkpoint cannot run code; reading it
with torch's own unpickler takes ``trust_pickle=True`` (``--trust-pickle``).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from typing import Any

from ferry.shard_tools.errors import StateError, UsageError

__all__ = ["ReplanOnLoad", "loader_keys", "read_dcp_state", "safe_metadata", "UNTRUSTED_PICKLE"]

#: what the refusal to unpickle says (the CLI names its flag after it)
UNTRUSTED_PICKLE = "unpickling it could run code from the file"

# The globals a torch.distributed.checkpoint ``.metadata`` pickle names: DCP's metadata dataclasses,
# torch's dtype / layout / memory-format / Size values and the checkpoint's path. None of them runs
# anything when built.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
}  # fmt: skip
_MAX_METADATA = 1 << 30
_MAX_VALUE = 64 << 20  # one entry of a loader state (a plan is a few KiB)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value  # a constant, not a call
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def safe_metadata(path: str) -> Any:
    """The checkpoint's ``.metadata``, unpickled building only DCP's metadata classes (a StateError if it
    names anything else: a crafted file, or a torch whose format ferry does not know)."""
    meta = os.path.join(path, ".metadata")
    if not os.path.exists(meta):
        raise UsageError(f"{path} is not a torch.distributed.checkpoint (no .metadata)")
    try:
        with open(meta, "rb") as f:
            data = f.read(_MAX_METADATA + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {meta}: {exc.strerror or exc}") from None
    if len(data) > _MAX_METADATA:
        raise StateError(f"{meta} is larger than 1 GiB; not a checkpoint's metadata")
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any failure of a hostile or broken pickle is the file's fault
        raise StateError(
            f"{meta} is not a checkpoint metadata ferry reads without running code ({exc}); "
            f"if you trust this checkpoint, pass --trust-pickle ({UNTRUSTED_PICKLE})"
        ) from None
    if not isinstance(getattr(md, "state_dict_metadata", None), dict) or not isinstance(
        getattr(md, "storage_data", None), dict
    ):
        raise StateError(f"{meta} is not a torch.distributed.checkpoint metadata")
    return md


def _names(path: str, trust_pickle: bool) -> list[str]:
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise UsageError(f"{path} is not a torch.distributed.checkpoint (no .metadata)")
    if trust_pickle:
        from torch.distributed.checkpoint import FileSystemReader

        try:
            return [str(n) for n in FileSystemReader(path).read_metadata().state_dict_metadata]
        except Exception as exc:  # whatever the file unpickled to, it is not a checkpoint's metadata
            raise StateError(f"{path}: cannot read the checkpoint's metadata ({type(exc).__name__}: {exc})") from None
    return [str(n) for n in safe_metadata(path).state_dict_metadata]


def loader_keys(path: str, key: str | None = None, *, trust_pickle: bool = False) -> tuple[str, list[str]]:
    """The entry holding a loader state in the checkpoint at ``path``, and its flattened key names
    (its ``.metadata`` read without running code unless ``trust_pickle``)."""
    return _select(path, _names(path, trust_pickle), key)


def _select(path: str, names: list[str], key: str | None) -> tuple[str, list[str]]:
    """Of a checkpoint's flattened ``names``: the entry holding a loader state (``key``, or the only one)."""
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


def read_dcp_state(path: str, key: str | None = None, *, trust_pickle: bool = False) -> dict[str, Any]:
    """The loader state in a DCP checkpoint, read without the rest of it (no process group needed).

    By default no code from the checkpoint runs: its metadata is read by :func:`safe_metadata` and each
    entry of the state with torch's ``weights_only`` unpickler (plain values only). ``trust_pickle=True``
    reads it with torch's own loader, which unpickles whatever the files hold."""
    if not trust_pickle:
        return _read_untrusted(path, key)
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    key, names = loader_keys(path, key, trust_pickle=True)
    try:
        loaded = _load_state_dict_from_keys(set(names), checkpoint_id=path)
    except Exception as exc:  # a broken or foreign checkpoint fails in torch's own ways
        raise StateError(f"{path}: cannot read entry {key!r} ({type(exc).__name__}: {exc})") from None
    if key in loaded and isinstance(loaded[key], Mapping):
        return dict(loaded[key])
    return _nest(names, loaded)


def _read_untrusted(path: str, key: str | None) -> dict[str, Any]:
    md = safe_metadata(path)
    key, names = _select(path, [str(n) for n in md.state_dict_metadata], key)
    where = {str(getattr(i, "fqn", "")): info for i, info in md.storage_data.items()}
    values = {}
    for name in names:
        kind = type(md.state_dict_metadata.get(name)).__name__
        info = where.get(name)
        if kind != "BytesStorageMetadata" or info is None:
            raise StateError(f"{path}: entry {name!r} of the loader state is not a plain value ({kind})")
        values[name] = _read_value(path, name, info)
    return _nest(names, values)


def _count(value: Any) -> int | None:
    """``value`` if it is an int >= 0 (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _read_value(path: str, name: str, info: Any) -> Any:
    """One entry's value: its bytes in the ``.distcp`` file its storage info names, as a plain value."""
    import torch

    rel = getattr(info, "relative_path", None)
    offset, length = _count(getattr(info, "offset", None)), _count(getattr(info, "length", None))
    if (
        not isinstance(rel, str)
        or os.path.basename(rel) != rel
        or rel in ("", ".", "..")
        or offset is None
        or length is None
        or length > _MAX_VALUE
        or getattr(info, "transform_descriptors", None)
    ):
        raise StateError(f"{path}: entry {name!r} has a storage record ferry does not read ({info!r})")
    try:
        with open(os.path.join(path, rel), "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as exc:
        raise StateError(f"{path}: cannot read entry {name!r} from {rel}: {exc.strerror or exc}") from None
    if len(data) != length:
        raise StateError(f"{path}: {rel} ends before entry {name!r} ({len(data)} of {length} bytes)")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses anything but plain values and tensors
        raise StateError(
            f"{path}: entry {name!r} is not a plain value ferry reads without running code ({exc}); "
            f"if you trust this checkpoint, pass --trust-pickle ({UNTRUSTED_PICKLE})"
        ) from None


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
        # the checkpoint's keys (values come from it): dcp.load unpickles this checkpoint anyway
        return _nest(loader_keys(self.checkpoint_id, self.key, trust_pickle=True)[1])

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state_dict, replan=True)
