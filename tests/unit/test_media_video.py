"""Video items from their container headers: minimal MP4 and WebM files built here box by box, their size,
duration and frame count read without decoding, packed from WebDataset tars with a frame-count cost, and hostile
or truncated containers refused with one line."""

from __future__ import annotations

import io
import random
import struct
import tarfile
from pathlib import Path

import pytest

from ferry.shard_tools import PackOptions, open_dataset, pack
from ferry.shard_tools.format.media import MEDIA_COLUMN, MediaMeta
from ferry.shard_tools.format.policy import parse_policy
from ferry.shard_tools.sources.mediaprobe import BadMediaError, probe

POLICY = "patch:max_side=64,patch=16,max_frames=4"


def box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def mp4(
    width: int = 320,
    height: int = 240,
    frames: int = 12,
    *,
    timescale: int = 1000,
    duration: int = 500,
    frame_bytes: int = 7,
    mdat_bytes: int | None = None,
    version: int = 0,
) -> bytes:
    """An MP4 with an audio track, then a video track of ``frames`` frames of ``frame_bytes`` bytes each."""
    if version == 1:
        mvhd = box(b"mvhd", b"\x01\0\0\0", struct.pack(">QQIQ", 0, 0, timescale, duration), bytes(80))
        tkhd_times = b"\x01\0\0\0" + struct.pack(">QQIIQ", 0, 0, 2, 0, duration)
    else:
        mvhd = box(b"mvhd", bytes(4), struct.pack(">IIII", 0, 0, timescale, duration), bytes(80))
        tkhd_times = bytes(4) + struct.pack(">IIIII", 0, 0, 2, 0, duration)
    tkhd = box(b"tkhd", tkhd_times, bytes(16), bytes(36), struct.pack(">II", width << 16, height << 16))
    stsz = box(b"stsz", bytes(4), struct.pack(">II", 0, frames), struct.pack(f">{frames}I", *[frame_bytes] * frames))

    def trak(handler: bytes, header: bytes, sizes: bytes) -> bytes:
        hdlr = box(b"hdlr", bytes(8), handler, bytes(12), b"\0")
        stbl = box(b"stbl", box(b"stsd", bytes(8)), sizes)
        return box(b"trak", header, box(b"mdia", box(b"mdhd", bytes(24)), hdlr, box(b"minf", stbl)))

    audio = trak(b"soun", box(b"tkhd", bytes(84)), box(b"stsz", bytes(4), struct.pack(">II", 4, 3)))
    moov = box(b"moov", mvhd, audio, trak(b"vide", tkhd, stsz))
    return (
        box(b"ftyp", b"isom", bytes(4), b"isomiso2")
        + moov
        + box(b"mdat", bytes(frames * frame_bytes + 12 if mdat_bytes is None else mdat_bytes))
    )


