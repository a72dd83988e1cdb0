"""Packing media: WebDataset tars and Hugging Face Image datasets made by the real libraries come back
exact (bytes, sizes, captions, placeholder spans); the manifest records the policy and media totals; verify
checks media; a text dataset is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
datasets = pytest.importorskip("datasets", reason="the test extra installs `datasets`")
pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")
datasets.disable_progress_bars()

from ferry.shard_tools import PackOptions, UsageError, open_dataset, pack  # noqa: E402
from ferry.shard_tools.format.media import MEDIA_COLUMN, MediaMeta  # noqa: E402
from ferry.shard_tools.format.policy import parse_policy  # noqa: E402
from ferry.shard_tools.packer.packing import pack_documents  # noqa: E402
from ferry.shard_tools.verification import verify  # noqa: E402
from tests.media_inputs import POLICY, image, pair_samples, wav, write_tar  # noqa: E402

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]


def opts(**kw: object) -> PackOptions:
    return PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=16 << 10, frame_size=4096, **kw)  # type: ignore[arg-type]


def documents(url: str) -> list[tuple[np.ndarray, list[tuple[int, int, str, int, int, bytes]]]]:
    """Every document's tokens and items (position, cost, format, width, height, bytes), read whole."""
    ds = open_dataset(url)
    out = []
    for i in range(len(ds)):
        view = ds.read_shard(i)
        meta = MediaMeta.from_column(view.table.column(MEDIA_COLUMN), "t")
        data = view.table.column(MEDIA_COLUMN).combine_chunks().flatten().field("data").to_pylist()
        for d in range(view.num_documents):
            js = range(int(meta.doc_offsets[d]), int(meta.doc_offsets[d + 1]))
            items = [(int(meta.position[j]), int(meta.cost[j]), meta.format[j], int(meta.width[j]),
                      int(meta.height[j]), data[j]) for j in js]  # fmt: skip
            out.append((view.document(d), items))
    return out


def expected_tokens(items: list[bytes | str], costs: list[int]) -> list[int]:
    policy = parse_policy(POLICY).with_ids(257)
    tokens: list[int] = []
    it = iter(costs)
    for seg in items:
        tokens += list(seg.encode()) if isinstance(seg, str) else policy.placeholder(next(it)).tolist()
    return tokens + [256]


def test_webdataset_pairs_round_trip(tmp_path: Path) -> None:
    samples = pair_samples(40)
    tar = write_tar(tmp_path / "pairs-000.tar", samples)
    result = pack([str(tar)], str(tmp_path / "ds"), opts())
    assert result.media_items == 40 and result.shards > 1
    assert result.media_bytes == sum(len(v) for s in samples for k, v in s.items() if k in ("png", "jpg", "webp"))
    docs = documents(str(tmp_path / "ds"))
    assert len(docs) == 40
    policy = parse_policy(POLICY)
    for sample, (tokens, items) in zip(samples, docs, strict=True):
        ext = next(k for k in sample if k in ("png", "jpg", "webp"))
        ((position, cost, fmt, width, height, data),) = items
        assert data == sample[ext] and position == 0
        assert fmt == {"png": "png", "jpg": "jpeg", "webp": "webp"}[ext]
        import io

        from PIL import Image

        assert (width, height) == Image.open(io.BytesIO(data)).size
        assert cost == policy.cost("image", width, height, 0, 0)
        assert tokens.tolist() == expected_tokens([sample[ext], sample["txt"]], [cost])
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["media"]["policy"]["max_side"] == 64
    assert manifest["totals"]["media_items"] == 40
    assert verify(str(tmp_path / "ds")).ok


def test_webdataset_interleaved_round_trip(tmp_path: Path) -> None:
    a, b = image(30, 20, "PNG", 1), image(100, 40, "JPEG", 2)
    sample = {
        "__key__": "doc0",
        "json": json.dumps(
            {"texts": ["intro ", None, " middle ", None, " end"], "images": [None, "0.png", None, "1.jpg", None]}
        ).encode(),
        "0.png": a,
        "1.jpg": b,
    }
    audio = {"__key__": "doc1", "wav": wav(0.5), "txt": "a sound"}
    tar = write_tar(tmp_path / "mix.tar", [sample, audio])
    pack([str(tar)], str(tmp_path / "ds"), opts())
    (tokens, items), (tokens1, items1) = documents(str(tmp_path / "ds"))
    assert [i[5] for i in items] == [a, b]
    assert tokens.tolist() == expected_tokens(["intro ", a, " middle ", b, " end"], [i[1] for i in items])
    assert items[1][0] == len("intro ") + items[0][1] + len(" middle ")
    assert items1[0][2] == "wav" and items1[0][1] == 13 + 2  # ceil(0.5 s * 25) + begin, end


def _hf_images(n: int) -> tuple[list[bytes], list[str]]:
    images = [image(10 + 7 * i, 12 + 5 * i, "PNG" if i % 2 else "JPEG", i) for i in range(n)]
    return images, [f"picture {i}" for i in range(n)]


