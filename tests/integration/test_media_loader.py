"""Reading media datasets as packed sequences: spans hold their items, resume is exact (with and without
DataLoader workers), stored formats agree, and a sample reads no other sample's media bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")
pytest.importorskip("torch", reason="the loader extra installs torch")

from ferry.client.media.dataset import MediaDataset  # noqa: E402
from ferry.client.media.loader import MediaLoader, decode_image  # noqa: E402
from ferry.shard_tools import PackOptions, pack  # noqa: E402
from ferry.shard_tools.errors import StateError, UsageError  # noqa: E402
from ferry.shard_tools.packer.packing import pack_documents  # noqa: E402
from tests.media_inputs import POLICY, image, pair_samples, write_tar  # noqa: E402

SEQ = 160


@pytest.fixture(scope="module")
def samples() -> list[dict[str, Any]]:
    out = pair_samples(48)
    for i in range(0, 48, 5):  # some documents with two images and a long caption
        out[i] = {**out[i], "0.png": image(40, 70, "PNG", 100 + i), "txt": "long caption " * (3 + i % 7)}
    return out


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory, samples: list[dict[str, Any]]) -> str:
    root = tmp_path_factory.mktemp("media-loader")
    tar = write_tar(root / "in.tar", samples)
    pack([str(tar)], str(root / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10,
                                                   frame_size=4096))  # fmt: skip
    return str(root / "ds")


def _stream(loader: MediaLoader, limit: int | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in loader:
        out.append(batch)
        if limit is not None and len(out) == limit:
            break
    return out


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in ("input_ids", "labels", "position_ids", "documents", "media_spans"):
            assert x[key].equal(y[key]), key
        assert [m.data for m in x["media"]] == [m.data for m in y["media"]]
        assert x["positions"] == y["positions"]


def _rows(batch: dict[str, Any]) -> list[tuple[list[int], list[bytes]]]:
    spans = batch["media_spans"][:, 0].tolist()
    return [
        (ids.tolist(), [m.data for m, r in zip(batch["media"], spans, strict=True) if r == row])
        for row, ids in enumerate(batch["input_ids"])
    ]


def _dataset(url: str, **kw: Any) -> MediaDataset:
    return MediaDataset(url, SEQ, seed=3, epochs=2, max_images=3, **kw)


def test_sequences_hold_their_media_and_documents(dataset_url: str, samples: list[dict[str, Any]]) -> None:
    ds = _dataset(dataset_url)
    begin, patch, end = ds.policy.ids
    sources = {v for s in samples for k, v in s.items() if k not in ("__key__", "txt")}
    seen = 0
    stop = ds.end()  # the last batch reaches past the two epochs' end: its rows there are not counted
    for batch in _stream(MediaLoader(ds, 4)):
        ids = batch["input_ids"].numpy()
        assert ids.shape[1] == SEQ
        for (row, start, length), item in zip(batch["media_spans"].tolist(), batch["media"], strict=True):
            span = ids[row, start : start + length]
            assert span[0] == begin and span[-1] == end and (span[1:-1] == patch).all()
            assert length == item.cost and item.data in sources
            seen += batch["positions"][row] < stop
        for row in range(ids.shape[0]):
            docs = batch["documents"].numpy()
            mine = docs[docs[:, 0] == row]
            assert mine[:, 3].sum() <= SEQ and (batch["media_spans"][:, 0] == row).sum() <= 3
            assert (batch["labels"][row][np.isin(ids[row], [begin, patch, end])[1:].nonzero()[0]] == -100).all()
    assert seen == 2 * sum(1 for s in samples for k in s if k not in ("__key__", "txt"))  # two epochs, all items


@pytest.mark.parametrize("cut", [1, 6, 13])
def test_resume_mid_stream_equals_uninterrupted(dataset_url: str, cut: int) -> None:
    full = _stream(MediaLoader(_dataset(dataset_url), 3))
    assert len(full) > cut
    first = MediaLoader(_dataset(dataset_url), 3)
    head = _stream(first, cut)
    state = first.state_dict()
    again = MediaLoader(_dataset(dataset_url), 3)
    again.load_state_dict(state)
    _same(head + _stream(again), full)


def test_workers_give_the_same_stream_and_resume(dataset_url: str) -> None:
    full = _stream(MediaLoader(_dataset(dataset_url), 3))
    two = MediaLoader(_dataset(dataset_url), 3, num_workers=2)
    head = _stream(two, 5)
    again = MediaLoader(_dataset(dataset_url), 3, num_workers=2)
    again.load_state_dict(two.state_dict())
    _same(head + _stream(again), full)


def test_spawned_workers_give_the_same_stream(dataset_url: str) -> None:
    """Workers started by spawn get the dataset pickled (its reader is made anew in each)."""
    full = _stream(MediaLoader(_dataset(dataset_url), 3))
    spawned = MediaLoader(_dataset(dataset_url), 3, num_workers=1, multiprocessing_context="spawn")
    _same(_stream(spawned), full)


def test_state_of_another_reading_is_refused(dataset_url: str) -> None:
    loader = MediaLoader(_dataset(dataset_url), 3)
    _stream(loader, 2)
    other = MediaLoader(MediaDataset(dataset_url, SEQ + 1, seed=3, epochs=2, max_images=3), 3)
    with pytest.raises(StateError):
        other.load_state_dict(loader.state_dict())


def test_stored_formats_agree_and_decode_hook(tmp_path: Path, samples: list[dict[str, Any]], dataset_url: str) -> None:
    tar = write_tar(tmp_path / "in.tar", samples)
    pack([str(tar)], str(tmp_path / "f1"), PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10,
                                                       stored_format=1))  # fmt: skip
    _same(_stream(MediaLoader(_dataset(str(tmp_path / "f1")), 3)), _stream(MediaLoader(_dataset(dataset_url), 3)))
    ds = _dataset(dataset_url, decode=decode_image)
    sample = ds.sample(0, 0)
    assert sample["media"] and all(m.size[0] > 0 and m.mode == "RGB" for m in sample["media"])


def test_a_sample_reads_no_other_samples_media(tmp_path: Path) -> None:
    """One shard of incompressible images in 4 KiB frames: reading one sequence fetches its own media, the
    shard's metadata and a few frames around them, nothing near the shard's size."""
    docs = [{"__key__": f"k{i:03d}", "png": image(96, 96, "PNG", i), "txt": f"t{i}"} for i in range(30)]
    tar = write_tar(tmp_path / "big.tar", docs)
    pack([str(tar)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY, frame_size=4096))
    ds = MediaDataset(str(tmp_path / "ds"), 64, seed=1, max_images=1)
    total = ds.manifest.totals["media_bytes"]
    frames = ds.reader().frames
    assert frames is not None
    ds.pieces()  # the metadata of every shard: no media bytes
    metadata = frames.stats.bytes_read
    sample = ds.sample(0, 0)
    own = sum(len(m.data) for m in sample["media"])
    read = frames.stats.bytes_read - metadata
    assert own > 0 and read <= own * 1.1 + 3 * 4096 + 4096, (read, own)
    assert metadata < total / 10, (metadata, total)


def test_a_text_dataset_reads_as_sequences_without_media(tmp_path: Path) -> None:
    docs = [list(range(1, 2 + i % 9)) for i in range(300)]
    pack_documents(docs, str(tmp_path / "t"), PackOptions(vocab_size=16, eos_id=0, shard_size=1024))
    ds = MediaDataset(str(tmp_path / "t"), 16, seed=2, epochs=1)
    assert ds.policy is None and len(ds.manifest.shards) > 1
    pieces = []
    for s in ds:
        assert s["media"] == [] and s["media_spans"].shape == (0, 2)
        for _d, start, length, _a in s["documents"].tolist():
            pieces.append(s["input_ids"][start : start + length].tolist())
    assert sorted(pieces) == sorted(d + [0] for d in docs)  # every document once, EOS appended
    with pytest.raises(UsageError):
        MediaDataset(str(tmp_path / "t"), 16, rank=2, world_size=2)


def test_a_remote_replica_gives_the_same_stream(
    dataset_url: str, samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    """memory:// is read as a remote replica: shards' metadata several at a time, frames by ranged reads."""
    import uuid

    tar = write_tar(tmp_path / "in.tar", samples)
    url = f"memory://media-{uuid.uuid4().hex}"
    pack([str(tar)], url, PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10, frame_size=4096))
    remote = _dataset(url)
    assert not remote.replicas.local(0) and len(remote.manifest.shards) > 2
    _same(_stream(MediaLoader(remote, 3)), _stream(MediaLoader(_dataset(dataset_url), 3)))