def element(ident: int, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return ident.to_bytes((ident.bit_length() + 7) // 8, "big") + b"\x01" + len(payload).to_bytes(7, "big") + payload


def webm(width: int = 160, height: int = 90, frames: int = 5, *, doctype: bytes = b"webm") -> bytes:
    """A WebM with an audio track (2) and a video track (1): ``frames`` video blocks over two clusters, audio
    blocks between them."""
    header = element(0x1A45DFA3, element(0x4282, doctype))
    scale, duration = element(0x2AD7B1, (1_000_000).to_bytes(3, "big")), element(0x4489, struct.pack(">d", 2000.0))
    info = element(0x1549A966, scale, duration)
    size = element(0xE0, element(0xB0, width.to_bytes(2, "big")), element(0xBA, height.to_bytes(2, "big")))
    video = element(0xAE, element(0xD7, b"\x01"), element(0x83, b"\x01"), size)
    audio = element(0xAE, element(0xD7, b"\x02"), element(0x83, b"\x02"))
    tracks = element(0x1654AE6B, audio, video)

    def block(track: int) -> bytes:
        return element(0xA3, bytes([0x80 | track]), b"\0\0\x80", b"frame")

    first = element(0x1F43B675, element(0xE7, b"\0"), *[block(1) for _ in range(frames - 1)], block(2))
    group = element(0xA0, element(0xA1, bytes([0x81]), b"\0\0\0", b"frame"))  # a BlockGroup's Block
    second = element(0x1F43B675, element(0xE7, b"\x10"), block(2), group)
    return header + element(0x18538067, info, tracks, first, second)


def test_mp4_header_read_without_decoding() -> None:
    item = probe(mp4(), "m")
    assert (item.kind, item.format, item.width, item.height, item.duration, item.frames) == (
        "video", "mp4", 320, 240, 0.5, 12)  # fmt: skip
    v1 = probe(mp4(640, 360, 30, timescale=90000, duration=90000, version=1), "m")
    assert (v1.width, v1.height, v1.duration, v1.frames) == (640, 360, 1.0, 30)


def test_webm_header_and_blocks_read_without_decoding() -> None:
    item = probe(webm(), "w")
    assert (item.kind, item.format, item.width, item.height, item.duration, item.frames) == (
        "video", "webm", 160, 90, 2.0, 5)  # fmt: skip


def test_video_frame_count_cost() -> None:
    policy = parse_policy(POLICY)
    patches = policy.image_patches(320, 240)
    assert policy.cost("video", 320, 240, 0.5, 12) == 4 * patches + 2  # capped at max_frames
    assert policy.cost("video", 320, 240, 0.5, 3) == 3 * patches + 2


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_videos_packed_from_webdataset(tmp_path: Path) -> None:
    tar = _tar(tmp_path / "v.tar", {"a.mp4": mp4(), "a.txt": b"a clip", "b.webm": webm(frames=2), "b.txt": b"b"})
    pack([str(tar)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY))
    ds = open_dataset(str(tmp_path / "ds"))
    meta = MediaMeta.from_column(ds.read_shard(0).table.column(MEDIA_COLUMN), "t")
    policy = ds.manifest.media
    assert policy is not None
    assert meta.kind == ["video", "video"] and meta.format == ["mp4", "webm"] and meta.frames.tolist() == [12, 2]
    assert meta.cost.tolist() == [policy.cost("video", 320, 240, 0.5, 12), policy.cost("video", 160, 90, 2.0, 2)]


HOSTILE = {
    "no-moov": box(b"ftyp", b"isom", bytes(8)) + box(b"mdat", bytes(20)),
    "box-past-end": mp4()[:-40] + struct.pack(">I4s", 1 << 30, b"free"),
    "huge-64bit-box": box(b"ftyp", b"isom", bytes(8)) + struct.pack(">I4sQ", 1, b"moov", 1 << 62),
    "tiny-box-size": box(b"ftyp", b"isom", bytes(8)) + struct.pack(">I4s", 3, b"moov"),
    "zero-timescale": mp4(timescale=0),
    "zero-duration": mp4(duration=0),
    "giant-size": mp4(width=(1 << 15) + 1, height=10),
    "no-frames": mp4(frames=0),
    "frames-past-mdat": mp4(frame_bytes=1000, mdat_bytes=100),
    "no-video-track": mp4().replace(b"vide", b"text"),
    "matroska-not-webm": webm(doctype=b"matroska"),
    "webm-no-video": webm().replace(b"\x83\x01\0\0\0\0\0\0\x01\x01", b"\x83\x01\0\0\0\0\0\0\x01\x03"),
    "webm-truncated": webm()[:-3],
    "webm-size-past-end": webm() + b"\x1f\x43\xb6\x75\x01\x00\x00\x01\x00\x00\x00\x00",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_container_refused_in_one_line(name: str) -> None:
    with pytest.raises(BadMediaError) as err:
        probe(HOSTILE[name], f"in.tar: sample {name}")
    assert f"sample {name}" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("make", [mp4, webm])
def test_every_truncation_and_random_damage_is_refused_or_read(make: object) -> None:
    """Every prefix of a valid file, and bytes flipped at random, give a one-line BadMediaError or a valid
    header: never another exception, never a value beyond the limits."""
    assert callable(make)
    data = make()
    rng = random.Random(7)
    cases = [data[:n] for n in range(len(data) - 1)]
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cases.append(bytes(damaged))
    refused = 0
    for case in cases:
        try:
            item = probe(case, "x")
        except BadMediaError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        assert item.kind in ("video", "image") and item.frames >= 0
    assert refused >= len(data) - 1  # no prefix passes for the whole file
