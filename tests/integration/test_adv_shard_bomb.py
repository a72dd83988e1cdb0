"""Hostile shards: a reader believes no size it has not bounded (DESIGN §1, issue 13).

Every shard here is crafted by hand (zstd frames byte by byte, Arrow files patched) and published
with a consistent manifest row, so only the shard's own content can give it away.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import zstandard
from conftest import arrow_file, run_verify

from ferry.shard_tools import ManifestError, ShardFormatError, open_dataset, verify
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.manifest import Manifest, ShardInfo, ShardTable, Tokenizer
from ferry.shard_tools.format.shard import compress, decompress, encode_shard, parse_shard
from ferry.shard_tools.storage.publish import publish_version
from ferry.shard_tools.storage.store import resolve

TIB = 1 << 40
_BLOCK_MAX = 128 << 10


def block(kind: int, size: int, payload: bytes, last: bool) -> bytes:
    """One zstd block: a 3-byte header (last flag, type 0 raw / 1 RLE, size) and its payload."""
    return (int(last) | kind << 1 | size << 3).to_bytes(3, "little") + payload


def frame(content_size: int | None, blocks: list[bytes], *, window_log: int | None = None) -> bytes:
    """A zstd frame header (8-byte content size, or none) followed by ``blocks``.

    Without ``window_log`` the frame is single-segment (its window is its content size)."""
    fcs_flag = 0 if content_size is None else 3
    descriptor = fcs_flag << 6 | (0x20 if window_log is None else 0)
    header = zstandard.FRAME_HEADER + bytes([descriptor])
    if window_log is not None:
        header += bytes([(window_log - 10) << 3])
    if content_size is not None:
        header += struct.pack("<Q", content_size)
    return header + b"".join(blocks)


def tib_bomb() -> bytes:
    """17 bytes whose header claims 1 TiB: one RLE block of 128 KiB."""
    stored = frame(TIB, [block(1, _BLOCK_MAX, b"\0", last=True)])
    assert len(stored) == 17 and zstandard.get_frame_parameters(stored).content_size == TIB
    return stored


def lying_4gib() -> bytes:
    """A frame claiming 4 GiB with enough stored bytes for zstd to make it (so the ratio bound
    passes) that yields nothing: 43,691 empty raw blocks."""
    claim = 4 << 30
    n = claim // 32768 // 3 + 1
    stored = frame(claim, [block(0, 0, b"", last=False)] * n + [block(0, 0, b"", last=True)], window_log=17)
    assert len(stored) * 32768 >= claim
    return stored


def publish_stored(out: str, stored: bytes, raw_bytes: int, *, documents: int = 1, tokens: int = 64) -> str:
    """Publish a one-shard dataset whose stored bytes are ``stored``, with an honest stored digest
    and the given (possibly hostile) raw size; the raw digest is never reached by a bomb."""
    rel = f"shards/{digest_bytes(stored).split(':', 1)[1]}.arrow.zst"
    loc = resolve(out)
    loc.write_bytes(rel, stored)
    row = ShardInfo(rel, documents, tokens, len(stored), raw_bytes, digest_bytes(stored), digest_bytes(b"raw"))
    m, table = Manifest.build(
        name="hostile", token_dtype="uint16", tokenizer=Tokenizer("none", 500, None), eos_appended=False,
        shards=ShardTable.from_rows([row]), parent=None, created_at="now", tool_version="test",
    )  # fmt: skip
    publish_version(loc, m, table, expect_current=None, new_shards=[rel])
    return rel


def publish_raw(out: str, raw: bytes, suffix: bytes = b"", *, tokens: int) -> str:
    """Publish a shard that is ``compress(raw)`` followed by ``suffix``, every digest honest."""
    stored = compress(raw, 3) + suffix
    rel = f"shards/{digest_bytes(stored).split(':', 1)[1]}.arrow.zst"
    loc = resolve(out)
    loc.write_bytes(rel, stored)
    row = ShardInfo(rel, 1, tokens, len(stored), len(raw), digest_bytes(stored), digest_bytes(raw))
    m, table = Manifest.build(
        name="hostile", token_dtype="uint16", tokenizer=Tokenizer("none", 500, None), eos_appended=False,
        shards=ShardTable.from_rows([row]), parent=None, created_at="now", tool_version="test",
    )  # fmt: skip
    publish_version(loc, m, table, expect_current=None, new_shards=[rel])
    return rel


# Runs in a child: the address space is capped 1 GiB above what the imports took, so a blind
# allocation of the claimed size fails at once instead of eating a shared machine's memory.
_MEASURE = textwrap.dedent(
    """
    import json, resource, sys, time
    from ferry.shard_tools import open_dataset
    ds = open_dataset(sys.argv[1])
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    rss0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    try:
        ds.read_shard(0)
        out = {"error": None}
    except BaseException as exc:
        out = {"error": type(exc).__name__, "shard": getattr(exc, "shard", None), "message": str(exc)}
    out["seconds"] = time.perf_counter() - t0
    out["rss_growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize(
    "make_stored, claim", [(tib_bomb, TIB), (lying_4gib, 4 << 30)], ids=["tib-17-bytes", "4gib-lie"]
)
def test_a_bomb_is_refused_quickly_in_small_memory(
    tmp_path: Path, make_stored: Callable[[], bytes], claim: int
) -> None:
    out = str(tmp_path / "ds")
    rel = publish_stored(out, make_stored(), claim)
    proc = subprocess.run([sys.executable, "-c", _MEASURE, out], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["error"] == "ShardFormatError", result
    assert result["shard"] == rel
    assert result["seconds"] < 10
    assert result["rss_growth_kib"] < 64 << 10  # KiB: far below the claim, whatever it is


def test_tib_bomb_in_ferry_verify_is_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    rel = publish_stored(out, tib_bomb(), TIB)
    proc = subprocess.run(
        [sys.executable, "-m", "ferry.shard_tools.cli", "verify", out], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    bad = [line for line in proc.stderr.splitlines() if line.startswith("BAD ")]
    assert len(bad) == 1 and bad[0].startswith(f"BAD {rel}: ") and "zstd" in bad[0]
    report = verify(out)
    assert list(report.bad) == [rel] and "decompression bomb" in report.bad[rel]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_tib_bomb_in_the_loader_names_the_shard(tmp_path: Path, num_workers: int) -> None:
    from ferry.client import TokenDataset, TokenLoader

    out = str(tmp_path / "ds")
    rel = publish_stored(out, tib_bomb(), TIB)
    ds = TokenDataset(out, seq_len=4, cache_dir=str(tmp_path / "cache"), prefetch=0)
    # the same error type with and without DataLoader workers: the shard itself lies
    with pytest.raises(ShardFormatError) as exc:
        next(iter(TokenLoader(ds, batch_size=1, num_workers=num_workers)))
    assert rel in str(exc.value) and "decompression bomb" in str(exc.value)
    assert exc.value.shard == rel
    assert not list((tmp_path / "cache").glob("*.arrow"))  # nothing was cached


def _small_raw(n: int) -> bytes:
    """An honest shard of ``n`` varied tokens: compresses a few to one (the one-allocation path)."""
    return arrow_file(pa.array([[i % 500 for i in range(n)]], type=pa.list_(pa.uint16())))


def _zeros_raw(n: int) -> bytes:
    """An honest shard of ``n`` zero tokens: compresses far beyond 64:1 (the step-by-step path)."""
    return encode_shard(np.zeros(n, dtype=np.uint16), np.array([0, n]), "uint16")


@pytest.mark.parametrize(
    "suffix",
    [
        pytest.param(lambda raw: compress(raw, 3), id="second-frame"),
        pytest.param(lambda raw: b"\0", id="one-byte"),
        pytest.param(lambda raw: b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"junk", id="skippable-frame"),
    ],
)
@pytest.mark.parametrize("n", [1000, 5_000_000], ids=["fast-path", "stepwise-path"])
def test_bytes_after_the_frame_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: Callable[[bytes], bytes], n: int
) -> None:
    raw = _zeros_raw(n) if n > 1000 else _small_raw(n)
    out = str(tmp_path / "ds")
    rel = publish_raw(out, raw, suffix(raw), tokens=n)
    with pytest.raises(ShardFormatError, match="after the end of its zstd frame") as exc:
        open_dataset(out).read_shard(0)
    assert exc.value.shard == rel
    code, err, report = run_verify(out, capsys)
    assert code == 1 and f"BAD {rel}" in err and list(report["bad"]) == [rel]


@pytest.mark.parametrize("n", [1000, 5_000_000], ids=["fast-path", "stepwise-path"])
def test_one_honest_frame_still_decodes(tmp_path: Path, n: int) -> None:
    raw = _zeros_raw(n) if n > 1000 else _small_raw(n)
    out = str(tmp_path / "ds")
    publish_raw(out, raw, tokens=n)
    assert open_dataset(out).read_shard(0).num_tokens == n
    assert verify(out).ok


@pytest.mark.parametrize(
    "stored, raw_bytes, needle",
    [
        (zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100), 100, "no content size"),
        (frame(100, [block(0, 200, b"y" * 200, last=True)]), 100, "shard s:"),  # yields more than declared
        (frame(16 << 20, [block(1, _BLOCK_MAX, b"z", last=False)] * 129 + [block(0, 0, b"", True)], window_log=17),
         16 << 20, "shard s:"),  # the same on the stepwise path
        (frame(_BLOCK_MAX, [block(1, _BLOCK_MAX, b"z", last=False)]), _BLOCK_MAX, "truncated"),  # ends early
        (frame(16 << 20, [block(1, _BLOCK_MAX, b"z", last=False)] * 128, window_log=17), 16 << 20, "truncated"),
        (b"\x50\x2a\x4d\x18" + struct.pack("<I", 0) + compress(b"x" * 100, 1), 100, "does not start with a zstd frame"),
        (tib_bomb(), TIB, "decompression bomb"),
        (tib_bomb(), -1, "decompression bomb"),
    ],
    ids=["no-content-size", "more-than-declared", "more-than-declared-stepwise", "ends-early", "ends-early-stepwise",
         "skippable-first",
         "tib", "negative"],
)  # fmt: skip
def test_decompress_refuses_frames_that_lie(stored: bytes, raw_bytes: int, needle: str) -> None:
    with pytest.raises(ShardFormatError, match=needle) as exc:
        decompress(stored, raw_bytes, "s")
    assert exc.value.shard == "s"


