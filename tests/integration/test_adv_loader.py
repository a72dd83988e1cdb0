"""Hostile arguments, states and disks for the loader: each is refused at once with one line naming it,
and the errors the README promises reach the training loop unchanged from DataLoader worker processes.

Tests run as root, where a read-only directory does not stop writes. The cache failures are provoked
in ways root cannot write through: a cache path whose parent is a regular file (ENOTDIR), a cache
directory replaced by a regular file after construction, and a full disk as the kernel's file size
limit (``RLIMIT_FSIZE``, EFBIG) in a child process, which binds root too.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scripts.loader_common import VOCAB, pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.shard_tools.errors import (
    CacheError,
    DatasetError,
    FerryError,
    ShardError,
    ShardMissingError,
    StateError,
    UsageError,
)

SEQ = 16


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("adv_loader") / "ds"), 300)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("adv_loader_cache"))


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# --- arguments: UsageError at construction -------------------------------------------------------------------


@pytest.mark.parametrize("pad_id", [VOCAB, VOCAB + 5, 2**40, -1, True, 3.0])
def test_a_pad_id_outside_the_vocabulary_is_refused(url: str, cache: str, pad_id: Any) -> None:
    with pytest.raises(UsageError, match="pad_id") as exc:
        TokenDataset(url, seq_len=200, mode="document", pad_id=pad_id, cache_dir=cache)
    one_line(exc)


def test_the_last_id_of_the_vocabulary_pads(url: str, cache: str) -> None:
    ds = TokenDataset(url, seq_len=200, mode="document", pad_id=VOCAB - 1, shuffle="none", cache_dir=cache)
    batch = next(iter(TokenLoader(ds, 4)))
    assert int(batch["input_ids"].max()) == VOCAB - 1  # documents are shorter than 200: padding is there


@pytest.mark.parametrize("limit", [-5, 0, True, 1.5, "-1GiB", "0", "inf", "nan", "1e300GiB", "lots", 2**63])
def test_a_bad_cache_limit_is_refused(url: str, cache: str, limit: Any) -> None:
    with pytest.raises(UsageError, match="cache_limit") as exc:
        TokenDataset(url, seq_len=SEQ, cache_dir=cache, cache_limit=limit)
    one_line(exc)


def test_a_bad_cache_limit_in_the_environment_is_refused(url: str, cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_CACHE_LIMIT", "-5")
    with pytest.raises(UsageError, match=r"\$FERRY_CACHE_LIMIT"):
        TokenDataset(url, seq_len=SEQ, cache_dir=cache)


DATASET_ARGS = [
    ("seq_len", {"seq_len": 0}),
    ("seq_len", {"seq_len": True}),
    ("seq_len", {"seq_len": 2.5}),
    ("seq_len", {"seq_len": 2**31}),
    ("seed", {"seed": -1}),
    ("seed", {"seed": 2**64}),  # would alias seed 0: shuffle keys are 64-bit
    ("seed", {"seed": 1.5}),
    ("seed", {"seed": True}),
    ("seed", {"seed": "7"}),
    ("shuffle", {"shuffle": "random"}),
    ("shuffle", {"shuffle": None}),
    ("shuffle", {"shuffle": ["global"]}),
    ("mode", {"mode": "doc"}),
    ("window", {"window": 0}),
    ("window", {"window": True}),
    ("window", {"window": 2.0}),
    ("prefetch", {"prefetch": -1}),
    ("prefetch", {"prefetch": True}),
    ("verify_cache", {"verify_cache": "no"}),
    ("verify_cache", {"verify_cache": 0}),
    ("cache_dir", {"cache_dir": ""}),
    ("cache_dir", {"cache_dir": b"/tmp/x"}),
    ("cache_dir", {"cache_dir": "/tmp/a\0b"}),
    ("url", {"url": []}),
    ("url", {"url": ""}),
    ("url", {"url": [None]}),
    ("url", {"url": 7}),
    ("storage_options", {"storage_options": "anon=true"}),
    ("storage_options", {"storage_options": [{}, {}]}),  # two option mappings for one URL
    ("version", {"version": ""}),
    ("version", {"version": 3}),
]


@pytest.mark.parametrize(("name", "kwargs"), DATASET_ARGS, ids=[f"{a!r}"[:40] for _, a in DATASET_ARGS])
def test_bad_dataset_arguments_are_usage_errors(url: str, cache: str, name: str, kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"url": url, "seq_len": SEQ, "cache_dir": cache, **kwargs}
    with pytest.raises(UsageError, match=name.replace("_", ".")) as exc:
        TokenDataset(**args)
    one_line(exc)


LOADER_ARGS = [
    ("batch_size", {"batch_size": 0}),
    ("batch_size", {"batch_size": True}),
    ("batch_size", {"batch_size": 2.0}),
    ("batch_size", {"batch_size": "4"}),
    ("batch_size", {"batch_size": 2**40}),
    ("num_workers", {"num_workers": -1}),
    ("num_workers", {"num_workers": 1.5}),
    ("num_workers", {"num_workers": True}),
    ("prefetch_factor", {"prefetch_factor": 0, "num_workers": 2}),
    ("prefetch_factor", {"prefetch_factor": -1}),
    ("prefetch_factor", {"prefetch_factor": True, "num_workers": 2}),
    ("prefetch_factor", {"prefetch_factor": None, "num_workers": 2}),
    ("world_size", {"world_size": 0, "rank": 0}),
    ("world_size", {"world_size": 2.0, "rank": 0}),
    ("world_size", {"world_size": 2**40, "rank": 0}),
    ("rank", {"rank": -1, "world_size": 2}),
    ("rank", {"rank": 2, "world_size": 2}),
    ("rank", {"rank": True, "world_size": 2}),
    ("pin_memory", {"pin_memory": "yes"}),
    ("return_doc_boundaries", {"return_doc_boundaries": 1}),
    ("dataset", {"dataset": object()}),
]


LOADER_IDS = [f"{a!r}"[:50] if name != "dataset" else "dataset=object()" for name, a in LOADER_ARGS]  # no address


@pytest.mark.parametrize(("name", "kwargs"), LOADER_ARGS, ids=LOADER_IDS)
def test_bad_loader_arguments_are_usage_errors(url: str, cache: str, name: str, kwargs: dict[str, Any]) -> None:
    ds = TokenDataset(url, seq_len=SEQ, cache_dir=cache)
    args: dict[str, Any] = {"dataset": ds, "batch_size": 2, **kwargs}
    with pytest.raises(UsageError, match=name) as exc:
        TokenLoader(**args)
    one_line(exc)


@pytest.mark.parametrize(("var", "value"), [("RANK", "zero"), ("WORLD_SIZE", "2.5"), ("RANK", "-1"), ("RANK", "4")])
def test_a_bad_rank_or_world_size_in_the_environment_is_a_usage_error(
    url: str, cache: str, monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv(var, value)
    ds = TokenDataset(url, seq_len=SEQ, cache_dir=cache)
    with pytest.raises(UsageError, match="RANK|rank|WORLD_SIZE|world_size"):
        TokenLoader(ds, 2)


@pytest.mark.parametrize("weights", [[True, 1], ["a", 1], [math.nan, 1], [-1, 1], [1], "ab"])
def test_bad_mixing_weights_are_usage_errors(url: str, cache: str, weights: Any) -> None:
    ds = TokenDataset(url, seq_len=SEQ, cache_dir=cache)
    with pytest.raises(UsageError, match="weight|mix") as exc:
        TokenDataset.mix([ds, ds], weights)
    one_line(exc)


def test_a_mixture_of_something_else_is_a_usage_error(url: str, cache: str) -> None:
    ds = TokenDataset(url, seq_len=SEQ, cache_dir=cache)
    with pytest.raises(UsageError, match="TokenDataset"):
        TokenDataset.mix([ds, [1, 2, 3]], [1, 1])  # type: ignore[list-item]


# --- states: StateError at load_state_dict --------------------------------------------------------------------


def _loader(url: str, cache: str) -> TokenLoader:
    return TokenLoader(TokenDataset(url, seq_len=SEQ, seed=3, cache_dir=cache), 2, rank=0, world_size=1)


BAD_STATES: list[tuple[str, Any]] = [
    ("epoch", 2**70),
    ("epoch", 2**63),
    ("epoch", 2**61),  # below 2**63 but epoch * n overflows int64 positions
    ("epoch", -1),
    ("epoch", True),
    ("epoch", 1.0),
    ("epoch", "2"),
    ("epoch", None),
    ("consumed", 2**63),
    ("consumed", -1),
    ("consumed", False),
    ("consumed", "3"),
    ("version", True),  # True == 1, but a bool is not a version
    ("version", 2),
    ("version", "1"),
    ("seed", True),
    ("seed", -1),
    ("seed", 2**64),
    ("seed", 3.0),
    ("seq_len", 0),
    ("seq_len", True),
    ("seq_len", "16"),
    ("dataset_version", 3),
    ("dataset_version", ""),
    ("dataset_version", "x\ny"),
    ("dataset_version", []),
    ("dataset_version", ["a"] * 5000),
    ("fingerprint", "nope"),
    ("fingerprint", None),
    ("fingerprint", "xxh128:" + "g" * 32),
]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("key", "value"), BAD_STATES, ids=[f"{k}={v!r}"[:40] for k, v in BAD_STATES])
def test_a_malformed_state_is_refused_at_load(url: str, cache: str, key: str, value: Any, strict: bool) -> None:
    loader = _loader(url, cache)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(StateError, match=key) as exc:
        loader.load_state_dict(state, strict=strict)
    one_line(exc)
    assert loader.position == 0  # nothing of the bad state was taken


@pytest.mark.parametrize("strict", [True, False])
def test_a_state_with_unknown_or_missing_keys_or_of_another_type_is_refused(url: str, cache: str, strict: bool) -> None:
    loader = _loader(url, cache)
    good = loader.state_dict()
    with pytest.raises(StateError, match="unknown keys"):
        loader.load_state_dict({**good, "position": 5}, strict=strict)
    with pytest.raises(StateError, match="lacks"):
        loader.load_state_dict({k: v for k, v in good.items() if k != "consumed"}, strict=strict)
    with pytest.raises(StateError, match="must be a dict"):
        loader.load_state_dict([("epoch", 0)], strict=strict)  # type: ignore[arg-type]


def test_a_state_far_in_the_stream_loads_and_iterates(url: str, cache: str) -> None:
    """The range checks leave real states alone: epoch 10**12 is far beyond any training run."""
    loader = _loader(url, cache)
    n = loader.dataset.num_samples
    loader.load_state_dict({**loader.state_dict(), "epoch": 10**12, "consumed": n - 1})
    assert loader.epoch == 10**12 and len(loader) == 1
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (2, SEQ)
    assert loader.epoch == 10**12 + 1


def test_a_state_of_a_mixture_of_mixtures_loads_and_a_bad_seed_inside_it_does_not(url: str, cache: str) -> None:
    a = TokenDataset(url, seq_len=SEQ, seed=1, cache_dir=cache)
    b = TokenDataset(url, seq_len=SEQ, seed=2, cache_dir=cache)
    nested = TokenDataset.mix([TokenDataset.mix([a, b], [1, 1]), a], [2, 1])
    loader = TokenLoader(nested, 2, rank=0, world_size=1)
    next(iter(loader))
    state = loader.state_dict()
    assert state["seed"] == [[1, 2], 1]
    fresh = TokenLoader(nested, 2, rank=0, world_size=1)
    fresh.load_state_dict(state)
    assert fresh.position == loader.position
    with pytest.raises(StateError, match="seed"):
        fresh.load_state_dict({**state, "seed": [[1, True], 1]}, strict=False)


def test_with_strict_false_consumed_beyond_the_epoch_is_clamped(url: str, cache: str) -> None:
    loader = _loader(url, cache)
    n = loader.dataset.num_samples
    with pytest.raises(StateError, match="consumed"):
        loader.load_state_dict({**loader.state_dict(), "consumed": n + 1})
    loader.load_state_dict({**loader.state_dict(), "epoch": 2, "consumed": n + 1}, strict=False)
    assert loader.position == 3 * n


# --- errors across DataLoader workers -------------------------------------------------------------------------


def _first_error(ds: TokenDataset, workers: int) -> tuple[BaseException, int]:
    """The error of one epoch over ``ds`` and how many batches came before it."""
    loader = TokenLoader(ds, 2, num_workers=workers, rank=0, world_size=1)
    delivered = 0
    with pytest.raises(FerryError) as exc:
        for _ in loader:
            delivered += 1
    return exc.value, delivered


def test_a_missing_shard_is_a_shard_missing_error_from_workers_too(url: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(url, broken)
    ds = TokenDataset(str(broken), seq_len=SEQ, shuffle="none", cache_dir=str(tmp_path / "c0"), prefetch=0)
    gone = ds.manifest.shards[len(ds.manifest.shards) // 2].path
    (broken / gone).unlink()

    in_process, before = _first_error(ds, 0)
    ds2 = TokenDataset(str(broken), seq_len=SEQ, shuffle="none", cache_dir=str(tmp_path / "c2"), prefetch=0)
    from_workers, before2 = _first_error(ds2, 2)
    for err in (in_process, from_workers):
        assert type(err) is ShardMissingError
        assert err.shard == gone  # type: ignore[attr-defined]
        assert "\n" not in str(err)
    assert str(from_workers) == str(in_process)
    assert before2 == before > 0  # the batches before the missing shard were delivered, in order
    assert "DataLoader worker" in str(from_workers.__cause__)  # the worker's traceback is kept as the cause


def test_a_cache_directory_gone_bad_is_a_cache_error_from_workers(url: str, tmp_path: Path) -> None:
    """The cache directory is replaced by a regular file between construction and iteration."""
    errors = []
    for workers in (0, 2):
        directory = tmp_path / f"c{workers}"
        ds = TokenDataset(url, seq_len=SEQ, cache_dir=str(directory))
        shutil.rmtree(directory)
        directory.write_bytes(b"not a directory")
        err, _ = _first_error(ds, workers)
        assert type(err) is CacheError
        assert err.path.startswith(str(directory))  # type: ignore[attr-defined]
        assert str(directory) in str(err) and "\n" not in str(err)
        errors.append(str(err).replace(str(directory), "<cache>"))
    assert errors[0] == errors[1]


def test_a_cache_path_below_a_regular_file_is_a_cache_error(url: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    target = tmp_path / "file" / "cache"
    with pytest.raises(CacheError, match=str(target)) as exc:
        TokenDataset(url, seq_len=SEQ, cache_dir=str(target))
    one_line(exc)
    assert not isinstance(exc.value, DatasetError)  # the dataset is fine; the node's disk is not


_FULL_DISK = """
import json, resource, signal, sys, time
from ferry.client import TokenDataset, TokenLoader
from ferry.shard_tools.errors import FerryError
from ferry.client.fetching.cache import ShardCache
url, cache, workers, late = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "late"
if late:  # the background fetches fail only after every batch was read by frames
    in_background = ShardCache.ensure_in_background
    ShardCache.ensure_in_background = lambda self, info: (time.sleep(0.5), in_background(self, info))[1]
ds = TokenDataset(url, seq_len=16, cache_dir=cache)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    for _ in TokenLoader(ds, 2, num_workers=workers):
        pass
except FerryError as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc), "path": getattr(exc, "path", None)}))
"""


@pytest.mark.parametrize("late", ["", "late"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_is_a_cache_error_naming_the_file(url: str, tmp_path: Path, workers: int, late: str) -> None:
    """Also when only background fetches meet the full disk, after the last batch was read by frames
    ("late"): the error comes after the last batch; the loop never ends silently."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, url, str(cache), str(workers), late],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "CacheError", report
    assert report["path"].startswith(str(cache)) and report["path"] in report["message"]
    assert "File too large" in report["message"] and "\n" not in report["message"]
    assert not list(cache.glob("*.arrow")), "no partial shard left behind, under a final or a temp name"


def test_cache_errors_pickle_with_their_path() -> None:
    err = pickle.loads(pickle.dumps(CacheError("shard cache: cannot write /x/y: full", path="/x/y")))
    assert type(err) is CacheError and err.path == "/x/y" and str(err) == "shard cache: cannot write /x/y: full"
    assert isinstance(err, FerryError) and not isinstance(err, (DatasetError, ShardError))
