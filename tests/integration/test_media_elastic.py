"""Media loaders across ranks: a run resumed with another world size, batch size and workers reads the global
stream of the uninterrupted run; a mixture of a text and an image–text source keeps its exact proportions and
resumes the same way; ``trace`` names each sequence's documents and media items."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")
pytest.importorskip("torch", reason="the loader extra installs torch")

from ferry.client.media import MediaDataset, MediaLoader, MediaMixture  # noqa: E402
from ferry.client.media.source import MediaSource  # noqa: E402
from ferry.shard_tools import PackOptions, pack  # noqa: E402
from ferry.shard_tools.errors import InvalidValueError, StateError, UsageError  # noqa: E402
from ferry.shard_tools.packer.packing import pack_documents  # noqa: E402
from tests.media_inputs import POLICY, image, pair_samples, write_tar  # noqa: E402

SEQ = 96
Row = tuple[int, list[int], list[bytes], int]  # position, input ids, media bytes, source


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("media-elastic")
    samples = pair_samples(30)
    for i in range(0, 30, 4):  # documents with two images
        samples[i] = {**samples[i], "0.png": image(20, 30, "PNG", 200 + i)}
    tar = write_tar(root / "in.tar", samples)
    pack([str(tar)], str(root / "media"), PackOptions(tokenizer="bytes", media_policy=POLICY, shard_size=8 << 10,
                                                      frame_size=4096))  # fmt: skip
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 250, int(rng.integers(3, 70))).tolist() for _ in range(40)]
    pack_documents(docs, str(root / "text"), PackOptions(vocab_size=256, eos_id=0, shard_size=1024))
    return {"media": str(root / "media"), "text": str(root / "text")}


def _rows(batch: dict[str, Any]) -> list[Row]:
    spans = batch["media_spans"][:, 0].tolist()
    sources = batch.get("sources", [0] * len(batch["positions"]))
    return [
        (p, batch["input_ids"][r].tolist(), [m.data for m, s in zip(batch["media"], spans, strict=True) if s == r], j)
        for r, (p, j) in enumerate(zip(batch["positions"], sources, strict=True))
    ]


def _run(
    make: Callable[..., MediaSource],
    world: int,
    batch: int,
    workers: list[int],
    state: dict[str, Any] | None = None,
    steps: int | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """``world`` ranks in turn, step by step: the global stream (rank batches in rank order) and the state."""
    loaders = [MediaLoader(make(rank=r, world_size=world), batch, num_workers=workers[r]) for r in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    its = [iter(loader) for loader in loaders]
    rows: list[Row] = []
    while steps is None or steps > 0:
        parts = [next(it, None) for it in its]
        if all(p is None for p in parts):
            break
        assert all(p is not None for p in parts), "ranks read different numbers of batches"
        rows += [row for p in parts if p is not None for row in _rows(p)]
        steps = None if steps is None else steps - 1
    for it in its:
        it.close()  # type: ignore[attr-defined]
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states)  # every rank saves the same state
    return rows, states[0]


def test_resume_from_2_to_3_ranks_with_other_workers_equals_the_uninterrupted_stream(urls: dict[str, str]) -> None:
    def make(**kw: Any) -> MediaDataset:
        return MediaDataset(urls["media"], SEQ, seed=7, epochs=2, max_images=2, **kw)

    whole, _ = _run(make, 1, 6, [0])
    head, state = _run(make, 2, 3, [2, 0], steps=4)
    assert state["position"] == 24
    tail, _ = _run(make, 3, 2, [0, 1, 0], state=state)
    assert [r[0] for r in whole] == list(range(len(whole)))
    assert head + tail == whole
    assert len(whole) > make().sequences(0) + 6  # the resumed run crossed into epoch 1
    assert sum(len(r[2]) for r in whole) > 0
    # another global batch too (3 ranks of 3): the same stream on, to the batch that reaches past the end
    wider, _ = _run(make, 3, 3, [1, 0, 0], state=state)
    longer, _ = _run(lambda **kw: MediaDataset(urls["media"], SEQ, seed=7, epochs=3, max_images=2, **kw), 1, 1, [0])
    assert head + wider == longer[: len(head) + len(wider)] and len(head) + len(wider) >= len(whole)
    with pytest.raises(StateError, match="earlier ferry"):
        make().load_state_dict({"epoch": 0, "index": 4, "fingerprint": []})


def test_a_state_knows_its_epoch_so_a_resume_plans_no_earlier_epoch(urls: dict[str, str]) -> None:
    ds = MediaDataset(urls["media"], SEQ, seed=7, epochs=3)
    first2 = ds.epochs_index.first(2)
    state = ds.state_at(first2 + 1)
    assert state["anchors"] == [[2, first2]]
    fresh = MediaDataset(urls["media"], SEQ, seed=7, epochs=3)
    fresh.load_state_dict(state)
    fresh.warm()
    assert sorted(fresh._plans) == [2]
    assert fresh.sample_at(first2 + 1)["input_ids"].tolist() == ds.sample_at(first2 + 1)["input_ids"].tolist()
    for bad in ([[2, first2 + 1]], [[1, first2]], [[2, -1]], [2, first2], None):
        other = MediaDataset(urls["media"], SEQ, seed=7, epochs=3)
        other.epochs_index.first(3)  # every epoch planned: an anchor that contradicts them is refused
        with pytest.raises(StateError):
            other.load_state_dict({**state, "anchors": bad})
    for position in (-1, 2**62, True, "3"):
        with pytest.raises(StateError):
            fresh.load_state_dict({**state, "position": position})


def test_a_long_reading_plans_its_epochs_as_it_reaches_them(urls: dict[str, str]) -> None:
    ds = MediaDataset(urls["media"], SEQ, seed=7, epochs=10**9)
    it = iter(MediaLoader(ds, 2))
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert sorted(ds._plans) == [0]  # not every epoch to the end's, before the first batch


def _mixture(urls: dict[str, str], **kw: Any) -> MediaMixture:
    text = MediaDataset(urls["text"], SEQ, seed=1)
    media = MediaDataset(urls["media"], SEQ, seed=2, max_images=2)
    return MediaMixture([text, media], [1, 3], **kw)


def test_a_mixture_of_text_and_image_text_has_exact_proportions(urls: dict[str, str]) -> None:
    n = 4 * 21
    rows, _ = _run(lambda **kw: _mixture(urls, sequences=n, **kw), 1, 4, [0])
    sources = [r[3] for r in rows]
    assert len(rows) == n
    for k in range(0, n, 4):  # every period of 4 positions: one text sequence and three image-text ones
        assert sorted(sources[k : k + 4]) == [0, 1, 1, 1]
    alone = [MediaDataset(urls["text"], SEQ, seed=1), MediaDataset(urls["media"], SEQ, seed=2, max_images=2)]
    for j, ds in enumerate(alone):  # each source's sequences are its own stream, in order, none skipped
        mine = [r for r in rows if r[3] == j]
        assert [r[1] for r in mine] == [ds.sample_at(i)["input_ids"].tolist() for i in range(len(mine))]
    assert all(not r[2] for r in rows if r[3] == 0) and sum(len(r[2]) for r in rows if r[3] == 1) > 0
    # the text source runs past its first epoch here, and the mixture reads on into its second
    assert sum(1 for s in sources if s == 0) > alone[0].sequences(0)


def test_a_mixture_resumes_exactly_on_other_ranks_and_workers(urls: dict[str, str]) -> None:
    def make(**kw: Any) -> MediaMixture:
        return _mixture(urls, sequences=48, **kw)

    whole, _ = _run(make, 1, 6, [0])
    head, state = _run(make, 2, 3, [1, 0], steps=3)
    assert len(state["anchors"]) == 2
    tail, _ = _run(make, 3, 2, [0, 0, 2], state=state)
    assert head + tail == whole
    other = MediaMixture([*_mixture(urls).sources], [1, 2], sequences=48)
    with pytest.raises(StateError):
        other.load_state_dict(state)


def test_mixture_arguments_are_checked(urls: dict[str, str]) -> None:
    text = MediaDataset(urls["text"], SEQ)
    with pytest.raises(UsageError):
        MediaMixture([text, MediaDataset(urls["media"], SEQ + 1)], [1, 1])
    with pytest.raises(UsageError):
        MediaMixture([text], [1, 2])
    with pytest.raises(InvalidValueError):
        MediaMixture([text, text], [1, float("nan")])
    with pytest.raises(UsageError):
        MediaMixture([text, "x"], [1, 1])  # type: ignore[list-item]
    phased = MediaMixture([text, text], [(0, [1, 0]), (8, [1, 1])])
    assert [phased.sample_at(p)["source"] for p in range(10)] == [0] * 8 + [0, 1]


def test_trace_names_the_media_items_of_a_step(urls: dict[str, str]) -> None:
    loader = MediaLoader(_mixture(urls, rank=1, world_size=2), 3)
    batch = next(iter(loader))
    media = loader.dataset.sources[1]  # type: ignore[attr-defined]
    frames = media.reader().frames
    read = frames.stats.bytes_read
    records = loader.trace(step=0)
    assert frames.stats.bytes_read == read  # only metadata: no media bytes
    assert [r["position"] for r in records] == batch["positions"] and [r["source"] for r in records] == batch["sources"]
    spans = []
    for row, r in enumerate(records):
        docs = [(d["document"], d["start"], d["doc_tokens"][1] - d["doc_tokens"][0], d["doc_tokens"][0])
                for d in r["documents"]]  # fmt: skip
        assert docs == [tuple(x[1:]) for x in batch["documents"].tolist() if x[0] == row]
        for d in r["documents"]:
            for item in d["media"]:
                assert r["source"] == 1 and item["kind"] == "image" and "shard_bytes" in item
                (got,) = media.reader().items(d["shard"], item["item"], item["item"] + 1)
                assert item["data_bytes"][1] - item["data_bytes"][0] == len(got.data)
                spans.append((row, *item["span"], got.data))
    assert spans and spans == [(*s, m.data) for s, m in zip(batch["media_spans"].tolist(), batch["media"], strict=True)]
    assert loader.trace() == loader.trace(step=1)  # the next batch by default
    assert loader.trace([5])[0]["position"] == 5 and loader.trace(np.arange(5, 6)) == loader.trace([5])
    with pytest.raises(UsageError):
        loader.trace([-1])


def test_a_dataset_trace_of_every_sequence_covers_each_item_once(urls: dict[str, str], tmp_path: Path) -> None:
    ds = MediaDataset(urls["media"], SEQ, seed=3, epochs=1)
    seen = [
        (d["shard"], item["item"])
        for p in range(ds.sequences(0))
        for d in ds.trace_at(p)["documents"]
        for item in d["media"]
    ]
    assert len(seen) == len(set(seen)) == ds.manifest.totals["media_items"]


def test_ferry_trace_media_reads_a_mixture_state(
    urls: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ferry.client.stream.trace import main

    loader = MediaLoader(_mixture(urls, rank=0, world_size=2), 3)
    it = iter(loader)
    next(it)
    next(it)
    it.close()  # type: ignore[attr-defined]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    data = ["--data", urls["text"], "--data", urls["media"]]
    assert main(["--media", "--state", str(state), *data, "--global-batch", "6", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records == loader.trace(list(range(12, 18)))
    rank1 = ["--global-batch", "6", "--rank", "1", "--batch-size", "3"]
    assert main(["--media", "--state", str(state), *data, *rank1]) == 0
    text = capsys.readouterr().out
    assert text.startswith("global sequence 15: source ") and " item " in text
    fresh = ["--media", *data, "--seq-len", str(SEQ), "--seed", "1", "--global-batch", "6", "--step", "2", "--json"]
    assert main(fresh) == 0  # without a state: the flags (here both sources seeded 1, not the state's 1 and 2)
    assert [r["position"] for r in json.loads(capsys.readouterr().out)] == list(range(12, 18))
    assert main(["--media", "--state", str(state), "--data", urls["text"], "--global-batch", "6"]) != 0
    assert "2 dataset(s)" in capsys.readouterr().err