def _ipc_compressed(n: int) -> bytes:
    """An Arrow file of ``n`` zero tokens whose body uses IPC zstd compression (a second expansion)."""
    schema = pa.schema([("tokens", pa.list_(pa.uint16()))], metadata={b"ferry.format": b"1"})
    col = pa.ListArray.from_arrays(pa.array(np.array([0, n], dtype=np.int32)), pa.array(np.zeros(n, np.uint16)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(pa.record_batch([col], schema=schema))
    return sink.getvalue().to_pybytes()


def _with_dictionary_column(compression: str | None) -> bytes:
    """A shard with a dictionary-encoded ``source`` column (its own dictionary batch in the file)."""
    tokens = pa.array([[1, 2], [3]], type=pa.list_(pa.uint16()))
    source = pa.array(["a", "b"]).dictionary_encode()
    schema = pa.schema([("tokens", tokens.type), ("source", source.type)], metadata={b"ferry.format": b"1"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_batch(pa.record_batch([tokens, source], schema=schema))
    return sink.getvalue().to_pybytes()


def test_dictionary_batches_are_checked_too() -> None:
    assert parse_shard(_with_dictionary_column(None), shard="s").table.column("source").to_pylist() == ["a", "b"]
    with pytest.raises(ShardFormatError, match="IPC body compression"):
        parse_shard(_with_dictionary_column("lz4"), shard="s")


def _offsets_past_values() -> bytes:
    """A list column whose last offset (1000) runs past its 3 values."""
    raw = arrow_file(pa.array([[1, 2, 3]], type=pa.list_(pa.uint16())))
    at = raw.index(struct.pack("<ii", 0, 3))
    return raw[:at] + struct.pack("<ii", 0, 1000) + raw[at + 8 :]


def _footer_length_lie() -> bytes:
    raw = arrow_file(pa.array([[1, 2, 3]], type=pa.list_(pa.uint16())))
    (length,) = struct.unpack("<i", raw[-10:-6])
    return raw[:-10] + struct.pack("<i", length + 64) + raw[-6:]  # still inside the file


@pytest.mark.parametrize(
    "raw, needle",
    [
        (_ipc_compressed(1_000_000), "IPC body compression"),
        (_offsets_past_values(), "not a readable Arrow IPC file"),
        (_footer_length_lie(), "not a readable Arrow IPC file"),
    ],
    ids=["ipc-compressed", "offsets-past-values", "footer-length"],
)
def test_arrow_lengths_are_checked_before_use(raw: bytes, needle: str) -> None:
    with pytest.raises(ShardFormatError, match=needle) as exc:
        parse_shard(raw, shard="shards/x.arrow.zst")
    assert exc.value.shard == "shards/x.arrow.zst"


def test_an_ipc_compressed_shard_fails_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ds")
    rel = publish_raw(out, _ipc_compressed(5_000_000), tokens=5_000_000)  # 3 KiB raw that would be 10 MB
    code, err, report = run_verify(out, capsys)
    assert code == 1 and f"BAD {rel}" in err and "IPC body compression" in report["bad"][rel]


_FUZZ = textwrap.dedent(
    """
    import random, sys
    import numpy as np
    from ferry.shard_tools import ShardFormatError
    from ferry.shard_tools.format.shard import encode_shard, parse_shard
    raw = encode_shard(np.arange(1000, dtype=np.uint16), np.array([0, 400, 1000]), "uint16")
    rng = random.Random(1)
    for _ in range(3000):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            view = parse_shard(bytes(b), shard="s")
        except ShardFormatError:
            continue
        assert view.offsets[0] == 0 and view.offsets[-1] == view.num_tokens and (np.diff(view.offsets) >= 0).all()
        view.table.to_pylist()  # every value readable: no offset points outside its buffer
    print("ok")
    """
)


def test_mutated_arrow_files_never_crash_the_reader() -> None:
    """Random byte changes in a raw shard end in ShardFormatError or a consistent view, never in a
    segfault or a pyarrow exception (in a child, so a crash fails the test instead of the run)."""
    proc = subprocess.run([sys.executable, "-c", _FUZZ], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_negative_raw_bytes_in_the_manifest_names_the_shard() -> None:
    row = ShardInfo("shards/neg.arrow.zst", 1, 1, 17, -5, digest_bytes(b"a"), digest_bytes(b"b"))
    with pytest.raises(ManifestError, match=r"raw_bytes.*shards/neg\.arrow\.zst: -5"):
        ShardTable.from_rows([row])
