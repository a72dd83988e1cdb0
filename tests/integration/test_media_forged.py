"""A media dataset whose digests all agree but whose media column lies (spans past their document, costs
below two tokens, overlapping spans, byte offsets past the bytes): the loader refuses the shard naming it,
by frames and whole, and ferry verify reports it. Also: ferry sync carries media, checked."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")
pytest.importorskip("torch", reason="the loader extra installs torch")

from ferry.client.media import MediaDataset  # noqa: E402
from ferry.shard_tools import PackOptions, open_dataset, pack  # noqa: E402
from ferry.shard_tools.errors import ShardFormatError  # noqa: E402
from ferry.shard_tools.format.manifest import Manifest, ShardTable  # noqa: E402
from ferry.shard_tools.format.media import MEDIA_COLUMN, MediaItem, MediaMeta, media_array  # noqa: E402
from ferry.shard_tools.format.seekable import encode_shard_frames  # noqa: E402
from ferry.shard_tools.format.shard import encode_shard_buffer  # noqa: E402
from ferry.shard_tools.storage.publish import publish_version  # noqa: E402
from ferry.shard_tools.storage.store import resolve  # noqa: E402
from ferry.shard_tools.verification import verify  # noqa: E402
from tests.media_inputs import POLICY, pair_samples, write_tar  # noqa: E402

Items = list[list[MediaItem]]


def _packed(tmp_path: Path, stored_format: int = 3) -> str:
    tar = write_tar(tmp_path / "in.tar", pair_samples(8))
    url = str(tmp_path / "ds")
    options = PackOptions(
        tokenizer="bytes", media_policy=POLICY, stored_format=stored_format, frame_size=4096, origin=False
    )
    pack([str(tar)], url, options)
    return url


def _forge(url: str, mutate: Callable[[Items], Items]) -> str:
    """Rewrite shard 0 with a mutated media column and publish it with every digest made to agree."""
    ds = open_dataset(url)
    m, info = ds.manifest, ds.manifest.shards[0]
    view = ds.read_shard(0)
    meta = MediaMeta.from_column(view.table.column(MEDIA_COLUMN), info.path)
    data = view.table.column(MEDIA_COLUMN).combine_chunks().flatten().field("data").to_pylist()
    docs = [[meta.item(j, data[j]) for j in range(int(meta.doc_offsets[d]), int(meta.doc_offsets[d + 1]))]
            for d in range(view.num_documents)]  # fmt: skip
    column = media_array(mutate(docs))
    raw = encode_shard_buffer(view.tokens, view.offsets, m.token_dtype, {MEDIA_COLUMN: column})
    loc = resolve(url)
    if info.frame_size:
        enc = encode_shard_frames(raw, 1, info.frame_size, 3)
        stored, raw_digest = enc.stored, enc.raw_digest
        extra = {"index_bytes": enc.index_bytes, "index_digest": enc.index_digest}
    else:
        from ferry.shard_tools.format.digest import digest_bytes
        from ferry.shard_tools.format.shard import compress

        stored, raw_digest, extra = compress(raw, 1), digest_bytes(raw), {}
    from ferry.shard_tools.format.digest import digest_bytes

    suffix = info.path.split(".", 1)[1]
    row = dataclasses.replace(info, path=f"shards/{raw_digest.split(':')[1]}.{suffix}", stored_bytes=len(stored),
                              raw_bytes=raw.size, stored_digest=digest_bytes(stored), raw_digest=raw_digest,
                              **extra)  # fmt: skip
    loc.write_bytes(row.path, stored)
    rows = [row, *list(m.shards)[1:]]
    manifest, table = Manifest.build(name=m.name, token_dtype=m.token_dtype, tokenizer=m.tokenizer,
                                     eos_appended=m.eos_appended, shards=ShardTable.from_rows(rows, media=True),
                                     parent=m.version_id, created_at=m.created_at, tool_version=m.tool_version,
                                     lineage=m.child_lineage(), media=m.media)  # fmt: skip
    publish_version(loc, manifest, table, expect_current=m.version_id, new_shards=[row.path])
    return row.path


def _past_document(docs: Items) -> Items:
    d = next(i for i, items in enumerate(docs) if items)
    docs[d][0] = dataclasses.replace(docs[d][0], position=10_000)
    return docs


def _cost_one(docs: Items) -> Items:
    docs[0][0] = dataclasses.replace(docs[0][0], cost=1)
    return docs


def _overlap(docs: Items) -> Items:
    first = docs[0][0]
    docs[0].append(dataclasses.replace(first, position=first.position + 1))
    return docs


MUTATIONS = {"past-document": _past_document, "cost-one": _cost_one, "overlap": _overlap}


@pytest.mark.parametrize("stored_format", [3, 1])
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_forged_media_column_is_refused(tmp_path: Path, name: str, stored_format: int) -> None:
    url = _packed(tmp_path, stored_format)
    path = _forge(url, MUTATIONS[name])
    with pytest.raises(ShardFormatError) as err:
        MediaDataset(url, 256).pieces()
    assert path in str(err.value)
    report = verify(url)
    assert not report.ok and path in report.bad


def test_item_count_lie_is_refused(tmp_path: Path) -> None:
    """A row whose media counts disagree with its shard (everything else consistent)."""
    url = _packed(tmp_path)
    loc = resolve(url)
    m = open_dataset(url).manifest
    rows = [dataclasses.replace(r, media_items=r.media_items + 1) if i == 0 else r for i, r in enumerate(m.shards)]
    manifest, table = Manifest.build(name=m.name, token_dtype=m.token_dtype, tokenizer=m.tokenizer,
                                     eos_appended=m.eos_appended, shards=ShardTable.from_rows(rows, media=True),
                                     parent=m.version_id, created_at=m.created_at, tool_version=m.tool_version,
                                     lineage=m.child_lineage(), media=m.media)  # fmt: skip
    publish_version(loc, manifest, table, expect_current=m.version_id)
    with pytest.raises(ShardFormatError, match="media"):
        MediaDataset(url, 256).pieces()
    assert not verify(url).ok


def test_sync_carries_media(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ferry.service.cli import main

    url = _packed(tmp_path)
    dst = str(tmp_path / "copy")
    assert main(["sync", url, dst, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["published"] and report["failed"] == []
    assert verify(dst).ok
    a, b = MediaDataset(url, 256, epochs=1), MediaDataset(dst, 256, epochs=1)
    for x, y in zip(a, b, strict=True):
        assert [m.data for m in x["media"]] == [m.data for m in y["media"]]
        assert (x["input_ids"] == y["input_ids"]).all()
