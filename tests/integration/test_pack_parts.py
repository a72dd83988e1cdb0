"""Fan-out without Ray: ``ferry pack --part I/N`` on each node, then ``--merge`` — identical to a local pack."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import Backend
from parquet_corpus import parquet_corpus, shard_bytes

from ferry.shard_tools import ManifestError, PackOptions, UsageError, open_dataset, pack, verify
from ferry.shard_tools.cli import main
from ferry.shard_tools.packer.packing import merge_parts, pack_part

OPTS = PackOptions(vocab_size=50_257, eos_id=50_256, shard_size=16 * 1024, name="fan")


def corpus(tmp_path: Path, files: int = 5) -> list[str]:
    return parquet_corpus(tmp_path, files=files, docs=120, seed=3)


def test_parts_then_merge_equal_local(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = corpus(tmp_path)
    local = pack(inputs, str(tmp_path / "local"), OPTS)
    out = str(tmp_path / "fan")
    for i in (2, 0):  # parts may run in any order, on any node
        assert main(["pack", *inputs, "--out", out, "--vocab-size", "50257", "--eos-id", "50256",
                     "--shard-size", "16KiB", "--name", "fan", "--part", f"{i}/3", "--json"]) == 0  # fmt: skip
    records = [json.loads(x) for x in capsys.readouterr().out.replace("}\n{", "}\n\x00{").split("\x00")]
    assert {r["part"] for r in records} == {0, 2} and len({r["run_id"] for r in records}) == 1
    assert not (Path(out) / "manifest.json").exists()  # nothing published before --merge
    with pytest.raises(UsageError, match="parts 1 of 3 are missing"):
        merge_parts(out, OPTS)
    pack_part(inputs, out, 1, 3, OPTS)
    merged = merge_parts(out, OPTS)
    assert merged.version_id == local.version_id
    assert shard_bytes(Path(out)) == shard_bytes(tmp_path / "local")
    assert verify(out).ok
    assert [d.tolist() for d in open_dataset(out).documents()] == [
        d.tolist() for d in open_dataset(str(tmp_path / "local")).documents()
    ]


def test_parts_then_merge_on_every_backend(backend: Backend, tmp_path: Path) -> None:
    """Part records and their shards on object storage too: the merge finds them and equals a local pack."""
    inputs = corpus(tmp_path, files=3)
    opts = replace(OPTS, storage_options=backend.storage_options)
    out = backend.url("fan")
    for i in (1, 0):
        pack_part(inputs, out, i, 2, opts)
    merged = merge_parts(out, opts)
    local = pack(inputs, str(tmp_path / "local"), OPTS)
    assert merged.version_id == local.version_id
    assert merged.shards == local.shards > 2
    report = verify(out, storage_options=backend.storage_options)
    assert report.ok and report.checked == local.shards, report.bad or report.error


def test_merge_cli_and_mismatched_parts(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=3)
    out = str(tmp_path / "fan")
    pack_part(inputs, out, 0, 2, OPTS)
    # a part packed with other options belongs to another run: merge sees two runs and asks which
    other = PackOptions(vocab_size=50_257, eos_id=50_256, shard_size=8 * 1024, name="fan")
    pack_part(inputs, out, 1, 2, other)
    with pytest.raises(UsageError, match="exactly one run"):
        merge_parts(out, OPTS)
    pack_part(inputs, out, 1, 2, OPTS)
    # --merge with the same inputs and --parts finds its run by digest
    args = ["pack", *inputs, "--out", out, "--vocab-size", "50257", "--eos-id", "50256", "--shard-size", "16KiB",
            "--name", "fan", "--merge", "--parts", "2"]  # fmt: skip
    assert main(args) == 0
    local = pack(inputs, str(tmp_path / "local"), OPTS)
    assert open_dataset(out).version_id == local.version_id


def test_tampered_part_record_is_refused(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=2)
    out = str(tmp_path / "fan")
    pack_part(inputs, out, 0, 2, OPTS)
    rec = pack_part(inputs, out, 1, 2, OPTS)
    path = Path(out) / rec.record
    doc = json.loads(path.read_text())
    doc["results"][0]["unit"] = 0  # part 1 claims unit 0 as well
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="claimed twice"):
        merge_parts(out, OPTS)
    assert not (Path(out) / "manifest.json").exists()


# `ferry pack` whose part record write is replaced by SIGKILL: a node dying after storing its
# shards and before recording them, the latest point at which a part can be lost.
DIE_BEFORE_RECORD = (
    "import os, signal, sys; import ferry.shard_tools.packer.packing as packing; "
    "from ferry.shard_tools.cli import main; "
    "packing.write_part = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); sys.exit(main())"
)


@pytest.mark.slow
def test_killed_part_publishes_nothing_partial(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=4)
    out = str(tmp_path / "fan")
    args = ["pack", *inputs, "--out", out, "--vocab-size", "50257", "--eos-id", "50256", "--shard-size", "16KiB",
            "--name", "fan"]  # fmt: skip
    ferry = [sys.executable, "-m", "ferry.shard_tools.cli", *args]
    died = subprocess.run([sys.executable, "-c", DIE_BEFORE_RECORD, *args, "--part", "0/2"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert list((Path(out) / "shards").iterdir()), "part 0 stored no shard before it died"
    assert not list(Path(out).glob("parts/*/part-0-of-2.json"))
    subprocess.run([*ferry, "--part", "1/2"], check=True, capture_output=True, timeout=60)
    merge = subprocess.run([*ferry, "--merge", "--parts", "2"], capture_output=True, text=True, timeout=60)
    assert merge.returncode == 2 and "parts 0 of 2 are missing" in merge.stderr, merge.stderr  # a UsageError
    assert not (Path(out) / "manifest.json").exists()
    subprocess.run([*ferry, "--part", "0/2"], check=True, capture_output=True, timeout=60)  # rerun the lost part
    assert subprocess.run([*ferry, "--merge", "--parts", "2"], capture_output=True, timeout=60).returncode == 0
    assert verify(out).ok
    assert open_dataset(out).version_id == pack(inputs, str(tmp_path / "local"), OPTS).version_id


def test_parts_packed_in_another_stored_format_are_not_merged_into_one_run(tmp_path: Path) -> None:
    """A part re-run with --format 1 beside parts in format 2 is another run: the merge names what is missing."""
    inputs = corpus(tmp_path, files=2)
    out = str(tmp_path / "fan")
    pack_part(inputs, out, 0, 2, replace(OPTS, stored_format=2))
    pack_part(inputs, out, 1, 2, replace(OPTS, stored_format=1))
    with pytest.raises(UsageError, match="run"):
        merge_parts(out, OPTS)
