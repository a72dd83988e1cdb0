"""Pin the public face of shard_tools and the data CLI (a change here is a deliberate API change)."""

from __future__ import annotations

import argparse
import inspect

from ferry import shard_tools
from ferry.shard_tools.cli import build_parser
from ferry.shard_tools.format import shard as fmt
from ferry.shard_tools.storage import store

EXPECTED_EXPORTS = {
    "__version__",
    # reading
    "Dataset", "open_dataset", "load_manifest", "decode_stored_shard",
    "Manifest", "ShardInfo", "ShardTable", "Tokenizer",
    # writing
    "PackOptions", "PackResult", "PartResult", "pack", "pack_documents", "pack_part", "merge_parts",
    "verify", "VerifyReport", "export_megatron",
    # errors
    "FerryError", "UsageError", "InputFormatError", "MegatronIndexError", "TokenRangeError", "DatasetError",
    "DatasetNotFoundError", "ManifestError", "ShardError", "ShardMissingError", "ShardDigestError",
    "ShardFormatError", "StorageError", "PublishError", "WriteConflictError", "RollbackError", "StateError",
    "CacheError", "ConfigError", "ReplicationError", "LeaseHeldError", "ServiceError",
    "NotFoundError", "InvalidValueError", "SourceMissing", "Cancelled",
}  # fmt: skip

EXPECTED_FLAGS = {
    "pack": {
        "--append", "--compression", "--format", "--frame-size", "--eos-id", "--eos-token", "--executor",
        "--input-format", "--json",
        "--lines", "--merge", "--name", "--no-eos", "--no-origin", "--out", "--part", "--parts", "--ray-address",
        "--run-id",
        "--shard-size", "--split", "--storage-option", "--text-column", "--tokenizer", "--tokens-column",
        "--vocab-size", "--workers", "--input-storage-option", "--media-policy", "--media-column", "--skip-bad-media",
    },
    "inspect": {"--json", "--media", "--shards", "--storage-option", "--version"},
    "verify": {"--json", "--storage-option", "--threads", "--version"},
    "export": {"--format", "--json", "--out", "--storage-option", "--strip-eos"},
}  # fmt: skip


def test_exported_names() -> None:
    assert set(shard_tools.__all__) == EXPECTED_EXPORTS
    for name in shard_tools.__all__:
        assert hasattr(shard_tools, name), name


def test_stable_signatures() -> None:
    # other packages call these; extend with keyword arguments, never break them
    assert list(inspect.signature(shard_tools.pack).parameters) == ["inputs", "out", "options"]
    assert list(inspect.signature(shard_tools.pack_documents).parameters) == ["documents", "out", "options"]
    assert list(inspect.signature(shard_tools.open_dataset).parameters) == ["url", "storage_options", "version"]
    assert list(inspect.signature(shard_tools.load_manifest).parameters)[:2] == ["loc", "version"]
    assert list(inspect.signature(shard_tools.decode_stored_shard).parameters) == ["info", "stored", "verify"]
    assert list(inspect.signature(fmt.parse_shard).parameters) == ["source", "shard", "dtype", "documents", "tokens"]
    assert list(inspect.signature(fmt.open_shard_file).parameters) == ["path", "shard", "dtype", "documents", "tokens"]
    assert list(inspect.signature(store.resolve).parameters) == ["url", "storage_options"]
    for name in ("full", "exists", "read_bytes", "write_bytes", "listdir", "size", "remove"):
        assert callable(getattr(store.Location, name))


def _flags(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        for name, p in sub.choices.items()
    }


def test_data_cli_surface() -> None:
    for command in EXPECTED_FLAGS:  # `ferry CMD` loads only the data commands' entry point
        assert _flags(build_parser(command)) == EXPECTED_FLAGS
    full = _flags(build_parser())
    for command, flags in EXPECTED_FLAGS.items():
        assert full[command] == flags