def test_hf_image_dataset_round_trip(tmp_path: Path) -> None:
    images, texts = _hf_images(12)
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    hf = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "text": texts}, features)
    hf.save_to_disk(str(tmp_path / "saved"))
    hf.to_parquet(str(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet"))
    stored = [r["bytes"] for r in hf.cast_column("image", datasets.Image(decode=False))["image"]]
    for name in ("saved", "hub"):
        pack([str(tmp_path / name)], str(tmp_path / f"ds-{name}"), opts())
        docs = documents(str(tmp_path / f"ds-{name}"))
        assert [items[0][5] for _, items in docs] == stored
        assert [bytes(t[t < 256].astype(np.uint8)).decode() for t, _ in docs] == texts


def test_parquet_bytes_column_and_several_images_per_row(tmp_path: Path) -> None:
    images, texts = _hf_images(6)
    table = pa.table({"pics": [[images[i], images[i + 1]] for i in range(0, 6, 2)], "text": texts[:3]})
    pq.write_table(table, tmp_path / "in.parquet")
    pack([str(tmp_path / "in.parquet")], str(tmp_path / "ds"), opts(media_column="pics"))
    docs = documents(str(tmp_path / "ds"))
    assert [[i[5] for i in items] for _, items in docs] == [images[0:2], images[2:4], images[4:6]]
    with pytest.raises(Exception, match="no media column 'image'"):
        pack([str(tmp_path / "in.parquet")], str(tmp_path / "ds2"), opts())


def test_text_datasets_are_unchanged(tmp_path: Path) -> None:
    """A pack without media has no media column, no media keys in its manifest, and the table columns it had."""
    pack_documents([[1, 2, 3], [4, 5]], str(tmp_path / "text"), PackOptions(vocab_size=100, eos_id=0))
    manifest = json.loads((tmp_path / "text" / "manifest.json").read_text())
    assert "media" not in manifest and "media_items" not in manifest["totals"]
    ds = open_dataset(str(tmp_path / "text"))
    assert not ds.manifest.shards.has_media and ds.read_shard(0).table.schema.names == ["tokens"]
    assert verify(str(tmp_path / "text")).ok


def test_append_needs_the_same_policy_and_cli_reports_media(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "a.tar", pair_samples(5))
    out = str(tmp_path / "ds")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [*FERRY, "pack", str(tar), "--out", out, "--tokenizer", "bytes", "--media-policy", POLICY],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "media     5 items" in run.stdout
    tar2 = write_tar(tmp_path / "b.tar", pair_samples(3, seed=9))
    with pytest.raises(UsageError, match="media policy"):
        pack([str(tar2)], out, PackOptions(tokenizer="bytes", media_policy="patch:max_side=32,patch=16", append=True))
    shown = subprocess.run([*FERRY, "inspect", out, "--media"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "media     5 items" in shown.stdout and "image" in shown.stdout and "p50" in shown.stdout
    doc = json.loads(subprocess.run([*FERRY, "inspect", out, "--media", "--json"], capture_output=True, text=True,
                                    env=env, timeout=120).stdout)  # fmt: skip
    assert doc["media_costs"]["image"]["items"] == 5


def test_verify_finds_a_changed_media_byte(tmp_path: Path) -> None:
    """Media bytes are inside the shards: a flipped stored byte in the frames holding them fails verify."""
    tar = write_tar(tmp_path / "a.tar", pair_samples(6))
    pack([str(tar)], str(tmp_path / "ds"), opts())
    ds = open_dataset(str(tmp_path / "ds"))
    info = ds.manifest.shards[0]
    path = tmp_path / "ds" / info.path
    data = bytearray(path.read_bytes())
    data[info.stored_bytes // 2] ^= 0xFF  # the middle of the frames: media bytes are most of the shard
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    report = verify(str(tmp_path / "ds"))
    assert not report.ok


def test_batches_of_media_are_bounded_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader hands documents on once their media reach the byte bound, however many documents a batch
    may hold, so large media do not pile up in memory."""
    from ferry.shard_tools.sources import SourceOptions, Unit, mediaprobe
    from ferry.shard_tools.sources.tokenizer import ByteTokenizer
    from ferry.shard_tools.sources.wds import read_wds

    samples = pair_samples(30)
    tar = write_tar(tmp_path / "a.tar", samples)
    options = SourceOptions(tokenizer=ByteTokenizer(), media=parse_policy(POLICY).with_ids(257))
    bound = 20_000
    monkeypatch.setattr(mediaprobe, "BATCH_MEDIA_BYTES", bound)
    batches = list(read_wds(Unit(str(tar), "wds"), options))
    sizes = [sum(len(b) for b in batch.media.flatten().field("data").to_pylist()) for batch in batches]
    largest = max(len(v) for s in samples for k, v in s.items() if k in ("png", "jpg", "webp"))
    assert len(batches) > 1 and max(sizes) < bound + largest
    assert sum(len(b.offsets) - 1 for b in batches) == 30


def test_workers_and_parts_give_the_same_version(tmp_path: Path) -> None:
    """Media packs are byte-identical for any --workers and as --part I/N runs merged."""
    from ferry.shard_tools import merge_parts, pack_part

    tars = [str(write_tar(tmp_path / f"w{i}.tar", pair_samples(12, seed=10 * i))) for i in range(3)]
    one = pack(tars, str(tmp_path / "one"), opts(name="x"))
    two = pack(tars, str(tmp_path / "two"), opts(name="x", workers=2))
    for part in range(2):
        pack_part(tars, str(tmp_path / "parts"), part, 2, opts(name="x"))
    merged = merge_parts(str(tmp_path / "parts"), opts(name="x"))
    assert one.version_id == two.version_id == merged.version_id
    assert merged.media_items == 36
