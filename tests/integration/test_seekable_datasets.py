"""Seekable datasets (format 3, the default, and format 2) end to end: pack → sync → verify → load, beside
format 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ferry.client.fetching.pools import DaemonPool
from ferry.client.stream.dataset import TokenDataset
from ferry.client.stream.loader import TokenLoader
from ferry.client.stream.reader import FRAMES_FIRST_MIN
from ferry.service.replication.engine import Engine
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import decode_stored_shard, open_dataset
from ferry.shard_tools.errors import ShardDigestError
from ferry.shard_tools.format.digest import tree_digest
from ferry.shard_tools.format.megatron import write_megatron
from ferry.shard_tools.format.seekable import MIN_FRAME_SIZE, find_index, parse_index
from ferry.shard_tools.packer.packing import PackOptions, pack
from ferry.shard_tools.storage.store import resolve
from ferry.shard_tools.verification import verify

VOCAB, EOS = 1000, 999
SHARD = 16 << 10  # several shards per input, several frames per shard
FRAME = MIN_FRAME_SIZE
ROOT = Path(__file__).resolve().parents[2]


def make_docs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, EOS, size=int(rng.integers(1, 400))) for _ in range(n)]


def write_input(kind: str, tmp: Path, docs: list[np.ndarray]) -> tuple[list[str], dict[str, Any]]:
    """One input file of ``kind`` holding ``docs``, and the pack options it needs."""
    tokens = {"vocab_size": VOCAB, "eos_id": EOS}
    if kind == "parquet":
        pq.write_table(pa.table({"tokens": pa.array([d.tolist() for d in docs])}), tmp / "in.parquet")
        return [str(tmp / "in.parquet")], tokens
    if kind == "jsonl":
        (tmp / "in.jsonl").write_text("".join(json.dumps({"tokens": d.tolist()}) + "\n" for d in docs))
        return [str(tmp / "in.jsonl")], tokens
    if kind == "npy":
        np.save(tmp / "in.npy", np.concatenate([np.append(d, EOS) for d in docs]).astype(np.uint16))
        return [str(tmp / "in.npy")], tokens
    if kind == "megatron":
        write_megatron(str(tmp / "corpus"), docs, np.dtype(np.uint16))
        return [str(tmp / "corpus.bin")], tokens
    if kind == "arrow":
        table = pa.table({"tokens": pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32()))})
        with pa.ipc.new_stream(str(tmp / "in.arrow"), table.schema) as writer:
            writer.write_table(table)
        return [str(tmp / "in.arrow")], tokens
    text = "".join(bytes((d % 200 + 32).astype(np.uint8)).decode("latin-1").replace("\n", " ") + "\n" for d in docs)
    (tmp / "in.txt").write_text(text, encoding="utf-8")
    return [str(tmp / "in.txt")], {"tokenizer": "bytes", "text_per_line": True}


def sync(src_url: str, dst_url: str, dst_options: dict[str, Any]) -> None:
    eng = Engine(Executor(transfers=4, backoff=(0.001, 0.01)), State(None))
    res = eng.sync_pass("ds", "a", "b", {"a": resolve(src_url), "b": resolve(dst_url, dst_options)})
    assert res.ok and res.published


def samples(url: str, cache: Path, shuffle: str, options: dict[str, Any] | None = None, **kw: Any) -> np.ndarray:
    ds = TokenDataset(url, seq_len=64, seed=7, shuffle=shuffle, cache_dir=str(cache), storage_options=options, **kw)
    try:
        return np.asarray(ds.payload(np.arange(ds.num_samples))["windows"])
    finally:
        ds.close()


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "npy", "megatron", "arrow", "text"])
def test_every_input_format_packs_to_every_stored_format_identically(kind: str, tmp_path: Path) -> None:
    inputs, opts = write_input(kind, tmp_path, make_docs(150, 1))
    urls = {}
    for fmt in (1, 2, 3):
        urls[fmt] = str(tmp_path / f"f{fmt}")
        pack(inputs, urls[fmt], PackOptions(shard_size=SHARD, stored_format=fmt, frame_size=FRAME, **opts))
    ds = {fmt: open_dataset(url) for fmt, url in urls.items()}
    for fmt, d in ds.items():
        assert {s.stored_format for s in d.manifest.shards} == {fmt}
    # the same Arrow content: the same raw digests in formats 1 and 2, the tree over it in format 3
    raws = [decode_stored_shard(info, ds[1].read_stored(i)) for i, info in enumerate(ds[1].manifest.shards)]
    assert [s.raw_digest for s in ds[1].manifest.shards] == [s.raw_digest for s in ds[2].manifest.shards]
    assert [s.raw_digest for s in ds[3].manifest.shards] == [tree_digest(raw, FRAME) for raw in raws]
    assert all(s.path.endswith(".s3.arrow.zst") and s.frame_size == FRAME for s in ds[3].manifest.shards)
    assert [d.tolist() for d in ds[1].documents()] == [d.tolist() for d in ds[3].documents()]
    assert [d.tolist() for d in ds[2].documents()] == [d.tolist() for d in ds[3].documents()]
    for fmt in (2, 3):
        synced = str(tmp_path / f"synced{fmt}")
        sync(urls[fmt], synced, {})
        assert verify(synced).ok
        for shuffle in ("global", "window"):
            a = samples(urls[1], tmp_path / f"c1{shuffle}{fmt}", shuffle)
            b = samples(synced, tmp_path / f"c2{shuffle}{fmt}", shuffle, cache_limit=SHARD)  # small cache: frames
            assert np.array_equal(a, b)


def test_sync_verify_and_load_format_3_on_every_backend(backend: Any, tmp_path: Path) -> None:
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 2))
    src = str(tmp_path / "src")
    pack(inputs, src, PackOptions(shard_size=SHARD, stored_format=3, frame_size=FRAME, **opts))
    dst = backend.url("ds")
    sync(src, dst, backend.storage_options)
    # the stored bytes travel unchanged
    src_loc, dst_loc = resolve(src), resolve(dst, backend.storage_options)
    for info in open_dataset(src).manifest.shards:
        assert dst_loc.read_bytes(info.path) == src_loc.read_bytes(info.path)
    report = verify(dst, storage_options=backend.storage_options)
    assert report.ok and report.checked == report.shards > 3
    ref = samples(src, tmp_path / "ref", "global")
    # a cache smaller than the dataset: global shuffle reads frames over the backend's ranged reads
    ds = TokenDataset(dst, seq_len=64, seed=7, cache_dir=str(tmp_path / "c"), cache_limit=SHARD,
                      storage_options=backend.storage_options)  # fmt: skip
    got = np.asarray(ds.payload(np.arange(ds.num_samples))["windows"])
    assert np.array_equal(got, ref)
    assert ds.reader.frames is not None and ds.reader.frames.stats.index_reads > 0 and ds.cache.fetches == 0
    ds.close()


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ferry.shard_tools.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip


def test_mixed_formats_append_loads_and_verifies(tmp_path: Path) -> None:
    first, second = make_docs(200, 3), make_docs(200, 4)
    out = str(tmp_path / "ds")
    pack(write_input("parquet", tmp_path, first)[0], out,
         PackOptions(shard_size=SHARD, stored_format=1, vocab_size=VOCAB, eos_id=EOS))  # fmt: skip
    (tmp_path / "more").mkdir()
    more = write_input("jsonl", tmp_path / "more", second)[0]
    done = ferry("pack", *more, "--out", out, "--append", "--format", "2", "--shard-size", str(SHARD),
                 "--vocab-size", str(VOCAB), "--eos-id", str(EOS))  # fmt: skip
    assert done.returncode == 0, done.stderr
    ds = open_dataset(out)
    formats = [s.stored_format for s in ds.manifest.shards]
    assert formats[0] == 1 and formats[-1] == 2 and formats == sorted(formats)
    assert [d.tolist() for d in ds.documents()] == [d.tolist() for d in first + second]
    assert ferry("verify", out).returncode == 0
    whole = samples(out, tmp_path / "c-whole", "window")
    framed = samples(out, tmp_path / "c-frames", "global", cache_limit=SHARD)
    ref_ds = TokenDataset(out, seq_len=64, seed=7, shuffle="global", cache_dir=str(tmp_path / "c-ref"))
    assert np.array_equal(framed, np.asarray(ref_ds.payload(np.arange(ref_ds.num_samples))["windows"]))
    assert whole.shape == framed.shape
    ref_ds.close()
    # the older version (format 1 only) still reads and verifies
    assert verify(out, version=ds.manifest.parent).ok
    assert ferry("pack", *more, "--out", str(tmp_path / "x"), "--format", "4", "--vocab-size", "9").returncode == 2


def test_frame_size_is_chosen_on_the_command_line(tmp_path: Path) -> None:
    docs = make_docs(120, 5)
    inputs = write_input("jsonl", tmp_path, docs)[0]
    common = ["--vocab-size", str(VOCAB), "--eos-id", str(EOS), "--shard-size", str(SHARD)]
    out = str(tmp_path / "small")
    done = ferry("pack", *inputs, "--out", out, "--format", "3", "--frame-size", "4KiB", *common)
    assert done.returncode == 0, done.stderr
    ds = open_dataset(out)
    info = ds.manifest.shards[0]
    body = ds.read_stored(0)
    n = find_index(memoryview(body), info.path)
    index = parse_index(body[-n:], shard=info.path, stored_bytes=len(body), raw_bytes=info.raw_bytes)
    assert index.frame_size == 4096 and index.frames == -(-info.raw_bytes // 4096)
    assert [d.tolist() for d in ds.documents()] == [d.tolist() for d in docs]
    assert ferry("verify", out).returncode == 0
    default = ferry("pack", *inputs, "--out", str(tmp_path / "default"), "--frame-size", "4KiB", *common)
    assert default.returncode == 0, default.stderr  # format 3 is the default
    assert open_dataset(str(tmp_path / "default")).manifest.shards[0].stored_format == 3
    assert open_dataset(str(tmp_path / "default")).manifest.shards[0].frame_size == 4096
    wrong = ferry("pack", *inputs, "--out", str(tmp_path / "f1"), "--format", "1", "--frame-size", "4KiB", *common)
    assert wrong.returncode == 2 and "formats 2 and 3 only" in wrong.stderr
    tiny = ferry("pack", *inputs, "--out", str(tmp_path / "f2"), "--format", "2", "--frame-size", "1KiB", *common)
    assert tiny.returncode == 2 and "outside" in tiny.stderr


def flip_in_frame(url: str, shard: int, frame: int) -> str:
    """Flip one byte in the middle of ``frame`` of seekable shard ``shard``; returns the shard path."""
    info = open_dataset(url).manifest.shards[shard]
    path = os.path.join(url, info.path)
    body = bytearray(Path(path).read_bytes())
    n = find_index(memoryview(body), info.path)
    index = parse_index(body[-n:], shard=info.path, stored_bytes=len(body), raw_bytes=info.raw_bytes)
    offset, length = index.span(frame)
    body[offset + length // 2] ^= 0x40
    Path(path).write_bytes(bytes(body))
    return info.path


def test_flipped_byte_named_by_verify_and_caught_by_the_loader(tmp_path: Path, caplog: Any) -> None:
    out, good = str(tmp_path / "ds"), str(tmp_path / "good")
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 5))
    pack(inputs, out, PackOptions(shard_size=SHARD, stored_format=3, frame_size=FRAME, **opts))
    pack(inputs, good, PackOptions(shard_size=SHARD, stored_format=3, frame_size=FRAME, **opts))
    path = flip_in_frame(out, 1, 2)
    done = ferry("verify", out)
    assert done.returncode == 1
    assert f"BAD {path}: shard {path}: frame 2 does not match its digest" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 2  # one shard named, then the summary; no traceback
    ds = TokenDataset(out, seq_len=64, seed=7, shuffle="none", cache_dir=str(tmp_path / "c"), cache_limit=SHARD,
                      prefetch=0)  # fmt: skip
    ds.reader.whole_shards = False  # read every shard by frames (as a global shuffle over a big dataset does)
    ds.payload(np.arange(2))  # shard 0 is fine
    # the bad frame is caught when read; the shard is then fetched whole, which finds no good copy either
    with pytest.raises(ShardDigestError, match=f"{path}: no replica has a good copy"):
        ds.payload(np.arange(ds.num_samples))
    assert f"shard {path}: frame 2 does not match its digest" in caplog.text
    ds.close()
    # with a second replica holding a good copy, the same read gives the right samples
    both = TokenDataset([out, good], seq_len=64, seed=7, shuffle="none", cache_dir=str(tmp_path / "c2"), prefetch=0)
    both.reader.whole_shards = False
    ref = samples(good, tmp_path / "c3", "none")
    assert np.array_equal(np.asarray(both.payload(np.arange(both.num_samples))["windows"]), ref)
    both.close()


@pytest.mark.parametrize("shuffle", ["window", "global"])
def test_a_cold_epoch_over_shards_of_few_frames_reads_each_shard_once(tmp_path: Path, shuffle: str) -> None:
    """Shards of at most FRAMES_FIRST_MIN frames are fetched whole at once: read by frames first (as a bigger
    shard is) they cost up to twice their stored bytes, since their whole fetch follows anyway."""
    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(2000, 6))
    pack(inputs, out, PackOptions(shard_size=2 * FRAME, stored_format=3, frame_size=FRAME, **opts))
    m = open_dataset(out).manifest
    assert len(m.shards) >= 4 and int(m.shards.raw_bytes.max()) <= FRAMES_FIRST_MIN * FRAME
    ds = TokenDataset(out, seq_len=64, seed=3, shuffle=shuffle, window=2, cache_dir=str(tmp_path / "c"))
    loader = TokenLoader(ds, batch_size=8)
    batches = sum(1 for _ in loader)
    stats = loader.stats()
    assert batches > 0 and ds.reader.frames is not None and ds.reader.frames.stats.frames == 0
    assert stats["downloaded_bytes"] == int(m.shards.stored_bytes.sum())
    ds.close()


def test_cold_first_batch_reads_only_the_frames_it_touches(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(2000, 6))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=3, frame_size=FRAME, **opts))
    seq = 64
    # the default prefetch: the shards read by frames are also fetched whole, by a helper thread; here the
    # fetches are recorded instead, so that none lands in the cache in the middle of the batch
    ds = TokenDataset(out, seq_len=seq, seed=3, shuffle="global", cache_dir=str(tmp_path / "c"))
    scheduled: list[int] = []
    ds.reader._fetch_whole = lambda s, info: scheduled.append(s)  # type: ignore[method-assign]
    positions = np.arange(16)
    batch = np.asarray(ds.payload(positions)["windows"])
    # which frames those samples touch, computed here from the manifest and the frame indexes
    m = ds.manifest
    touched: set[tuple[int, int]] = set()
    whole: set[int] = set()  # shards of at most FRAMES_FIRST_MIN frames (the last one here): fetched whole at once
    for start in (ds.sample_ids(positions) * seq).tolist():
        for tok in (start, start + seq):
            s = int(np.searchsorted(m.shards.token_offsets, tok, side="right")) - 1
            if m.shards[s].raw_bytes <= FRAMES_FIRST_MIN * FRAME:
                whole.add(s)
                continue
            index = ds.reader.frames.index(m.shards[s])  # type: ignore[union-attr]
            local = tok - int(m.shards.token_offsets[s])
            touched.add((s, (index.tokens_pos + 2 * local) // index.frame_size))
    stats = ds.reader.frames.stats  # type: ignore[union-attr]
    total_frames = sum(-(-s.raw_bytes // FRAME) for s in m.shards)
    # and each shard's frame 0 for its Arrow head, which the frame index is checked against
    assert stats.frames == len(touched) + len({s for s, _ in touched}) < total_frames // 4
    assert stats.index_reads == len({s for s, _ in touched}) == len(scheduled)
    assert sorted(scheduled) == sorted({s for s, _ in touched}) and ds.cache.fetches == len(whole)
    ref = TokenDataset(out, seq_len=seq, seed=3, shuffle="global", cache_dir=str(tmp_path / "c-ref"))
    ref.reader.frames = None  # whole shards through the cache, as format 1 reads them
    assert np.array_equal(batch, np.asarray(ref.payload(positions)["windows"]))
    ds.close()
    ref.close()


@pytest.mark.parametrize("cores", [1, 2])
def test_prefetch_of_whole_shards_waits_for_the_frames_of_the_batch_at_hand(
    tmp_path: Path, monkeypatch: Any, cores: int
) -> None:
    """A cold first batch reads its frames first; the whole shards the prefetch wants are submitted after,
    so they do not compete with those frames. With a second core, one whole fetch of this local dataset starts
    at once: the frames are read by the gathering thread, so it takes a core that would idle."""
    import ferry.client.fetching.prefetcher as prefetcher_module

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(cores)))

    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(2000, 6))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=3, frame_size=FRAME, **opts))
    frames_read_at_submit: list[int] = []

    class Recording(DaemonPool):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            frames_read_at_submit.append(ds.reader.frames.stats.frames)  # type: ignore[union-attr]
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(prefetcher_module, "DaemonPool", Recording)
    ds = TokenDataset(out, seq_len=64, seed=3, shuffle="global", cache_dir=str(tmp_path / "c"))
    it = iter(TokenLoader(ds, batch_size=16))
    next(it)
    assert ds.reader.frames is not None and ds.reader.frames.stats.frames > 0
    assert frames_read_at_submit and frames_read_at_submit.count(0) == cores - 1, frames_read_at_submit
    assert len(frames_read_at_submit) > cores, frames_read_at_submit
    rest = sum(1 for _ in it)  # the epoch still completes, the prefetched shards landing in the cache
    assert rest > 0 and ds.cache.fetches > 0
    ds.close()


def test_window_batches_wait_for_a_started_whole_fetch_instead_of_reading_frames(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """After a cold first batch by frames, the window's shards are being fetched whole: the next batches
    wait for them rather than read more frames (which cost far more bytes per sample and slow the fetch)."""
    import time

    from ferry.client.fetching.cache import ShardCache

    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(2000, 6))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=3, frame_size=FRAME, **opts))
    download = ShardCache._download

    def slow(self: ShardCache, info: Any, path: str) -> None:
        time.sleep(0.3)  # a remote replica: the whole shard takes a while
        download(self, info, path)

    monkeypatch.setattr(ShardCache, "_download", slow)
    ds = TokenDataset(out, seq_len=64, seed=3, shuffle="window", window=2, cache_dir=str(tmp_path / "c"))
    it = iter(TokenLoader(ds, batch_size=16))
    first = next(it)["input_ids"]
    frames = ds.reader.frames
    assert frames is not None and frames.stats.frames > 0  # the cold first batch was read by frames
    after_first = frames.stats.frames
    rest = [next(it)["input_ids"] for _ in range(5)]
    assert frames.stats.frames == after_first, (after_first, frames.stats.frames)
    ref = TokenDataset(out, seq_len=64, seed=3, shuffle="window", window=2, cache_dir=str(tmp_path / "c-ref"))
    ref.reader.frames = None
    ref_it = iter(TokenLoader(ref, batch_size=16))
    for got in [first, *rest]:
        assert torch.equal(got, next(ref_it)["input_ids"])
    del it, ref_it
    ds.close()
    ref.close()


def test_a_global_shuffle_of_local_data_reads_frames_for_its_first_batch_only(tmp_path: Path, monkeypatch: Any) -> None:
    """From a local replica, a shard whose whole fetch started is waited for, not read by frames (each sample
    decompresses a whole frame again): only the cold first batch reads frames, however slow the whole fetches."""
    import time

    from ferry.client.fetching.cache import ShardCache

    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(2000, 6))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=3, frame_size=FRAME, **opts))
    download = ShardCache._download

    def slow(self: ShardCache, info: Any, path: str) -> None:
        time.sleep(0.3)  # a loaded machine: the whole shards land well after the first batch
        download(self, info, path)

    monkeypatch.setattr(ShardCache, "_download", slow)
    ds = TokenDataset(out, seq_len=64, seed=3, shuffle="global", cache_dir=str(tmp_path / "c"))
    it = iter(TokenLoader(ds, batch_size=16))
    first = next(it)["input_ids"]
    frames = ds.reader.frames
    assert frames is not None and frames.stats.frames > 0  # the cold first batch was read by frames
    after_first = frames.stats.frames
    rest = [next(it)["input_ids"] for _ in range(5)]
    assert frames.stats.frames == after_first, (after_first, frames.stats.frames)
    ref = TokenDataset(out, seq_len=64, seed=3, shuffle="global", cache_dir=str(tmp_path / "c-ref"))
    ref.reader.frames = None
    ref_it = iter(TokenLoader(ref, batch_size=16))
    for got in [first, *rest]:
        assert torch.equal(got, next(ref_it)["input_ids"])
    del it, ref_it
    ds.close()
    ref.close()


def test_loader_over_formats_2_and_3_equals_format_1(tmp_path: Path) -> None:
    inputs, opts = write_input("parquet", tmp_path, make_docs(400, 8))
    batches = {}
    for fmt in (1, 2, 3):
        url = str(tmp_path / f"f{fmt}")
        pack(inputs, url, PackOptions(shard_size=SHARD, stored_format=fmt, frame_size=FRAME, **opts))
        ds = TokenDataset(url, seq_len=32, seed=1, shuffle="window", window=2, cache_dir=str(tmp_path / f"c{fmt}"))
        loader = TokenLoader(ds, batch_size=4)
        batches[fmt] = [b["input_ids"].numpy().copy() for _, b in zip(range(20), loader, strict=False)]
        ds.close()
    assert all(np.array_equal(a, b) for a, b in zip(batches[1], batches[2], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(batches[1], batches[3], strict=True))


def test_a_sample_running_into_a_cold_format_3_shard_reads_its_head_by_frames(tmp_path: Path) -> None:
    """A window's last sample of a shard runs on into the next shard. In format 3 its head is read by frames:
    with a cache of less than half the dataset, each shard is fetched whole once an epoch (for its own window),
    not once more for the sample of the shard before (that would double the bytes downloaded)."""
    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(3000, 8))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=3, frame_size=FRAME, **opts))
    shards = len(open_dataset(out).manifest.shards)
    assert shards >= 12
    # no prefetch: every whole fetch is one a batch asked for (the prefetch's own churn in a tiny cache aside)
    kw: dict[str, Any] = {"seq_len": 64, "seed": 5, "shuffle": "window", "window": 2, "cache_limit": 8 * 4 * SHARD}
    kw["prefetch"] = 0
    ds = TokenDataset(out, cache_dir=str(tmp_path / "c"), **kw)
    got = [b["input_ids"] for b in TokenLoader(ds, batch_size=16)]
    assert shards <= ds.cache.fetches <= shards + 2, (ds.cache.fetches, shards)  # + the next epoch's first window
    ref = TokenDataset(out, cache_dir=str(tmp_path / "c-ref"), **kw)
    ref.reader.frames = None  # whole shards through the cache, as format 1 reads them
    want = [b["input_ids"] for b in TokenLoader(ref, batch_size=16)]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    ds.close()
    ref.close()


def test_format_1_keeps_the_heads_of_shards_so_later_epochs_fetch_each_shard_once(tmp_path: Path) -> None:
    """Format 1 can read the head of a shard (where the sample of the shard before runs on) only from the
    whole shard. The node cache keeps the first seq_len + 1 tokens of every shard it maps, so from the second
    epoch on the crossing samples read those instead of fetching the next shard whole again; a damaged head
    is not used. The stream is the same as without heads."""
    out = str(tmp_path / "ds")
    inputs, opts = write_input("parquet", tmp_path, make_docs(3000, 8))
    pack(inputs, out, PackOptions(shard_size=4 * SHARD, stored_format=1, **opts))
    shards = len(open_dataset(out).manifest.shards)
    kw: dict[str, Any] = {"seq_len": 64, "seed": 5, "shuffle": "window", "window": 2, "cache_limit": 8 * 4 * SHARD}
    kw["prefetch"] = 0  # every whole fetch is one a batch asked for
    ds = TokenDataset(out, cache_dir=str(tmp_path / "c"), **kw)
    loader = TokenLoader(ds, batch_size=16)
    first = [b["input_ids"] for b in loader]
    in_first = ds.cache.fetches
    second = [b["input_ids"] for b in loader]
    in_second = ds.cache.fetches - in_first
    # the first epoch still fetches next shards whose heads it has not seen; the second each shard at most once
    # (those still cached from the end of the first not at all)
    assert in_second <= shards + 2 < in_first, (in_first, in_second, shards)
    ref = TokenDataset(out, cache_dir=str(tmp_path / "c-ref"), **kw)
    ref.reader.head_tokens = 0  # no heads: every crossing sample maps the next shard
    ref_loader = TokenLoader(ref, batch_size=16)
    want = [b["input_ids"] for b in ref_loader] + [b["input_ids"] for b in ref_loader]
    assert all(torch.equal(a, b) for a, b in zip(first + second, want, strict=True))
    heads = sorted((tmp_path / "c" / "heads").iterdir())
    assert len(heads) == shards
    for head in heads:  # damage every head: none may be used
        data = bytearray(head.read_bytes())
        data[0] ^= 0xFF
        head.write_bytes(bytes(data))
    again = TokenDataset(out, cache_dir=str(tmp_path / "c"), **kw)
    positions = np.arange(again.num_samples)
    assert np.array_equal(again.payload(positions)["windows"], ref.payload(positions)["windows"])
    kept = [info for info in again.manifest.shards if again.cache.has_head(info, 1)]
    assert all(again.cache.read_head(info, 1) is not None for info in kept)  # the damaged ones are gone
    ds.close()
    ref.close()
    again.close()
