"""Hostile media inputs: each bad item fails the pack with one line naming the file and the sample, or with
--skip-bad-media is left out and counted; a bad item never crashes a pack nor publishes a version."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")

from ferry.shard_tools import InputFormatError, PackOptions, pack  # noqa: E402
from ferry.shard_tools.format.media import MEDIA_COLUMN, MediaMeta  # noqa: E402
from ferry.shard_tools.sources.mediaprobe import BadMediaError  # noqa: E402
from tests.media_inputs import POLICY, image, wav, write_tar  # noqa: E402

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header (with a valid CRC) claims ``width × height`` pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def lying_wav() -> bytes:
    """A WAV header claiming a second of samples over a tenth of one."""
    data = bytearray(wav(0.1))
    data[40:44] = struct.pack("<I", 16000)  # the data chunk's size
    return bytes(data)


def jpeg_bad_body() -> bytes:
    """A JPEG whose headers are intact and whose entropy-coded data after the scan header is scrambled."""
    good = image(64, 64, "JPEG", 3)
    body = good.index(b"\xff\xda") + 20
    return good[:body] + bytes(b ^ 0x5A for b in good[body:-2]) + good[-2:]


HOSTILE = {
    "truncated-jpeg": ("jpg", image(80, 60, "JPEG", 1)[:300]),
    "truncated-png": ("png", image(80, 60, "PNG", 2)[:200]),
    "corrupt-jpeg-body": ("jpg", jpeg_bad_body()),
    "not-an-image": ("png", b"this is not an image at all"),
    "empty": ("webp", b""),
    "bomb": ("png", png_claiming(60000, 60000)),
    "absurd-width": ("png", png_claiming(1 << 30, 1)),
    "zero-size": ("png", png_claiming(0, 10)),
    "lying-png-size": ("png", png_claiming(4000, 3000)),  # within the limits, its data far too short
    "lying-wav": ("wav", lying_wav()),
    "bmp": ("png", b"BM" + b"\x00" * 60),
}


def _tar(tmp_path: Path, name: str, ext: str, data: bytes) -> Path:
    good = {"__key__": "good0", "png": image(20, 20, "PNG", 7), "txt": "fine"}
    bad = {"__key__": f"bad-{name}", ext: data, "txt": "caption kept"}
    return write_tar(tmp_path / f"{name}.tar", [good, bad, {**good, "__key__": "good1"}])


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_bad_item_fails_naming_file_and_sample(tmp_path: Path, name: str) -> None:
    ext, data = HOSTILE[name]
    tar = _tar(tmp_path, name, ext, data)
    with pytest.raises(BadMediaError) as err:
        pack([str(tar)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY))
    message = str(err.value)
    assert str(tar) in message and f"bad-{name}" in message and "\n" not in message
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_bad_item_skipped_and_counted(tmp_path: Path, name: str) -> None:
    ext, data = HOSTILE[name]
    tar = _tar(tmp_path, name, ext, data)
    result = pack(
        [str(tar)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY, skip_bad_media=True)
    )
    assert (result.documents, result.media_items, result.skipped_media) == (3, 2, 1)
    from ferry.shard_tools import open_dataset

    view = open_dataset(str(tmp_path / "ds")).read_shard(0)
    meta = MediaMeta.from_column(view.table.column(MEDIA_COLUMN), "t")
    assert meta.doc_offsets.tolist() == [0, 1, 1, 2]
    assert bytes(view.document(1)[:-1].astype("u1")).decode() == "caption kept"  # the text stays


def test_cli_one_line_error_and_skip_count(tmp_path: Path) -> None:
    tar = _tar(tmp_path, "bomb", "png", png_claiming(60000, 60000))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [*FERRY, "pack", str(tar), "--tokenizer", "bytes", "--media-policy", POLICY]
    run = subprocess.run([*base, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "bad-bomb" in run.stderr, run.stderr
    run = subprocess.run(
        [*base, "--out", str(tmp_path / "b"), "--skip-bad-media"], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "1 bad items left out" in run.stdout


def test_truncated_tar_and_bad_interleaving(tmp_path: Path) -> None:
    tar = _tar(tmp_path, "fine", "png", image(20, 20, "PNG", 1))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(tar.read_bytes()[:700])
    with pytest.raises(InputFormatError, match="cut.tar"):
        pack([str(cut)], str(tmp_path / "ds"), PackOptions(tokenizer="bytes", media_policy=POLICY, skip_bad_media=True))
    sample = {"__key__": "x", "json": b'{"texts": ["a", null], "images": [null, "9.png"]}', "0.png": image(9, 9)}
    bad = write_tar(tmp_path / "inter.tar", [sample])
    with pytest.raises(InputFormatError, match="sample x.*9.png"):
        pack([str(bad)], str(tmp_path / "ds2"), PackOptions(tokenizer="bytes", media_policy=POLICY))
    with pytest.raises(Exception, match="--media-policy"):
        pack([str(tar)], str(tmp_path / "ds3"), PackOptions(tokenizer="bytes"))


def test_skip_count_survives_part_and_merge(tmp_path: Path) -> None:
    """Bad items left out by the parts of a ``--part I/N`` run are counted by ``--merge`` as by a local pack."""
    from ferry.shard_tools import merge_parts, pack_part

    tars = [str(_tar(tmp_path, f"bomb{i}", "png", png_claiming(60000, 60000))) for i in range(3)]
    out = str(tmp_path / "ds")
    opts = PackOptions(tokenizer="bytes", media_policy=POLICY, skip_bad_media=True)
    parts = [pack_part(tars, out, i, 2, opts) for i in range(2)]
    assert [p.skipped_media for p in parts] == [2, 1]
    merged = merge_parts(out, opts)
    local = pack(tars, str(tmp_path / "local"), opts)
    assert (merged.documents, merged.media_items, merged.skipped_media) == (9, 6, 3)
    assert (merged.shards, merged.skipped_media) == (local.shards, local.skipped_media)


@pytest.mark.parametrize("forged", [-1, "3", 1.5, True])
def test_forged_skip_count_in_a_part_record_is_refused(tmp_path: Path, forged: object) -> None:
    import json

    from ferry.shard_tools import ManifestError, merge_parts, pack_part

    tar = str(_tar(tmp_path, "bomb", "png", png_claiming(60000, 60000)))
    opts = PackOptions(tokenizer="bytes", media_policy=POLICY, skip_bad_media=True)
    record = Path(tmp_path / "ds") / pack_part([tar], str(tmp_path / "ds"), 0, 1, opts).record
    doc = json.loads(record.read_text())
    doc["results"][0]["skipped_media"] = forged
    record.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="skipped_media"):
        merge_parts(str(tmp_path / "ds"), opts)
    assert not (tmp_path / "ds" / "manifest.json").exists()