def test_ranks_read_the_one_stream_in_turn(dataset_url: str) -> None:
    """Rank ``r`` of 3 reads positions ``r, r + 3, …``; all as many, the last round reaching into epoch 1."""
    whole = [s["input_ids"].tolist() for s in MediaDataset(dataset_url, SEQ, seed=3, epochs=2)]
    parts = [[s["input_ids"].tolist() for s in MediaDataset(dataset_url, SEQ, seed=3, epochs=1, rank=r, world_size=3)]
             for r in range(3)]  # fmt: skip
    n = MediaDataset(dataset_url, SEQ, seed=3).sequences(0)
    assert [len(p) for p in parts] == [-(-n // 3)] * 3
    assert [x for row in zip(*parts, strict=True) for x in row] == whole[: 3 * len(parts[0])]


def test_prefetch_fetches_a_batch_at_once_and_workers_reuse_the_metadata(
    samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    """From a remote replica a batch's frames come in one parallel prefetch: making its samples then reads
    nothing more; a reader made anew (as in a DataLoader worker) starts from the shards' metadata already read."""
    import uuid

    tar = write_tar(tmp_path / "in.tar", samples)
    url = f"memory://media-{uuid.uuid4().hex}"
    pack([str(tar)], url, PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10, frame_size=4096))
    ds = _dataset(url)
    ds.pieces()
    ds._pid = -1  # the next reader() is made anew, as in a forked worker
    frames = ds.reader().frames
    assert frames is not None and frames.threads > 1
    assert [ds.reader().shard(s).meta.items for s in range(len(ds.manifest.shards))]
    assert frames.stats.bytes_read == 0  # the metadata came with the dataset
    chunk = [(0, i) for i in range(3)]
    ds.prefetch(chunk)
    fetched = frames.stats.bytes_read
    assert fetched > 0
    got = [ds.sample(*p) for p in chunk]
    assert frames.stats.bytes_read == fetched and sum(len(s["media"]) for s in got) > 0


def test_local_reads_of_a_truncated_or_missing_shard_fail_cleanly(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    """A local dataset is read with pread in the calling thread: a shard cut short after the dataset was opened,
    or removed, fails the sample with the shard's error, not a short read handed on."""
    from ferry.shard_tools.errors import ShardError

    tar = write_tar(tmp_path / "in.tar", samples)
    pack([str(tar)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY, frame_size=4096))
    ds = MediaDataset(str(tmp_path / "ds"), SEQ, seed=1)
    ds.pieces()
    shard = tmp_path / "ds" / ds.manifest.shards[0].path
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ShardError, match="truncated|digest"):
        for index in range(ds.sequences(0)):
            ds.sample(0, index)
    shard.unlink()
    ds._pid = -1  # a fresh reader, as in a new worker
    with pytest.raises(ShardError):
        for index in range(ds.sequences(0)):
            ds.sample(0, index)


def _memory_dataset(samples: list[dict[str, Any]], tmp_path: Path) -> tuple[str, str, list[Any]]:
    """The samples packed at a ``memory://`` URL (remote, as the loader sees it; forked workers read it too), a
    cache directory for it, and its plain stream (token ids and media bytes of each sequence, no cache)."""
    import uuid

    tar = write_tar(tmp_path / "in.tar", samples)
    url = f"memory://media-{uuid.uuid4().hex}"
    pack([str(tar)], url, PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10, frame_size=4096))
    plain = [(s["input_ids"].tolist(), [m.data for m in s["media"]]) for s in MediaDataset(url, SEQ, seed=1, epochs=1)]
    return url, str(tmp_path / "cache"), plain


def test_a_disk_cache_serves_a_remote_dataset_once_filled(samples: list[dict[str, Any]], tmp_path: Path) -> None:
    """With ``cache_dir`` the shards read by frames are fetched whole into the node cache in the background; a
    later reader (another epoch, job or worker) reads them from disk, no frames, the same samples; a cached file
    spoilt on disk is fetched again."""
    url, cache, plain = _memory_dataset(samples, tmp_path)
    first = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
    rows = [row for batch in MediaLoader(first, 1, num_workers=1) for row in _rows(batch)]  # a worker fills it
    assert rows[: len(plain)] == plain
    # every shard the worker read is in the cache, whole
    assert first.cache is not None and all(first.cache.present(info) for info in first.manifest.shards)
    # and the shard table, which every later process of the node reads from there
    assert [p.suffix for p in (Path(cache) / "tables").iterdir()] == [".arrow"]

    def again() -> tuple[MediaDataset, list[Any], int]:
        ds = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
        ds.pieces()
        frames = ds.reader().frames
        assert frames is not None
        before = frames.stats.bytes_read
        got = [(s["input_ids"].tolist(), [m.data for m in s["media"]]) for s in ds]
        return ds, got, frames.stats.bytes_read - before

    ds, got, read = again()
    assert got == plain and read == 0 and ds.cache is not None and ds.cache.fetches == 0
    victim = Path(ds.cache.path(ds.manifest.shards[0]))
    spoilt = bytearray(victim.read_bytes())
    spoilt[len(spoilt) // 2] ^= 0xFF
    victim.write_bytes(bytes(spoilt))
    ds, got, _ = again()
    assert got == plain and ds.cache is not None and ds.cache.fetches == 1


def test_bad_bytes_kept_on_the_node_never_reach_a_sample(samples: list[dict[str, Any]], tmp_path: Path) -> None:
    """Two workers read frames and fill shards through a node directory whose kept bytes are wrong in many places
    (valid records, wrong bytes): every sample is the plain stream's, and every shard ends in the cache whole."""
    from ferry.client.fetching.arrived import ArrivedBytes

    url, cache, plain = _memory_dataset(samples, tmp_path)
    ds = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
    assert ds.replicas.arrived is not None and ds.replicas.share_fills
    arrived = ArrivedBytes(cache)
    shards = ds.manifest.shards
    for i in range(len(shards)):
        info = shards[i]
        for offset in range(0, info.stored_bytes, 1500):
            arrived.keep(info, offset, bytes([0x5A]) * min(700, info.stored_bytes - offset))
    rows = [row for batch in MediaLoader(ds, 1, num_workers=2) for row in _rows(batch)]
    assert rows[: len(plain)] == plain
    assert ds.cache is not None and all(ds.cache.present(shards[i]) for i in range(len(shards)))
    check = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
    assert [(s["input_ids"].tolist(), [m.data for m in s["media"]]) for s in check] == plain  # from the cache


def test_metadata_of_cached_shards_comes_from_the_cache(samples: list[dict[str, Any]], tmp_path: Path) -> None:
    """Shards already in the node cache give their metadata from the local file (no ranged read at all); a cached
    shard that leaves the cache afterwards is read by frames again, its media layout then read from its head."""
    url, cache, plain = _memory_dataset(samples, tmp_path)
    filled = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
    for info in filled.manifest.shards:
        assert filled.cache is not None
        filled.cache.open(info).release()
    ds = MediaDataset(url, SEQ, seed=1, epochs=1, cache_dir=cache)
    ranged: list[int] = []
    read_range = ds.replicas.read_range

    def counted(info: Any, offset: int, length: int, **kw: Any) -> bytes:
        ranged.append(length)
        return read_range(info, offset, length, **kw)

    ds.replicas.read_range = counted  # type: ignore[method-assign]  # every frame reader made from here on
    ds.pieces()
    assert ranged == []  # every shard's metadata came from its cached file
    reader = ds.reader()
    items = [reader.shard(s).meta.items for s in range(len(ds.manifest.shards))]
    from_cache = [[m.data for m in reader.items(s, 0, n)] for s, n in enumerate(items)]
    assert ranged == [] and [(s["input_ids"].tolist(), [m.data for m in s["media"]]) for s in ds] == plain
    assert ds._cached is not None and ds.cache is not None
    ds._cached.close()  # the leases go; the files then leave the cache
    for info in ds.manifest.shards:
        Path(ds.cache.path(info)).unlink()
    assert [[m.data for m in reader.items(s, 0, n)] for s, n in enumerate(items)] == from_cache
    assert ranged and all(reader.shard(s).layout is not None for s in range(len(items)))


def _pixels(item: Any) -> Any:
    """A ``decode`` hook returning numpy arrays (decoded pixels), as a training job's often does."""
    return np.asarray(decode_image(item))


def test_decoded_arrays_from_workers_equal_the_in_process_ones_and_share_one_buffer_per_batch(
    dataset_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferry.client.media import handover

    monkeypatch.setattr(handover, "MIN_BYTES", 0)  # the test's images are small: pack every batch (workers fork)
    here = _stream(MediaLoader(_dataset(dataset_url, decode=_pixels), 3))
    there = _stream(MediaLoader(_dataset(dataset_url, decode=_pixels), 3, num_workers=2))
    assert len(here) == len(there)
    for a, b in zip(here, there, strict=True):
        assert a["positions"] == b["positions"] and a["media_spans"].equal(b["media_spans"])
        assert len(a["media"]) == len(b["media"])
        for x, y in zip(a["media"], b["media"], strict=True):
            assert x.dtype == y.dtype == np.uint8 and x.shape == y.shape and np.array_equal(x, y)
        roots = []
        for y in b["media"]:
            while isinstance(y.base, np.ndarray):
                y = y.base
            roots.append(y.base)
        assert all(r is not None and r is roots[0] for r in roots)  # views of one shared buffer per batch
    assert sum(len(b["media"]) for b in there) > 20
